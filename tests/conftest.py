import os
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests import the `tiny` helpers

from installed_engines import missing_engine  # noqa: E402 - after the path is set
from tiny import write_model_pair  # noqa: E402

from specbench.devices import device_name  # noqa: E402

# Tiny models gain nothing from threads, and OpenMP spin-waits make them crawl when another process
# shares the two cores. Tests on the real model raise this where they need it.
torch.set_num_threads(1)

BUDGET = Path(__file__).parent / "budget.toml"
ENGINE_MARKERS = {"llama_cpp", "vllm", "engine"}  # tests that run a real serving engine
SLOWEST_SHOWN = 15
CPU = device_name(torch.device("cpu"))


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    """The tiny target and its near-copy draft (tests/tiny.py), written once for the session."""
    return write_model_pair(tmp_path_factory.mktemp("models"))


def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = missing_engine({mark.name for mark in item.iter_markers()})
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


# --- what the suite costs: the slowest tests, and the real-engine tests against tests/budget.toml ---------------

_seconds: dict[str, float] = defaultdict(float)  # test id -> setup + call + teardown
_engine_tests: set[str] = set()


def pytest_runtest_logreport(report):
    _seconds[report.nodeid] += report.duration
    if report.when == "call" and ENGINE_MARKERS & set(report.keywords) and not report.skipped:
        _engine_tests.add(report.nodeid)


def machine_budget(cpu_model: str, budget: dict) -> dict:
    """The budget of the first [[machine]] whose `match` is in the processor's name; else the last (the slowest)."""
    for machine in budget["machine"]:
        if machine["match"] in cpu_model:
            return machine
    return budget["machine"][-1]


def over_budget(spent: dict[str, float], machine: dict) -> list[str]:
    """One line per budget `spent` passes: which, by how much, and whose budget it was."""
    return [f"{key} {spent[key]:.0f} s > {machine[key]} s ({machine['match']}, {BUDGET.name})"
            for key in ("engine_tests_s", "suite_s") if spent[key] > machine[key]]


def _spent_and_budget() -> tuple[dict[str, float], dict]:
    spent = {"engine_tests_s": sum(_seconds[test] for test in _engine_tests), "suite_s": sum(_seconds.values())}
    return spent, machine_budget(CPU, tomllib.loads(BUDGET.read_text()))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("SPECBENCH_TEST_BUDGET") == "off" or not _seconds:
        return
    session.config._budget_exceeded = over_budget(*_spent_and_budget())
    if session.config._budget_exceeded and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _seconds:
        return
    write = terminalreporter.write_line
    terminalreporter.section(f"slowest {SLOWEST_SHOWN} tests (setup + call + teardown)")
    for test, seconds in sorted(_seconds.items(), key=lambda item: -item[1])[:SLOWEST_SHOWN]:
        write(f"{seconds:8.1f} s  {'[engine] ' if test in _engine_tests else ''}{test}")
    spent, machine = _spent_and_budget()
    write(f"real-engine tests: {len(_engine_tests)}, {spent['engine_tests_s']:.0f} s of {machine['engine_tests_s']} s; "
          f"all tests {spent['suite_s']:.0f} s of {machine['suite_s']} s "
          f"({CPU}: budget '{machine['match']}' in tests/{BUDGET.name})")
    for line in getattr(config, "_budget_exceeded", []):
        terminalreporter.write_line(f"over budget: {line}", red=True)

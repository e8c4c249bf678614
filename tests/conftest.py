import json
import os
import resource
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests import the `tiny` helpers

from installed_engines import missing_engine  # noqa: E402 - after the path is set
from tiny import write_model_pair  # noqa: E402

from specbench.decoding.devices import device_name  # noqa: E402

# Tiny models gain nothing from threads, and OpenMP spin-waits make them crawl when another process
# shares the two cores. Tests on the real model raise this where they need it.
torch.set_num_threads(1)

BUDGET = Path(__file__).parent / "budget.toml"
ENGINE_MARKERS = {"llama_cpp", "vllm", "engine"}  # tests that run a real serving engine
# Real engines and the real model go in order on one worker per xdist group (xdist appends "@GROUP" to their ids):
# the vLLM tests on one, the llama.cpp tests and the end-to-end runs on the embedded model on the other, so the two
# cores each run one engine at a time; checks that no engine is left behind look at their own worker's processes
# (installed_engines.processes_running). The first marker in this order decides a test's group.
GROUPS = {"vllm": "vllm", "engine": "vllm", "llama_cpp": "llama", "slow": "llama"}
SLOWEST_SHOWN = 15
CPU = device_name(torch.device("cpu"))


def _cpu_flags() -> frozenset[str]:
    """The processor's feature flags (Linux's /proc/cpuinfo; none elsewhere): "AMD EPYC" names several kinds."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


CPU_FLAGS = _cpu_flags()


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    """The tiny target and its near-copy draft (tests/tiny.py), written once for the session."""
    return write_model_pair(tmp_path_factory.mktemp("models"))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks into the test ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        markers = {mark.name for mark in item.iter_markers()}
        reason = missing_engine(markers)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
        group = next((GROUPS[marker] for marker in GROUPS if marker in markers), None)
        if group is not None and "alone" not in markers:
            # on `pytest -n 2 --dist loadgroup` one worker runs a group's tests in order, one engine at a time, while
            # the other runs the other group's and the one-thread tests
            item.add_marker(pytest.mark.xdist_group(group))


# --- what the suite costs: the slowest tests, and the real-engine tests against tests/budget.toml ---------------
# `make test` runs the suite in two invocations (independent one-thread tests on two workers, then the real-engine
# and real-model tests alone); each appends its tests' seconds to the ledger file $SPECBENCH_TEST_LEDGER names, and
# the budget is checked on everything the ledger holds, so the last invocation judges the whole suite.

LEDGER_ENV = "SPECBENCH_TEST_LEDGER"
_seconds: dict[str, float] = defaultdict(float)  # test id -> setup + call + teardown
_cpu: dict[str, float] = defaultdict(float)  # test id -> CPU seconds of its worker and of what it started and reaped
_engine_tests: set[str] = set()
_CPU_AT = pytest.StashKey[float]()
# A test that waits (a sleep, a time-out, an engine or a hub that does not answer) leaves its core idle while the
# other worker runs one thread: the tests whose wall time exceeds their CPU time by the most are listed.
WAITING_SHOWN, WAITING_LEAST_S = 5, 5.0


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")  # an xdist worker: its controller counts its tests


def _cpu_s() -> float:
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_AT] = _cpu_s()  # before its fixtures are set up


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "teardown" and _CPU_AT in item.stash:  # carried to xdist's controller with the report
        report.user_properties.append(("cpu_s", _cpu_s() - item.stash[_CPU_AT]))
    return report


def pytest_runtest_logreport(report):
    test = _ungrouped(report.nodeid)  # one name for a test, grouped or not
    _seconds[test] += report.duration
    _cpu[test] += sum(value for name, value in report.user_properties if name == "cpu_s")
    if report.when == "call" and ENGINE_MARKERS & set(report.keywords) and not report.skipped:
        _engine_tests.add(test)


def waiting(seconds: dict[str, float], cpu: dict[str, float], *, shown: int = WAITING_SHOWN,
            least_s: float = WAITING_LEAST_S) -> list[tuple[str, float]]:
    """The tests whose wall time exceeds their CPU time by at least `least_s`, by how much, the most first."""
    waits = sorted(((test, spent_s - cpu[test]) for test, spent_s in seconds.items() if test in cpu),
                   key=lambda item: -item[1])
    return [(test, wait_s) for test, wait_s in waits if wait_s >= least_s][:shown]


def _ungrouped(nodeid: str) -> str:
    test, _, group = nodeid.rpartition("@")
    return test if test and group in GROUPS.values() else nodeid


def machine_budget(cpu_model: str, budget: dict, cpu_flags: frozenset[str] = frozenset()) -> dict:
    """The budget of the first [[machine]] whose `match` is in the processor's name and whose `flags` (if any) the
    processor has; else the last (the slowest)."""
    for machine in budget["machine"]:
        if machine["match"] in cpu_model and set(machine.get("flags", ())) <= cpu_flags:
            return machine
    return budget["machine"][-1]


def chosen_machine(setting: str | None, budget: dict, cpu_model: str, cpu_flags: frozenset[str] = frozenset()) -> dict:
    """The [[machine]] whose budget applies: the one SPECBENCH_TEST_BUDGET names (a slower kind emulated on this
    machine by benches/slower.sh, say), else the processor's own."""
    if not setting:
        return machine_budget(cpu_model, budget, cpu_flags)
    named = [machine for machine in budget["machine"] if machine["name"] == setting]
    if not named:
        names = ", ".join(machine["name"] for machine in budget["machine"])
        raise pytest.UsageError(f"SPECBENCH_TEST_BUDGET={setting}: no [[machine]] of that name in tests/{BUDGET.name} "
                                f"(names: {names}; off skips the check)")
    return named[0]


def machine_label(machine: dict) -> str:
    return " ".join([machine["match"], *(f"+{flag}" for flag in machine.get("flags", ()))])


def over_budget(spent: dict[str, float], machine: dict) -> list[str]:
    """One line per budget `spent` passes: which, by how much, and whose budget it was."""
    return [f"{key} {spent[key]:.0f} s > {machine[key]} s ({machine_label(machine)}, {BUDGET.name})"
            for key in ("engine_tests_s", "suite_s") if spent[key] > machine[key]]


def ledger_totals(seconds: dict[str, float], engine_tests: set[str], ledger: Path | None,
                  cpu: dict[str, float] | None = None) -> tuple[dict, set]:
    """This invocation's tests, appended to `ledger` (JSON lines, with each test's CPU seconds where `cpu` has them)
    when there is one, and everything it holds."""
    if ledger is None:
        return dict(seconds), set(engine_tests)
    with ledger.open("a") as out:
        for test, spent in seconds.items():
            row = {"test": test, "seconds": spent, "engine": test in engine_tests}
            if cpu is not None and test in cpu:
                row["cpu_seconds"] = round(cpu[test], 3)
            out.write(json.dumps(row) + "\n")
    rows = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
    return {row["test"]: row["seconds"] for row in rows}, {row["test"] for row in rows if row["engine"]}


def spent(seconds: dict[str, float], engine_tests: set[str]) -> dict[str, float]:
    return {"engine_tests_s": sum(seconds[test] for test in engine_tests), "suite_s": sum(seconds.values())}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if _is_worker(config) or not _seconds:
        return
    ledger = os.environ.get(LEDGER_ENV)
    config._suite = ledger_totals(_seconds, _engine_tests, Path(ledger) if ledger else None, _cpu)
    if os.environ.get("SPECBENCH_TEST_BUDGET") == "off":
        return
    config._budget_exceeded = over_budget(spent(*config._suite), _machine())
    if config._budget_exceeded and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _named() -> str | None:
    """The [[machine]] SPECBENCH_TEST_BUDGET names, if it names one ("off" skips the check, not the summary)."""
    setting = os.environ.get("SPECBENCH_TEST_BUDGET")
    return None if setting in (None, "", "off") else setting


def _machine() -> dict:
    return chosen_machine(_named(), tomllib.loads(BUDGET.read_text()), CPU, CPU_FLAGS)


def pytest_configure(config):
    if not _is_worker(config):
        _machine()  # a budget named that does not exist: said before any test runs


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _is_worker(config) or not hasattr(config, "_suite"):
        return
    seconds, engine_tests = config._suite
    write = terminalreporter.write_line
    scope = "of the suite so far" if os.environ.get(LEDGER_ENV) else ""
    terminalreporter.section(f"slowest {SLOWEST_SHOWN} tests {scope} (setup + call + teardown)".replace("  ", " "))
    for test, spent_s in sorted(seconds.items(), key=lambda item: -item[1])[:SLOWEST_SHOWN]:
        write(f"{spent_s:8.1f} s  {'[engine] ' if test in engine_tests else ''}{test}")
    total, machine = spent(seconds, engine_tests), _machine()
    write(f"real-engine tests: {len(engine_tests)}, {total['engine_tests_s']:.0f} s of {machine['engine_tests_s']} s; "
          f"all {len(seconds)} tests {total['suite_s']:.0f} s of {machine['suite_s']} s "
          f"({CPU}: budget '{machine_label(machine)}' in tests/{BUDGET.name}"
          f"{', named by SPECBENCH_TEST_BUDGET' if _named() else ''})")
    waits = waiting(_seconds, _cpu)
    if waits:
        terminalreporter.section("waiting most: wall time less CPU time of this run's tests (sleeps, time-outs, what "
                                 "does not answer)")
        for test, wait_s in waits:
            write(f"{wait_s:8.1f} s  {test}")
    for line in getattr(config, "_budget_exceeded", []):
        terminalreporter.write_line(f"over budget: {line}", red=True)

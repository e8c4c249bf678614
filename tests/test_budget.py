"""The suite's own cost guard (conftest.py, tests/budget.toml): which machine's budget applies, and what passes it."""

import json
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from conftest import BUDGET, GROUPS, chosen_machine, ledger_totals, machine_budget, over_budget, spent, waiting
from installed_engines import WORKER, processes_running

BUDGETS = tomllib.loads(BUDGET.read_text())


def test_the_processor_picks_its_budget_and_an_unknown_one_gets_the_slowest():
    assert machine_budget("Intel(R) Xeon(R) Processor", BUDGETS)["match"] == "Intel"
    assert machine_budget("AMD EPYC 7B13", BUDGETS)["match"] == "AMD EPYC"
    assert machine_budget("Apple M3", BUDGETS) == BUDGETS["machine"][-1]


def test_one_processor_name_for_two_kinds_is_told_apart_by_its_flags():
    """"AMD EPYC" names the Zen 4 machines (AVX-512, about twice as fast here) and the older AVX2 ones, the slowest."""
    zen4 = machine_budget("AMD EPYC", BUDGETS, frozenset({"avx2", "avx512f", "avx512_bf16"}))
    older = machine_budget("AMD EPYC", BUDGETS, frozenset({"avx2", "fma"}))
    assert zen4["flags"] and set(zen4["flags"]) <= {"avx512f", "avx512_bf16"} and "flags" not in older
    assert zen4["suite_s"] < older["suite_s"] and zen4["engine_tests_s"] < older["engine_tests_s"]
    assert older == BUDGETS["machine"][-1]  # the slowest kind seen is the default
    assert over_budget({"engine_tests_s": 1.0, "suite_s": 1e9}, zen4)[0].endswith(
        f"({zen4['match']} +{' +'.join(zen4['flags'])}, budget.toml)")


def test_a_budget_named_applies_instead_of_the_processors_and_an_unknown_name_is_refused():
    """SPECBENCH_TEST_BUDGET=NAME: the suite held to another kind's budget, the one it runs as (benches/slower.sh
    emulates the AVX2 EPYC on a Zen 4 one, whose own budget is about half)."""
    names = [machine["name"] for machine in BUDGETS["machine"]]
    assert len(set(names)) == len(names) and "epyc-avx2" in names
    zen4 = frozenset({"avx512f"})
    assert chosen_machine(None, BUDGETS, "AMD EPYC", zen4) == machine_budget("AMD EPYC", BUDGETS, zen4)
    assert chosen_machine("epyc-avx2", BUDGETS, "AMD EPYC", zen4) == BUDGETS["machine"][-1] != machine_budget(
        "AMD EPYC", BUDGETS, zen4)
    with pytest.raises(pytest.UsageError, match=re.escape(
            f"SPECBENCH_TEST_BUDGET=avx2: no [[machine]] of that name in tests/budget.toml (names: {', '.join(names)}; "
            "off skips the check)")):
        chosen_machine("avx2", BUDGETS, "AMD EPYC", zen4)


def test_an_unknown_budget_name_stops_pytest_before_any_test(tmp_path):
    (tmp_path / "conftest.py").write_text(  # the suite's own hook, loaded under another module name
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('suite_conftest', {str(Path(__file__).parent / 'conftest.py')!r})\n"
        "suite = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(suite)\n"
        "pytest_configure = suite.pytest_configure\n")
    (tmp_path / "test_one.py").write_text("def test_one():\n    open('ran', 'w')\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "test_one.py"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "SPECBENCH_TEST_BUDGET": "avx2"})
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "SPECBENCH_TEST_BUDGET=avx2: no [[machine]] of that name in tests/budget.toml" in result.stderr
    assert not (tmp_path / "ran").exists()


def test_only_a_budget_passed_is_reported():
    machine = {"match": "Intel", "engine_tests_s": 100, "suite_s": 300}
    assert over_budget({"engine_tests_s": 100.0, "suite_s": 299.0}, machine) == []
    assert over_budget({"engine_tests_s": 101.0, "suite_s": 299.0}, machine) == [
        "engine_tests_s 101 s > 100 s (Intel, budget.toml)"]


def test_the_ledger_adds_up_the_invocations_of_one_suite(tmp_path):
    ledger = tmp_path / "ledger"
    first = ledger_totals({"a": 10.0, "b": 5.0}, set(), ledger)
    assert first == ({"a": 10.0, "b": 5.0}, set())
    seconds, engine_tests = ledger_totals({"c": 100.0}, {"c"}, ledger)
    assert seconds == {"a": 10.0, "b": 5.0, "c": 100.0} and engine_tests == {"c"}
    assert spent(seconds, engine_tests) == {"engine_tests_s": 100.0, "suite_s": 115.0}
    assert ledger_totals({"a": 1.0}, set(), None) == ({"a": 1.0}, set())  # no ledger: this invocation alone
    ledger_totals({"d": 9.0, "e": 1.0}, set(), ledger, {"d": 2.5})
    rows = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert rows[-2:] == [{"test": "d", "seconds": 9.0, "engine": False, "cpu_seconds": 2.5},
                         {"test": "e", "seconds": 1.0, "engine": False}]  # CPU time where it was measured


def test_the_tests_that_wait_most_are_those_whose_wall_time_exceeds_their_cpu_time_most():
    seconds = {"sleeps": 40.0, "computes": 60.0, "times_out": 25.0, "briefly": 6.0, "unmeasured": 90.0}
    cpu = {"sleeps": 2.0, "computes": 59.0, "times_out": 1.0, "briefly": 2.0}
    assert waiting(seconds, cpu) == [("sleeps", 38.0), ("times_out", 24.0)]  # 4 s and 1 s are not shown
    assert waiting(seconds, cpu, least_s=1.0, shown=3) == [("sleeps", 38.0), ("times_out", 24.0), ("briefly", 4.0)]


MARKS = ["vllm", "slow", "engine", "llama_cpp", "vllm", "slow", "llama_cpp", "engine"]


def test_each_engines_tests_go_to_one_worker_in_order_and_the_two_engines_to_two_workers(tmp_path):
    # `make test` relies on it: with `-n 2 --dist loadgroup` the vLLM tests (and the `engine` ones) land on one worker,
    # the llama.cpp tests and the real-model ones on the other, each group in order, so no two engines of a kind run at
    # once and each core runs one (pytest 9.2 dropped the node-id field xdist 3.8 writes the group to)
    (tmp_path / "conftest.py").write_text(  # the suite's own hook, loaded under another module name
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('suite_conftest', {str(Path(__file__).parent / 'conftest.py')!r})\n"
        "suite = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(suite)\n"
        "pytest_collection_modifyitems = suite.pytest_collection_modifyitems\n"
        "pytest_runtest_setup, pytest_runtest_makereport = suite.pytest_runtest_setup, suite.pytest_runtest_makereport\n"
        "pytest_runtest_logreport, pytest_sessionfinish = suite.pytest_runtest_logreport, suite.pytest_sessionfinish\n")
    (tmp_path / "test_group.py").write_text("import os, time, pytest\n" + "".join(
        f"@pytest.mark.{mark}\ndef test_{i}():\n    pass\n" for i, mark in enumerate(MARKS)) +
        "def test_8():\n    pass\n"
        # and each test's CPU time, carried from its worker: one waits, one computes
        "def test_sleeps():\n    time.sleep(0.6)\n"
        "def test_spins():\n    end = time.process_time() + 0.6\n    while time.process_time() < end: pass\n")
    # any executable stands for the engines, so that their markers do not skip the tests here
    engines = {"SPECBENCH_LLAMA_SERVER": sys.executable, "SPECBENCH_VLLM_PYTHON": sys.executable}
    ledger = tmp_path / "ledger.jsonl"
    result = subprocess.run([sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup", "-p",
                             "no:cacheprovider", "-o", "addopts=", "-W", "ignore::pytest.PytestUnknownMarkWarning",
                             "test_group.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "SPECBENCH_TEST_BUDGET": "off", "SPECBENCH_TEST_LEDGER": str(ledger),
                                 **engines})
    assert result.returncode == 0, result.stdout[-2000:]
    rows = {row["test"].split("::")[1]: row for row in map(json.loads, ledger.read_text().splitlines())}
    assert rows["test_sleeps"]["seconds"] >= 0.6 and rows["test_sleeps"]["cpu_seconds"] < 0.3, rows["test_sleeps"]
    assert rows["test_spins"]["cpu_seconds"] >= 0.6, rows["test_spins"]
    ran = re.findall(r"\[(gw\d)\].*PASSED test_group.py::test_(\d)(?:@(\w+))?", result.stdout)
    assert sorted(int(test) for _, test, _ in ran) == list(range(9)), result.stdout[-2000:]
    assert {int(test): group for _, test, group in ran} == {**dict(enumerate(GROUPS[m] for m in MARKS)), 8: ""}
    workers = {group: {worker for worker, _, g in ran if g == group} for group in ("vllm", "llama")}
    assert all(len(found) == 1 for found in workers.values()) and workers["vllm"] != workers["llama"], ran
    for group in workers:  # in order
        order = [int(test) for _, test, g in ran if g == group]
        assert order == sorted(order), ran


def test_a_left_behind_check_sees_its_own_workers_processes_only():
    """`make test` runs vLLM and llama.cpp tests on two workers at once: a process the other worker started (another
    PYTEST_XDIST_WORKER in its environment) is not this worker's leftover; one this worker started is."""
    mine, other = (subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                    env={**os.environ, WORKER: worker})
                   for worker in (os.environ.get(WORKER, ""), "gw-other"))
    try:
        time.sleep(0.5)  # both exec'd: their environment is readable
        running = processes_running(Path(sys.executable).name.encode())
        assert mine.pid in running and other.pid not in running
    finally:
        for process in (mine, other):
            process.kill()
            process.wait()


def test_two_machines_ledgers_compare_file_by_file_and_test_by_test(tmp_path, capsys):
    """What make test writes (ledger_totals), set against another machine's: the totals, then the files and tests
    that added the most seconds first, each with its ratio; a test on one side only is new or gone."""
    from compare_seconds import main

    fast, slow = tmp_path / "fast.jsonl", tmp_path / "slow.jsonl"
    ledger_totals({"tests/test_a.py::one": 10.0, "tests/test_a.py::two": 5.0, "tests/test_b.py::vllm": 100.0,
                   "tests/test_c.py::gone": 1.0}, {"tests/test_b.py::vllm"}, fast)
    ledger_totals({"tests/test_a.py::one": 40.0, "tests/test_a.py::two": 5.0, "tests/test_b.py::vllm": 200.0,
                   "tests/test_d.py::new": 2.0}, {"tests/test_b.py::vllm"}, slow)
    assert main([str(fast), str(slow), "--top", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["all", "tests", "116", "s", "->", "247", "s", "2.13x"]
    assert lines[2].split() == ["real-engine", "tests", "100", "s", "->", "200", "s", "2.00x"]
    assert lines[3] == "the 3 files that added the most seconds:"
    assert [line.split()[-2:] for line in lines[4:7]] == [
        ["2.00x", "tests/test_b.py"], ["3.00x", "tests/test_a.py"], ["new", "tests/test_d.py"]]
    assert lines[7] == "the 3 tests that added the most seconds:"
    assert [line.split()[-2:] for line in lines[8:11]] == [
        ["2.00x", "tests/test_b.py::vllm"], ["4.00x", "tests/test_a.py::one"], ["new", "tests/test_d.py::new"]]
    assert lines[8].split()[:4] == ["+100.0", "s", "100.0", "->"]
    assert main([str(fast), str(slow), "--top", "5"]) == 0
    assert "gone  tests/test_c.py::gone" in capsys.readouterr().out
    # one test whether or not xdist's group is appended to its id (a parameter's "@" stays)
    grouped = tmp_path / "grouped.jsonl"
    ledger_totals({"tests/test_a.py::one[x@y]@static": 20.0, "tests/test_a.py::two@tune-efficiency": 5.0}, set(),
                  grouped)
    plain = tmp_path / "plain.jsonl"
    ledger_totals({"tests/test_a.py::one[x@y]": 10.0, "tests/test_a.py::two": 5.0}, set(), plain)
    assert main([str(plain), str(grouped), "--top", "2"]) == 0
    tests = capsys.readouterr().out.split("tests that added the most seconds:")[1].splitlines()[1:]
    assert [line.split()[-2:] for line in tests] == [["2.00x", "tests/test_a.py::one[x@y]"],
                                                     ["1.00x", "tests/test_a.py::two"]]


def test_a_ledger_missing_or_not_a_ledger_or_a_top_below_1_is_one_line_and_exit_2(tmp_path, capsys):
    from compare_seconds import main

    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    ledger_totals({"tests/test_a.py::one": 1.0}, set(), good)
    bad.write_text('{"test": "tests/test_a.py::one", "seconds": 1.0}\n{"name": "x"}\n')
    assert main([str(good), str(tmp_path / "none.jsonl")]) == 2
    assert main([str(good), str(bad)]) == 2
    assert main([str(good), str(good), "--top", "0"]) == 2
    captured = capsys.readouterr()
    errors = captured.err.splitlines()
    assert len(errors) == 3 and errors[0].startswith(f"{tmp_path / 'none.jsonl'}: no such ledger")
    assert errors[1].startswith(f"{bad}:2: not a ledger line")
    assert errors[2].startswith("--top 0: list at least 1") and captured.out == ""

"""The suite's own cost guard (conftest.py, tests/budget.toml): which machine's budget applies, and what passes it."""

import tomllib

from conftest import BUDGET, ledger_totals, machine_budget, over_budget, spent

BUDGETS = tomllib.loads(BUDGET.read_text())


def test_the_processor_picks_its_budget_and_an_unknown_one_gets_the_slowest():
    assert machine_budget("Intel(R) Xeon(R) Processor", BUDGETS)["match"] == "Intel"
    assert machine_budget("AMD EPYC 7B13", BUDGETS)["match"] == "AMD EPYC"
    assert machine_budget("Apple M3", BUDGETS) == BUDGETS["machine"][-1]


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

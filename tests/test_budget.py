"""The suite's own cost guard (conftest.py, tests/budget.toml): which machine's budget applies, and what passes it."""

import tomllib

from conftest import BUDGET, machine_budget, over_budget

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

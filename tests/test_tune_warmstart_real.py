"""The warm start's ranking on a real recorded grid (tests/fixtures/native-grid: `specbench run` of the embedded
SmolLM2 on this 2-core machine, n-gram and an int8 self-draft, gamma 1-8, greedy, 4 prompts x 48 tokens; 16
configurations): after the two calibration points, its first two picks reach a configuration within 3 % of the
grid's best, for every seed — 4 evaluations of 16."""

from __future__ import annotations

from pathlib import Path

import pytest

from specbench.tune import TuneSettings, parse_objective, tune
from test_tune_efficiency import grid_objectives
import test_tune_efficiency

GRID = Path(__file__).parent / "fixtures" / "native-grid"


@pytest.fixture(scope="module")
def objectives() -> dict:
    original = test_tune_efficiency.GRID
    test_tune_efficiency.GRID = GRID
    try:
        return {point: value for (_, point), value in grid_objectives("tokens_per_s").items()}
    finally:
        test_tune_efficiency.GRID = original


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_within_3_percent_of_the_real_grids_best_in_4_evaluations(tmp_path, objectives, seed):
    assert len(objectives) == 16
    best = max(objectives.values())
    result = tune(None, out_dir=tmp_path, replay=GRID,
                  settings=TuneSettings(objective=parse_objective("tokens_per_s"), trials=4, seed=seed))
    trials = result.trials
    assert len(trials) == 4 and trials["point_id"].is_unique
    reached = max(objectives[point] for point in trials["point_id"])
    assert reached >= 0.97 * best, (list(trials["point_id"]), reached, best)

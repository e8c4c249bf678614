"""`specbench tune` on a recorded grid (the replay backend): it reaches a configuration within 3 % of the
grid's best objective with at most 30 % of the grid's evaluations, for each of five seeds. `make test` runs two of them
(on one worker, which measures the grid once); the other three are a repeated search, marked `bench`: `make
bench-tests` runs them."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from specbench.tune.plan import TuneSettings
from specbench.tune.objectives import parse_objective
from specbench.tune.runner import tune
from specbench.tune.evaluate import Replay
from specbench.tune.measure import measure
from specbench.sweep.plan import temperature_groups
from specbench.tune.space import space_from_profile

GRID = Path(__file__).parent / "fixtures" / "synthetic-grid"
SEEDS = (0, 1, *(pytest.param(seed, marks=pytest.mark.bench) for seed in (2, 3, 4)))
pytestmark = pytest.mark.xdist_group("tune-efficiency")
WITHIN = 0.03
SHARE = 0.30


def grid_objectives(objective_name: str) -> dict[tuple[float, str], float]:
    """Every recorded point's objective, measured exactly as a tune trial measures it."""
    replay = Replay(GRID)
    objective = parse_objective(objective_name)
    space = space_from_profile(replay.profile, tune_ngram=False)
    values = {}
    for temperature, top_p in temperature_groups(replay.profile):
        baseline, baseline_rows = replay.baseline(temperature, top_p)
        for config in space.configs():
            spec = space.point(config, temperature=temperature, top_p=top_p)
            rows = replay.run(spec, lambda rows: None).rows
            values[(temperature, spec.point_id)] = measure(spec, rows, baseline=baseline, baseline_rows=baseline_rows,
                                                           objective=objective, context=replay.context(spec)).values[0]
    return values


def evaluations_to_within(trials: pd.DataFrame, objectives: dict, *, temperature: float, maximize: bool) -> float:
    """Distinct points evaluated until (and including) the first completed trial within WITHIN of the best."""
    grid = {point: value for (t, point), value in objectives.items() if t == temperature}
    best = max(grid.values()) if maximize else min(grid.values())
    seen: list[str] = []
    for row in trials[trials["temperature"] == temperature].sort_values("number").to_dict("records"):
        if row["evaluated"] is True and row["point_id"] not in seen:
            seen.append(row["point_id"])
        if row["state"] == "COMPLETE":
            value = grid[row["point_id"]]
            if (value >= (1 - WITHIN) * best) if maximize else (value <= (1 + WITHIN) * best):
                return len(seen)
    return math.inf


@pytest.fixture(scope="module")
def objectives() -> dict:
    return grid_objectives("tokens_per_s")


@pytest.mark.parametrize("seed", SEEDS)
def test_tune_reaches_the_grid_best_within_3_percent_with_30_percent_of_the_evaluations(tmp_path, objectives, seed):
    grid_size = sum(1 for t, _ in objectives if t == 0.0)
    assert grid_size >= 30
    budget = math.floor(SHARE * grid_size)
    result = tune(None, out_dir=tmp_path, replay=GRID,
                  settings=TuneSettings(objective=parse_objective("tokens_per_s"), trials=budget, seed=seed))
    for choice in result.recommendation.temperatures:
        needed = evaluations_to_within(result.trials, objectives, temperature=choice["temperature"], maximize=True)
        print(f"seed {seed} temperature {choice['temperature']:g}: within 3 % after {needed} of {grid_size} evaluations")
        assert needed <= budget
        assert choice["evaluations"] <= budget

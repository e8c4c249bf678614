"""What a tune's trials run (specbench/tune/propose.py): in a small discrete space TPE keeps proposing points
already evaluated; each becomes the untried configuration nearest to it, never a trial of its own. So a study
holds one trial per evaluation, its trials numbered without gaps, and a tune asked for more trials than the
space has stops once every configuration is evaluated, and says so."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.profile import dump_profile, profile_from_dict
from specbench.tune.plan import TuneSettings
from specbench.tune.objectives import parse_objective
from specbench.tune.runner import tune

GRID = Path(__file__).parent / "fixtures" / "synthetic-grid"


def small_grid(folder: Path, *, gammas, drafts, temperatures=(0.0,), server: dict | None = None) -> Path:
    """A recording of the synthetic grid narrowed to `drafts` x `gammas` x `temperatures` (its profile is
    narrowed; the rows it does not name are never asked for). `server`: record it as a server-backend run."""
    folder.mkdir(parents=True)
    for name in ("points.parquet", "requests.parquet"):
        shutil.copy(GRID / name, folder / name)
    manifest = json.loads((GRID / "manifest.json").read_text())
    data = tomllib.loads(manifest["profile_toml"])
    data["drafts"] = [d for d in data["drafts"] if d["name"] in drafts]
    data["sweep"].update(gamma=list(gammas), temperature=list(temperatures))
    if server is not None:
        data.update(backend="server", server=server)
        for draft in data["drafts"]:
            draft.pop("quantize", None)
    manifest["profile_toml"] = dump_profile(profile_from_dict(data))
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_a_replay_tune_of_a_small_grid_runs_every_configuration_once_then_stops_and_says_so(tmp_path):
    """Before: --trials 16 on this 16-point grid wrote 137 trials, 121 of them FAIL "duplicate"."""
    grid = small_grid(tmp_path / "grid", gammas=range(1, 9), drafts=("small", "ngram"))
    result = CliRunner().invoke(app, ["tune", "--replay", str(grid), "--trials", "40", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    trials = pd.read_parquet(tmp_path / "out" / "trials.parquet")
    assert len(trials) == 16 and list(trials["number"]) == list(range(16))
    assert (trials["state"] != "FAIL").all() and trials["point_id"].is_unique
    assert set(trials["role"]) == {"calibration", "warm_start", "search"}
    replaced = trials[trials["sampled_point_id"].notna()]  # TPE proposed a point already held: the nearest ran
    assert len(replaced) and not (replaced["sampled_point_id"] == replaced["point_id"]).any()
    assert set(replaced["sampled_point_id"]) <= set(trials["point_id"])
    (choice,) = json.loads((tmp_path / "out" / "recommendation.json").read_text())["temperatures"]
    assert choice["evaluations"] == choice["trials"] == 16 and choice["space_exhausted"]
    output = " ".join(result.output.split())
    assert ("synthetic-grid-tokens_per_s-t0-p1: every one of the 16 configurations of the search space has been "
            "evaluated; nothing is left to try") in output
    assert "16 evaluations, 16 trials of 16 configurations (every configuration evaluated)" in output
    # it reaches the best: the grid's best point is a completed trial, and the choice is it or a near-tie
    done = trials[trials["state"] == "COMPLETE"]
    best = done.loc[done["value"].idxmax()]
    chosen = done.set_index("point_id").loc[choice["point_id"]]
    assert chosen["value"] >= best["value"] - max(best["noise"], 0.01 * best["value"])


@pytest.mark.parametrize("seed", [0, 1])
def test_fewer_trials_than_configurations_are_that_many_trials_numbered_without_gaps(tmp_path, seed):
    grid = small_grid(tmp_path / "grid", gammas=range(1, 7), drafts=("small", "ngram"))  # 12, as the llama.cpp tune
    result = tune(None, out_dir=tmp_path / "out", replay=grid,
                  settings=TuneSettings(objective=parse_objective("tokens_per_s"), trials=6, seed=seed))
    trials = result.trials
    assert list(trials["number"]) == list(range(6)) and (trials["state"] != "FAIL").all()
    assert trials["point_id"].is_unique
    (choice,) = result.recommendation.temperatures
    assert choice["evaluations"] == choice["trials"] == 6 and not choice["space_exhausted"]

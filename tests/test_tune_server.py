"""`specbench tune` on the server backend: a server's forward pass cannot be timed and its rows hold no steps,
so there is no analytic warm start, and the tune says so in one line and records it; the search space leaves
out what the engine's flag mapping refuses. End to end against a real llama.cpp llama-server on the embedded
SmolLM2 GGUF where one is installed (make engines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import optuna
import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.tune.space import Config, DraftChoice, SearchSpace
from specbench.tune.warmstart import unavailable_with
from installed_engines import LLAMA_SERVER, needs_llama_server
from test_server import PROFILE as SERVER_PROFILE
from test_tune_propose import small_grid

# the server tests' llama-server profile, tuned over two gammas at one temperature and load, on 2 short prompts
PROFILE = (SERVER_PROFILE.replace('name = "llama-tiny"', 'name = "llama-tune"').replace("gamma = [3]", "gamma = [3, 4]")
           .replace("temperature = [0.0, 0.8]", "temperature = [0.0]").replace("concurrency = [1, 4]\n", "")
           .replace("max_prompts = 4", "max_prompts = 2"))
MESSAGE = ("warm start: not available with the server backend (a server's forward pass cannot be timed from "
           "outside); the search starts from TPE after the calibration points")


def test_the_warm_start_is_unavailable_where_the_backend_does_not_measure_steps():
    assert unavailable_with("server") == ("not available with the server backend (a server's forward pass cannot "
                                          "be timed from outside)")
    assert unavailable_with("hf").startswith("not available with the hf backend")
    assert unavailable_with("native") is None  # timed, or interpolated between recorded verify times (a replay)


def test_a_tune_of_a_server_recording_starts_from_tpe_and_records_why(tmp_path):
    """A replay of a server-backend run: its rows would give a prediction here (the synthetic grid's are
    native), but a server's never do, so the tune must not pretend."""
    grid = small_grid(tmp_path / "grid", gammas=range(3, 9), drafts=("small", "ngram"),
                      server={"engine": "vllm"})
    result = CliRunner().invoke(app, ["tune", "--replay", str(grid), "--trials", "5", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert MESSAGE in " ".join(result.output.split())
    trials = pd.read_parquet(tmp_path / "out" / "trials.parquet")
    assert list(trials["role"]) == ["calibration", "calibration", "search", "search", "search"]
    assert trials["warm_start_prediction"].isna().all()
    study = optuna.load_study(study_name="synthetic-grid-tokens_per_s-t0-p1",
                              storage=f"sqlite:///{tmp_path / 'out' / 'study.db'}")
    assert study.user_attrs["warm_start"] == {"unavailable": unavailable_with("server"), "predictions": [],
                                              "queued": []}
    assert not any("calibration" in t.user_attrs for t in study.trials)
    recommendation = json.loads((tmp_path / "out" / "recommendation.json").read_text())
    assert recommendation["warm_start"] == {"configurations": 3, "available": False,
                                            "reason": unavailable_with("server")}


def test_a_llama_cpp_space_leaves_out_ngrams_longer_than_gamma():
    """llama.cpp's ngram-simple drafts nothing when gamma is below the n-gram size: the engine mapping refuses
    it, so the space never proposes it, and the calibration is the largest gamma and n-gram it runs."""
    ngram = DraftChoice(name="ngram", method="ngram", model=None, quantize=None, ngram_min=1, ngram_max_low=1,
                        ngram_max_high=4)
    space = SearchSpace((ngram,), gamma_low=1, gamma_high=3, engine="llama.cpp")
    assert len(space.grid()) == 12
    assert [(c.gamma, c.ngram_max) for c in space.configs()] == [(1, 1), (2, 1), (3, 1), (2, 2), (3, 2), (3, 3)]
    assert space.calibration_configs() == [Config("ngram", 3, 3)]
    assert "is below the n-gram size ngram_max (4)" in space.refusal(Config("ngram", 3, 4))
    assert len(SearchSpace((ngram,), gamma_low=1, gamma_high=3, engine="vllm").configs()) == 12


@needs_llama_server
def test_tune_on_a_llama_cpp_server(tmp_path):
    (tmp_path / "llama.toml").write_text(PROFILE)
    result = subprocess.run([sys.executable, "-m", "specbench.cli", "tune", "llama.toml", "--trials", "3",
                             "--out", "out"], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert MESSAGE in " ".join((result.stdout + result.stderr).split())
    out = tmp_path / "out"
    trials = pd.read_parquet(out / "trials.parquet")
    assert len(trials) == 3 and set(trials["state"]) <= {"COMPLETE", "PRUNED"} and trials["point_id"].is_unique
    assert (trials["gamma"] >= trials["ngram_max"].fillna(0)).all()  # llama.cpp runs no n-gram longer than gamma
    recommendation = json.loads((out / "recommendation.json").read_text())
    assert recommendation["warm_start"]["reason"] == unavailable_with("server")
    (choice,) = recommendation["temperatures"]
    assert choice["trials"] == 3
    llama = choice["engine_settings"]["llama_cpp"]
    help_text = subprocess.run([str(LLAMA_SERVER), "--help"], capture_output=True, text=True,
                               env={**os.environ, "LD_LIBRARY_PATH": str(LLAMA_SERVER.resolve().parent)}).stdout
    assert all(flag in help_text for flag in llama["command"] if flag.startswith("-"))
    if choice["speculate"]:  # what was launched for the chosen point: its speculation flags
        launches = json.loads((out / "manifest.json").read_text())["server"]["launches"]
        argv = next(launch["argv"] for launch in launches if launch["point"] == choice["point_id"])
        assert " ".join(llama["args"]) in " ".join(argv)

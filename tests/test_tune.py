"""`specbench tune`: on tiny models end to end (recommendation.toml runs under `specbench run`), resume
after an interruption, the warm start's prediction, bad input."""

from __future__ import annotations

import json
import sqlite3
import tomllib
from dataclasses import replace
from pathlib import Path

import optuna
import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.core import stats
from specbench.cli import app
from specbench.tune.plan import TuneSettings
from specbench.tune.objectives import parse_objective
from specbench.tune.runner import tune
from specbench.tune import evaluate
from specbench.tune.propose import Proposal, held_points, point_of, propose
from specbench.tune.space import Config, space_from_profile
from specbench.tune.warmstart import Calibration, predicted_speedup, verify_ms
from tiny import tiny_profile, write_model_folder, write_project

GRID = Path(__file__).parent / "fixtures" / "synthetic-grid"
PROFILE = tiny_profile(gamma=(1, 3), temperature=(0.0,), max_new_tokens=12, warmup=0, ngram=(1, 2))
PROMPTS = [("the cat sat on the mat and the dog ran fast", "chat"),
           ("write code to sum one two three four five", "chat")]


@pytest.fixture
def project(tmp_path: Path, models_dir: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return write_project(tmp_path, profile=PROFILE, prompts=PROMPTS, models=models_dir)


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def test_tune_on_tiny_models_and_the_recommendation_runs_under_specbench_run(project):
    result = cli("tune", "tiny.toml", "--trials", "5", "--out", "tuned")
    assert result.exit_code == 0, result.output
    out = project / "tuned"
    trials = pd.read_parquet(out / "trials.parquet")
    finished = trials[trials["state"].isin(["COMPLETE", "PRUNED"])]
    assert len(finished) == 5 and finished["point_id"].is_unique
    assert list(trials["role"][:2]) == ["calibration", "calibration"]  # one per draft at the largest gamma
    assert set(trials["gamma"][:2]) == {3}
    assert {"tokens_per_s", "speedup", "acceptance_rate", "peak_memory_mb", "value", "state"} <= set(trials.columns)
    # each calibration carries the target's timed forward pass for 1..gamma_max + 1 tokens
    study = optuna.load_study(study_name="tiny-tokens_per_s-t0-p1", storage=f"sqlite:///{out / 'study.db'}")
    calibrations = [t.user_attrs["calibration"] for t in study.trials if "calibration" in t.user_attrs]
    assert len(calibrations) == 2
    assert all(len(c["verify_ms_by_tokens"]) == 4 and min(c["verify_ms_by_tokens"]) > 0 for c in calibrations)
    # every evaluated (not pruned) point is in the run's files, once, like `specbench run` writes them
    points = pd.read_parquet(out / "points.parquet")
    completed = trials[trials["state"] == "COMPLETE"]
    assert set(completed["point_id"]) | {"baseline-t0-p1"} == set(points["point_id"])
    requests = pd.read_parquet(out / "requests.parquet")
    assert not requests.duplicated(["point_id", "request_id"]).any()
    recommendation = json.loads((out / "recommendation.json").read_text())
    choice = recommendation["temperatures"][0]
    assert choice["evaluations"] <= 5 and choice["trials"] == 5
    assert set(choice["engine_settings"]) == {"vllm", "sglang", "llama_cpp", "request", "transformers", "notes"}
    profile = tomllib.loads((out / "recommendation.toml").read_text())
    assert profile["name"] == "tiny-recommended"
    if choice["speculate"]:
        row = completed.set_index("point_id").loc[choice["point_id"]]
        assert choice["objective_value"] == pytest.approx(row["value"])
        assert profile["sweep"]["gamma"] == [choice["gamma"]] and len(profile["drafts"]) == 1
    # the recommended profile runs as is and reproduces the recommended point against its baseline
    rerun = cli("run", str(out / "recommendation.toml"), "--out", "reproduced")
    assert rerun.exit_code == 0, rerun.output
    reproduced = pd.read_parquet(project / "reproduced" / "points.parquet")
    assert (reproduced["status"] == "ok").all()
    expected = {"baseline-t0-p1"} | ({choice["point_id"]} if choice["speculate"] else set())
    assert set(reproduced["point_id"]) == expected


def test_an_interrupted_tune_resumes_to_the_requested_total_without_redoing_trials(tmp_path, monkeypatch):
    settings = TuneSettings(objective=parse_objective("speedup"), trials=8, seed=3)
    real, calls = evaluate.Replay.run, {"n": 0}

    def interrupted_after_4(self, spec, after_batch):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(self, spec, after_batch)

    monkeypatch.setattr(evaluate.Replay, "run", interrupted_after_4)
    with pytest.raises(KeyboardInterrupt):
        tune(None, out_dir=tmp_path, settings=settings, replay=GRID)
    study = optuna.load_study(study_name="synthetic-grid-speedup-t0-p1", storage=f"sqlite:///{tmp_path / 'study.db'}")
    before = {t.number: (t.params, t.values, t.datetime_start) for t in study.trials if t.state.is_finished()
              and t.state.name != "FAIL"}
    assert len(before) == 4
    monkeypatch.setattr(evaluate.Replay, "run", real)
    calls["n"] = 0
    counting = {"points": []}

    def counted(self, spec, after_batch):
        counting["points"].append(spec.point_id)
        return real(self, spec, after_batch)

    monkeypatch.setattr(evaluate.Replay, "run", counted)
    result = tune(None, out_dir=tmp_path, settings=settings, replay=GRID)
    trials = result.trials[result.trials["study"] == "synthetic-grid-speedup-t0-p1"]
    finished = trials[trials["state"].isin(["COMPLETE", "PRUNED"])]
    assert len(finished) == 8 and finished["point_id"].is_unique
    interrupted = trials[trials["role"] == "interrupted"]
    assert len(interrupted) == 1 and interrupted["state"].iloc[0] == "FAIL"
    study = optuna.load_study(study_name="synthetic-grid-speedup-t0-p1", storage=f"sqlite:///{tmp_path / 'study.db'}")
    for number, (params, values, started) in before.items():
        assert (study.trials[number].params, study.trials[number].values, study.trials[number].datetime_start) == \
            (params, values, started)
    resumed_t0 = [p for p in counting["points"] if p.endswith("-t0-p1")]
    assert len(resumed_t0) == 4 and not set(resumed_t0) & {before_id for before_id in finished["point_id"][:4]}


def test_the_warm_start_prediction_is_leviathan_with_geometric_acceptance():
    alpha, gamma_max = 0.7, 6
    calibration = Calibration(gamma=gamma_max, accepted_per_step=tuple(alpha ** (i + 1) for i in range(gamma_max)),
                              drafted_per_step=(1.0,) * gamma_max, draft_ms_per_token=0.5, verify_ms_per_step=13.0,
                              target_ms_per_token=10.0)
    for gamma in range(1, gamma_max + 1):
        verify = 10.0 + 3.0 * gamma / gamma_max
        expected = stats.predicted_speedup(alpha=alpha, gamma=gamma, draft_s_per_token=0.5, verify_s=verify,
                                           target_s_per_token=10.0)
        assert predicted_speedup(calibration, gamma) == pytest.approx(expected)


def test_the_warm_start_weights_the_timed_verify_cost_by_how_many_tokens_were_drafted():
    """A timed cost curve replaces the linear interpolation: a step that drafted k tokens verifies k + 1; the curve
    gives how the cost grows with the tokens verified, the calibration point's measurement the level."""
    curve = (10.0, 20.0, 15.0, 12.0)  # ms for 1..4 tokens: not linear (a CPU's kernels)
    calibration = Calibration(gamma=3, accepted_per_step=(0.5, 0.25, 0.1), drafted_per_step=(0.5, 0.25, 0.25),
                              draft_ms_per_token=0.0, verify_ms_per_step=12.0, target_ms_per_token=8.0,
                              verify_ms_by_tokens=curve)
    # gamma 2: half the steps draft nothing (1 token), a quarter one (2 tokens), a quarter two (3 tokens); the
    # calibration point's measured 12 ms scaled by the curve's cost of that over its cost of gamma 3's steps (a
    # quarter drafted three: 4 tokens). Its own gamma restates its measurement.
    at_gamma_3 = 0.5 * 10.0 + 0.25 * 20.0 + 0.25 * 12.0
    assert verify_ms(calibration, 2) == pytest.approx(12.0 * (0.5 * 10.0 + 0.25 * 20.0 + 0.25 * 15.0) / at_gamma_3)
    assert verify_ms(calibration, 3) == pytest.approx(12.0)
    assert predicted_speedup(calibration, 2) == pytest.approx((1 + 0.5 + 0.25) / (verify_ms(calibration, 2) / 8.0))
    # a model draft drafts gamma tokens every step: the cost of gamma + 1 tokens
    full = replace(calibration, drafted_per_step=(1.0, 1.0, 1.0))
    assert [verify_ms(full, g) for g in (1, 2, 3)] == pytest.approx([20.0, 15.0, 12.0])
    # untimed (a replay): linear between the one-token step and the calibration's measured step
    untimed = replace(calibration, verify_ms_by_tokens=())
    assert verify_ms(untimed, 2) == pytest.approx(8.0 + (12.0 - 8.0) * 2 / 3)
    assert Calibration.from_dict(calibration.as_dict()) == calibration


def test_the_queue_proposes_calibration_then_warm_start_then_the_sampler_then_the_nearest_untried_point():
    space = space_from_profile(evaluate.Replay(GRID).profile, tune_ngram=False)
    study = optuna.create_study(direction="maximize")
    distributions = {"draft": optuna.distributions.CategoricalDistribution([d.name for d in space.drafts]),
                     "gamma": optuna.distributions.IntDistribution(space.gamma_low, space.gamma_high)}

    def add(params, *, role, state=optuna.trial.TrialState.COMPLETE):
        study.add_trial(optuna.trial.create_trial(params=params, distributions=distributions, state=state,
                                                  value=1.0 if state.name == "COMPLETE" else None,
                                                  user_attrs={"role": role}))

    def proposed(sampled=Config("large", 2)):
        return propose(study, space=space, held=held_points(study.get_trials()), sampled=lambda: sampled)

    for config in space.calibration_configs():  # one per draft at the largest gamma, each until a trial holds it
        assert proposed() == Proposal(space.params(config), {"role": "calibration"})
        add(space.params(config), role="calibration")
    assert proposed() == Proposal({"draft": "large", "gamma": 2}, {"role": "search"})  # no warm start yet: TPE
    study.set_user_attr("warm_start", {"predictions": [], "queued": [[{"draft": "small", "gamma": 4}, 1.8],
                                                                     [{"draft": "small", "gamma": 3}, 1.7]]})
    add({"draft": "small", "gamma": 4}, role="search")  # held by another worker's trial already
    assert proposed() == Proposal({"draft": "small", "gamma": 3}, {"role": "warm_start", "predicted_speedup": 1.7})
    add({"draft": "small", "gamma": 3}, role="warm_start")
    # what the sampler proposes is held: the untried configuration nearest to it (small g3 is held too)
    assert proposed(Config("small", 4)) == Proposal({"draft": "small", "gamma": 5},
                                                    {"role": "search", "sampled": {"draft": "small", "gamma": 4},
                                                     "sampled_held_by": 3})
    for gamma in range(1, 13):
        if gamma not in (3, 4, 12):
            add({"draft": "small", "gamma": gamma}, role="search")
    nearest = proposed(Config("small", 4))  # every gamma of the draft is held: the next draft, the same gamma
    assert nearest.params == {"draft": "large", "gamma": 4} and nearest.attrs["sampled_held_by"] == 3
    for config in space.configs():
        if point_of(space.params(config)) not in held_points(study.get_trials()):
            add(space.params(config), role="search")
    assert proposed() is None  # every configuration held: nothing to propose (the trial ends as surplus)


def test_the_smaller_gamma_wins_a_near_tie():
    from specbench.tune.recommend import choose

    rows = [
        {"number": 0, "state": "COMPLETE", "feasible": True, "value": 100.0, "values": [100.0], "noise": 2.0, "gamma": 6,
         "peak_memory_mb": 10.0},
        {"number": 1, "state": "COMPLETE", "feasible": True, "value": 98.5, "values": [98.5], "noise": 2.0, "gamma": 3,
         "peak_memory_mb": 9.0},
        {"number": 2, "state": "COMPLETE", "feasible": True, "value": 90.0, "values": [90.0], "noise": 2.0, "gamma": 1,
         "peak_memory_mb": 8.0},
        {"number": 3, "state": "COMPLETE", "feasible": False, "value": 150.0, "values": [150.0], "noise": 0.0, "gamma": 2,
         "peak_memory_mb": 99.0},
    ]
    chosen, _ = choose(rows, objective=parse_objective("tokens_per_s"), tolerance=0.01)
    assert chosen["number"] == 1


def test_pareto_mode_returns_the_front(tmp_path):
    result = tune(None, out_dir=tmp_path, replay=GRID,
                  settings=TuneSettings(objective=parse_objective("pareto"), trials=10, seed=0))
    for choice in result.recommendation.temperatures:
        front = choice["pareto_front"]
        assert front and all(a["tokens_per_s"] >= b["tokens_per_s"] for a, b in zip(front, front[1:]))
        assert all(a["peak_memory_mb"] >= b["peak_memory_mb"] for a, b in zip(front, front[1:]))


@pytest.mark.parametrize("args, message", [
    (["--objective", "latency"], "--objective: unknown objective 'latency' (known: tokens_per_s, speedup"),
    (["--storage", "postgresql+psycopg2://nobody@127.0.0.1:1/none"], "--storage: cannot open postgresql+psycopg2://"),
    (["--trials", "0"], "--trials: must be an integer >= 1 (got 0)"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, args, message):
    result = cli("tune", "--replay", str(GRID), "--out", str(tmp_path / "out"), *args)
    assert result.exit_code == 2, result.output
    assert "\n" not in result.output.strip() and message in result.output
    assert not (tmp_path / "out").exists()


def test_an_empty_search_space_is_refused(project):
    (project / "tiny.toml").write_text(PROFILE.replace("[[drafts]]\nname = \"close\"\nmethod = \"draft\"\nmodel = \"./draft\"\n", "")
                                       .replace("ngram_max = 2", "ngram_max = 1").replace("gamma = [1, 3]", "gamma = [2]"))
    result = cli("tune", "tiny.toml")
    assert result.exit_code == 2 and "empty search space" in result.output and "\n" not in result.output.strip()
    assert not (project / "results").exists()


def test_a_study_of_another_search_space_is_refused(tmp_path):
    out = tmp_path / "out"
    assert cli("tune", "--replay", str(GRID), "--out", str(out), "--trials", "3", "--study", "s").exit_code == 0
    with sqlite3.connect(out / "study.db") as db:  # the same study name, created for other drafts
        db.execute("UPDATE study_user_attributes SET value_json = replace(value_json, '\"small\"', '\"tiny\"')")
    before = (out / "trials.parquet").read_bytes()
    result = cli("tune", "--replay", str(GRID), "--out", str(out), "--trials", "4", "--study", "s")
    assert result.exit_code == 2
    assert "study 's-t0-p1' was created with another search space" in result.output
    assert (out / "trials.parquet").read_bytes() == before


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_baseline_that_fails_is_one_line_and_exit_2(tmp_path, monkeypatch, workers):
    """A target whose embedding is smaller than its tokenizer's vocabulary fails every request of the baseline
    (the prompt fits its context window, so nothing catches it earlier), and a tune cannot measure a speedup
    without it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=4, n_positions=64, n_embd=32, n_layer=1, n_head=2))
    write_model_folder(tmp_path / "short", model.eval())
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": PROMPTS[0][0], "category": "chat"}) + "\n")
    (tmp_path / "tiny.toml").write_text('name = "short"\n[target]\nmodel = "./short"\n[[drafts]]\nname = "ngram"\n'
                                        'method = "ngram"\n[sweep]\ngamma = [1, 2]\ntemperature = [0.0]\n'
                                        '[workload]\nprompts = "prompts.jsonl"\nmax_new_tokens = 8\n[run]\nwarmup = 0\n')
    monkeypatch.chdir(tmp_path)
    result = cli("tune", "tiny.toml", "--trials", "2", "--workers", workers, "--out", "tuned")
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()[-1:]
    assert "the baseline baseline-t0-p1 failed: IndexError: index out of range in self; every trial's speedup" in line
    assert "Traceback" not in result.output

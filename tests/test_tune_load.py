"""`specbench tune` under load, replayed from a recorded grid: a trial measures its configuration at every load level,
its value is the objective over the load mix, and the recommendation gives per level the best configuration, the
crossover, a gamma per concurrency level (as vLLM's num_speculative_tokens_per_batch_size) and the single setting
best over the mix, with the levels where it loses.

The recording is simulated so that the answer is known: a forward pass costs the same up to KNEE tokens in the
batch and proportionally more beyond (memory-bound, then compute-bound). So drafting is free at concurrency 1,
costs at 2, and at 4 any drafted token makes the batch's step slower than the tokens it gains."""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.core import results
from specbench.cli import app
from specbench.core.trace import StepRecord, Trace
from specbench.profile import ProfileError, dump_profile, load_profile, profile_from_dict
from specbench.core.summary import summarize
from specbench.sweep.plan import plan_points
from specbench.tune.objectives import TuneError, parse_objective
from specbench.tune.plan import TuneSettings
from specbench.tune.runner import tune
from specbench.workloads.prompts import Prompt

KNEE = 4  # tokens a forward pass verifies at the cost of one
STEP_MS = 20.0
PROMPTS = [f"p{i}" for i in range(8)]
OUTPUT_TOKENS = 48
ACCEPT = 0.8  # each drafted token is accepted with this probability (the earlier ones being accepted)

PROFILE = {
    "name": "simulated-load",
    "backend": "server",
    "server": {"engine": "vllm", "binary": "/nonexistent/python", "extra_args": ["--max-num-seqs", "8"]},
    "target": {"model": "builtin:smollm2-135m-instruct"},
    "drafts": [{"name": "ngram", "method": "ngram", "ngram_min": 1, "ngram_max": 1}],
    "sweep": {"gamma": [1, 2, 3, 4], "temperature": [0.0], "concurrency": [1, 2, 4]},
    "workload": {"prompts": "builtin:mixed", "max_prompts": len(PROMPTS), "max_new_tokens": OUTPUT_TOKENS},
    "run": {"repeats": 2, "warmup": 0, "seed": 0},
}


def simulate(spec, prompt: int, repeat: int) -> Trace:
    rng = np.random.default_rng(int(hashlib.sha256(f"{spec.point_id}/{prompt}/{repeat}".encode()).hexdigest()[:8], 16))
    gamma, batch = spec.gamma or 0, spec.concurrency or 1
    ttft_s = 0.05 * rng.lognormal(0, 0.03)
    now, times, steps, emitted_total = ttft_s, [ttft_s], [], 1
    while emitted_total < OUTPUT_TOKENS:
        accepted = 0
        while accepted < gamma and rng.random() < ACCEPT:
            accepted += 1
        emitted = min(accepted + 1, OUTPUT_TOKENS - emitted_total)
        verify_ms = STEP_MS * max(1.0, batch * (gamma + 1) / KNEE) * rng.lognormal(0, 0.03)
        now += verify_ms / 1e3
        steps.append(StepRecord(drafted=gamma, accepted=min(accepted, emitted - 1) if gamma else 0, emitted=emitted,
                                draft_s=0.0 if gamma else None, verify_s=verify_ms / 1e3))
        times += [now] * emitted
        emitted_total += emitted
    return Trace(prompt_tokens=50, output_ids=tuple(range(prompt, prompt + OUTPUT_TOKENS)), ttft_s=ttft_s,
                 token_times_s=tuple(times), steps=tuple(steps), gamma=max(gamma, 1))


def record(folder: Path, data: dict = PROFILE) -> Path:
    """A run folder of the simulated grid, as `specbench run` writes one (requests in waves of `concurrency`)."""
    profile = profile_from_dict(data)
    specs = plan_points(profile)
    rows, context = [], {}
    for spec in specs:
        key = hashlib.sha256(f"simulated/{spec.point_id}".encode()).hexdigest()[:16]
        context[spec.point_id] = {"backend": "server", "target_model": profile.target.model, "point_key": key}
        point_rows = [results.request_row(spec, point_key=key, prompt=Prompt(prompt_id, "simulated", ()), repeat=repeat,
                                          seed=0, trace=simulate(spec, prompt, repeat))
                      for repeat in range(profile.run.repeats) for prompt, prompt_id in enumerate(PROMPTS)]
        start, wave = 0.0, spec.concurrency or 1
        for index in range(0, len(point_rows), wave):
            for row in point_rows[index:index + wave]:
                row["start_ms"] = start
            start += max(row["e2e_ms"] for row in point_rows[index:index + wave])
        rows += point_rows
    requests = pd.DataFrame(rows)
    points = summarize(specs, requests, failures={}, context=context)
    folder.mkdir(parents=True)
    results.write_parquet_atomic(requests, folder / results.REQUESTS_FILE)
    results.write_parquet_atomic(points, folder / results.POINTS_FILE)
    manifest = {"run_key": "simulated", "profile_toml": dump_profile(profile),
                "workload": {"prompts": "simulated", "prompt_ids": PROMPTS}, "status": "complete"}
    results.write_json_atomic(manifest, folder / "manifest.json")
    return folder


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    return record(tmp_path_factory.mktemp("simulated") / "grid")


def test_a_trial_is_measured_at_every_level_and_its_value_is_the_mix(grid, tmp_path):
    result = tune(None, out_dir=tmp_path, replay=grid,
                  settings=TuneSettings(objective=parse_objective("tokens_per_s"), trials=4, seed=0))
    trials = result.trials
    assert len(trials) == 4 and (trials["state"] == "COMPLETE").all()
    for row in trials.to_dict("records"):
        values = list(row["level_values"])
        assert len(values) == 3 and row["value"] == pytest.approx(sum(values) / 3)
    points = pd.read_parquet(grid / results.POINTS_FILE).set_index("point_id")
    row = trials[trials["point_id"] == "ngram-g2-t0-p1"].iloc[0]
    # each level's point, as recorded (the objective is the median over the two repeats; the point pools them)
    assert list(row["level_values"]) == pytest.approx(
        [points.loc[p, "tokens_per_s"] for p in ("ngram-g2-t0-p1", "ngram-g2-t0-p1-c2", "ngram-g2-t0-p1-c4")], rel=0.005)


def test_per_level_best_crossover_and_a_gamma_schedule_vllm_takes(grid, tmp_path):
    result = tune(None, out_dir=tmp_path, replay=grid,
                  settings=TuneSettings(objective=parse_objective("tokens_per_s"), trials=4, seed=0))
    (choice,) = result.recommendation.temperatures
    load = choice["load"]
    levels = {entry["load"]: entry for entry in load["levels"]}
    assert [entry["load"] for entry in load["levels"]] == ["concurrency 1", "concurrency 2", "concurrency 4"]
    # free drafting at 1 (the longest gamma wins), none at 4 (every drafted token slows the batch)
    assert levels["concurrency 1"]["speculate"] and levels["concurrency 1"]["best"]["gamma"] >= 3
    assert levels["concurrency 2"]["speculate"] and levels["concurrency 2"]["best"]["gamma"] < 3
    assert not levels["concurrency 4"]["speculate"] and levels["concurrency 4"]["best"]["speedup"] < 1
    crossover = load["crossover"]
    assert crossover["concurrency"]["load"] == "concurrency 2" and crossover["request_rate"] is None
    low, high = crossover["concurrency"]["speedup_ci"]
    assert 1 < low <= crossover["concurrency"]["speedup"] <= high
    assert "up to concurrency 2" in crossover["note"] and "concurrency 4" in crossover["note"]

    schedule = load["schedule"]
    gammas = [g["gamma"] for g in schedule["gammas"]]
    assert gammas == [levels["concurrency 1"]["best"]["gamma"], levels["concurrency 2"]["best"]["gamma"], 0]
    assert schedule["batch_size_ranges"] == [[1, 1, gammas[0]], [2, 3, gammas[1]], [4, 8, 0]]  # --max-num-seqs 8
    config = schedule["speculative_config"]
    assert config["num_speculative_tokens_per_batch_size"] == schedule["batch_size_ranges"]
    assert config["num_speculative_tokens"] == max(gammas) and config["method"] == "ngram"
    # vLLM gets the schedule; llama.cpp, which has no gamma per batch size, the single setting over the mix
    vllm_args = choice["engine_settings"]["vllm"]["args"]
    assert json.loads(vllm_args[vllm_args.index("--speculative-config") + 1]) == config
    single = load["single"]
    assert choice["point_id"] == single["point_id"] and single["loses_at"] == ["concurrency 4"]
    llama = choice["engine_settings"]["llama_cpp"]["args"]
    assert llama[llama.index("--spec-draft-n-max") + 1] == str(single["gamma"])

    # the recommendation profile runs the schedule beside the single setting and the baseline, at every level
    profile = profile_from_dict(tomllib.loads((tmp_path / "recommendation.toml").read_text()))
    assert profile.sweep.concurrency == (1, 2, 4)
    dynamic = next(d for d in profile.drafts if d.gamma_schedule is not None)
    assert [list(r) for r in dynamic.gamma_schedule] == schedule["batch_size_ranges"]
    assert load["profile_drafts"] == {"single": "ngram", "schedule": dynamic.name}
    ids = [p.point_id for p in plan_points(profile)]
    assert f"{dynamic.name}-sched-t0-p1-c4" in ids and "baseline-t0-p1-c2" in ids
    assert load["verification"] == {"status": "skipped", "reason": "a replay: nothing to launch", "folder": "verify",
                                    "levels": [], "schedule_no_worse": None}


def test_the_load_mix_decides_the_single_setting(grid, tmp_path):
    runner = CliRunner()
    light = runner.invoke(app, ["tune", "--replay", str(grid), "--trials", "4", "--load-mix", "1:1",
                                "--out", str(tmp_path / "light")])
    assert light.exit_code == 0, light.output
    (choice,) = json.loads((tmp_path / "light" / "recommendation.json").read_text())["temperatures"]
    assert [m["weight"] for m in choice["load"]["mix"]] == [1.0, 0.0, 0.0]
    assert choice["speculate"] and choice["gamma"] >= 3  # all traffic at concurrency 1: draft long
    heavy = runner.invoke(app, ["tune", "--replay", str(grid), "--trials", "4", "--load-mix", "c4:9,2:1",
                                "--out", str(tmp_path / "heavy")])
    assert heavy.exit_code == 0, heavy.output
    (choice,) = json.loads((tmp_path / "heavy" / "recommendation.json").read_text())["temperatures"]
    assert [m["weight"] for m in choice["load"]["mix"]] == [0.0, 0.1, 0.9]
    assert choice.get("point_id") is None and "no single setting beats the baseline" in choice["reason"]
    assert choice["speculate"]  # the schedule still drafts where it pays (concurrency 2), and nowhere else
    assert [g["gamma"] > 0 for g in choice["load"]["schedule"]["gammas"]] == [True, True, False]


@pytest.mark.parametrize(("mix", "message"), [
    ("8:1", "--load-mix: 8 is not a load level of the profile (its levels: 1, 2, 4)"),
    ("1:0.5,1:0.5", "--load-mix: 1 is named twice"),
    ("1:0", "--load-mix: the weight of 1 must be > 0"),
    ("one:1", "--load-mix: 'one:1' is not LEVEL:WEIGHT"),
])
def test_a_bad_load_mix_is_one_line_and_exit_2(grid, tmp_path, mix, message):
    result = CliRunner().invoke(app, ["tune", "--replay", str(grid), "--load-mix", mix, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "o").exists()


def test_the_profile_declares_the_load_mix(tmp_path):
    data = {**PROFILE, "load": {"mix": "1:0.5,r2:0.5"}}
    with pytest.raises(ProfileError, match=r"load\.mix: r2 is not a load level of the profile \(its levels: 1, 2, 4\)"):
        profile_from_dict(data)
    data["sweep"] = {**PROFILE["sweep"], "request_rate": [2.0]}
    path = tmp_path / "p.toml"
    path.write_text(dump_profile(profile_from_dict(data)))
    assert load_profile(path).load.mix == "1:0.5,r2:0.5"


def test_pareto_is_refused_under_load(grid, tmp_path):
    with pytest.raises(TuneError, match="with several load levels"):
        tune(None, out_dir=tmp_path, replay=grid, settings=TuneSettings(objective=parse_objective("pareto")))


def test_goodput_needs_slos(grid, tmp_path):
    with pytest.raises(TuneError, match=r"--objective goodput: .* has no \[slo\] table"):
        tune(None, out_dir=tmp_path, replay=grid, settings=TuneSettings(objective=parse_objective("goodput")))


def test_a_profile_draft_with_a_gamma_schedule_runs_one_point_per_level(tmp_path):
    data = {**PROFILE, "drafts": [{"name": "ngram", "method": "ngram", "gamma_schedule": [[1, 1, 3], [2, 8, 1]]}]}
    profile = profile_from_dict(data)
    points = [p for p in plan_points(profile) if p.method != "baseline"]
    assert [(p.point_id, p.gamma, p.gamma_schedule) for p in points] == [
        ("ngram-sched-t0-p1", 3, "1-1:3,2-8:1"), ("ngram-sched-t0-p1-c2", 3, "1-1:3,2-8:1"),
        ("ngram-sched-t0-p1-c4", 3, "1-1:3,2-8:1")]
    path = tmp_path / "p.toml"
    path.write_text(dump_profile(profile))
    assert load_profile(path) == profile
    bad = {**data, "drafts": [{**data["drafts"][0], "gamma_schedule": [[1, 1, 3], [3, 8, 1]]}]}
    with pytest.raises(ProfileError, match=r"drafts\[0\]\.gamma_schedule: entry 1: must start at batch size 2"):
        profile_from_dict(bad)
    native = {**data, "backend": "native", "sweep": {**data["sweep"], "concurrency": [1]}}
    native.pop("server")
    with pytest.raises(ProfileError, match=r"drafts\[0\]\.gamma_schedule: a gamma per batch size is vLLM's setting"):
        profile_from_dict(native)


def test_a_schedule_verified_worse_than_the_single_setting_is_not_what_vllm_gets():
    """The verification's figures per level; a schedule whose throughput ratio to the single setting has its whole
    CI below 1 somewhere falls back to the single setting (as vLLM 0.32's CPU build measured here: 0.82x at
    concurrency 1 with the same gamma 3)."""
    from specbench.tune.verify import fall_back, measured

    levels = [{"load": "concurrency 1", "concurrency": 1, "request_rate": None},
              {"load": "concurrency 4", "concurrency": 4, "request_rate": None}]
    points, requests = [], []
    for concurrency in (1, 4):
        for draft, ms in (("baseline", 1000.0), ("ngram", 800.0), ("ngram-dynamic", 960.0 if concurrency == 1 else 800.0)):
            key = f"{draft}-c{concurrency}"
            points.append({"point_id": key, "draft": draft, "status": "ok", "temperature": 0.0, "top_p": 1.0,
                           "concurrency": concurrency, "request_rate": float("nan"), "point_key": key,
                           "tokens_per_s": 48_000 / ms, "speedup": 1000.0 / ms, "speedup_ci_low": 0.9,
                           "speedup_ci_high": 1.3})
            requests += [{"point_key": key, "prompt_id": f"p{i}", "output_tokens": 48,
                          "e2e_ms": ms * (1 + 0.01 * (i % 3))} for i in range(6)]
    load = {"levels": levels, "profile_drafts": {"single": "ngram", "schedule": "ngram-dynamic"},
            "schedule": {"recommended": True}}
    verification = measured(load, pd.DataFrame(points), pd.DataFrame(requests),
                            objective={"columns": ["tokens_per_s"], "directions": ["maximize"]}, temperature=0.0, top_p=1.0)
    first, second = verification["levels"]
    assert first["schedule_vs_single"]["worse"] and first["schedule_vs_single"]["ratio"] == pytest.approx(800 / 960)
    assert not second["schedule_vs_single"]["worse"] and verification["schedule_no_worse"] is False
    assert first["baseline"]["value"] == pytest.approx(48.0) and first["single"]["point_id"] == "ngram-c1"
    choice = {"load": {**load, "verification": verification},
              "engine_settings": {"vllm": {"args": ["schedule"]}, "vllm_single": {"args": ["single"]}, "notes": []}}
    fall_back(choice)
    assert choice["engine_settings"]["vllm"] == {"args": ["single"]}
    assert choice["engine_settings"]["vllm_schedule"] == {"args": ["schedule"]}
    assert choice["load"]["schedule"]["recommended"] is False
    assert "worse than the single setting at concurrency 1" in choice["load"]["verification"]["fallback"]

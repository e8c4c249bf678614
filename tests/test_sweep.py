"""`specbench run` on tiny local models: files and schemas, resume, crash safety, failure isolation,
bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import specbench
from specbench.core import results
from specbench.backends.inprocess import InProcessSession
from specbench.sweep.plan import plan_points
from specbench.cli import app
from specbench.profile import load_profile, profile_from_dict
from tiny import WORDS, tiny_llama, tiny_profile, word_tokenizer, write_model_folder, write_project

PROMPTS = [
    ("the cat sat on the mat and the dog ran fast", "chat"),
    ("write code to sum one two three four five", "code"),
    ("why is the red cat big and the blue dog small", "chat"),
]
PROFILE = tiny_profile()
N_POINTS = 2 * (1 + 2 * 2)  # per temperature: the baseline, then 2 drafts x 2 gammas
N_REQUESTS = len(PROMPTS) * 2

REQUEST_COLUMNS = {
    "point_id", "request_id", "category", "repeat", "prompt_tokens", "output_tokens", "ttft_ms", "e2e_ms",
    "tokens_per_s", "target_steps", "drafted_tokens", "accepted_tokens", "accepted_per_position", "output_sha",
}
POINT_COLUMNS = {
    "point_id", "status", "error", "backend", "method", "draft", "gamma", "temperature", "n_requests",
    "output_tokens", "tokens_per_s", "speedup", "speedup_ci_low", "speedup_ci_high", "acceptance_rate",
    "mean_accepted_length", "ttft_ms_p50", "tpot_ms_p50", "tpot_ms_p90", "itl_ms_p50", "itl_ms_p99",
    "e2e_ms_p50", "peak_memory_mb", "outputs_match_baseline",
}


@pytest.fixture
def project(tmp_path: Path, models_dir: Path, monkeypatch) -> Path:
    """A folder with a profile, a prompts file and links to the tiny models; the cwd for the CLI."""
    monkeypatch.chdir(tmp_path)
    return write_project(tmp_path, profile=PROFILE, prompts=PROMPTS, models=models_dir)


def run_cli(*args: str):
    return CliRunner().invoke(app, ["run", *args])


def read(out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    return pd.read_parquet(out / "points.parquet"), pd.read_parquet(out / "requests.parquet")


def assert_each_point_once(out: Path) -> None:
    points, requests = read(out)
    assert len(points) == N_POINTS and points["point_id"].is_unique
    assert (points["status"] == "ok").all()
    counts = requests.groupby("point_id").size()
    assert set(counts.index) == set(points["point_id"]) and (counts == N_REQUESTS).all()
    assert not requests.duplicated(["point_id", "request_id"]).any()


def test_run_writes_both_files_with_their_schemas(project):
    result = run_cli("tiny.toml")
    assert result.exit_code == 0, result.output
    out = project / "results" / "tiny"
    points, requests = read(out)
    assert POINT_COLUMNS <= set(points.columns)
    assert REQUEST_COLUMNS <= set(requests.columns)
    assert_each_point_once(out)
    assert list(points["point_id"][:5]) == ["baseline-t0-p1", "ngram-g2-t0-p1", "ngram-g3-t0-p1", "close-g2-t0-p1",
                                            "close-g3-t0-p1"]
    greedy, sampled = points[points["temperature"] == 0], points[points["temperature"] > 0]
    assert greedy["outputs_match_baseline"].all()
    assert sampled["outputs_match_baseline"].isna().all()
    baseline = points.set_index("point_id").loc["baseline-t0-p1"]
    assert baseline["speedup"] == 1.0 and baseline["mean_accepted_length"] == 1.0
    assert pd.isna(baseline["acceptance_rate"]) and pd.isna(baseline["gamma"])
    drafts = points[points["method"] != "baseline"]
    assert drafts["acceptance_rate"].between(0, 1).all()
    assert (drafts["mean_accepted_length"] >= 1).all()
    assert (drafts["mean_accepted_length"] <= drafts["gamma"] + 1).all()
    assert (drafts["speedup_ci_low"] <= drafts["speedup"]).all() and (drafts["speedup"] <= drafts["speedup_ci_high"]).all()
    assert (points["peak_memory_mb"] >= points["weight_mb"]).all()
    # the point's throughput is its requests' tokens over their time
    one = requests[requests["point_id"] == "close-g2-t0-p1"]
    row = points.set_index("point_id").loc["close-g2-t0-p1"]
    assert row["tokens_per_s"] == pytest.approx(one["output_tokens"].sum() / (one["e2e_ms"].sum() / 1e3))
    assert row["acceptance_rate"] == pytest.approx(one["accepted_tokens"].sum() / one["drafted_tokens"].sum())
    judged = one["accepted_tokens"].sum() + one["rejected_steps"].sum()
    assert row["alpha"] == pytest.approx(one["accepted_tokens"].sum() / judged)
    assert (drafts["alpha"] >= drafts["acceptance_rate"] - 1e-12).all()
    assert list(row["accepted_per_position"]) == np.sum(np.stack(one["accepted_per_position"].to_list()), axis=0).tolist()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["finished_at"]
    assert manifest["models"]["target"]["identity"] and manifest["environment"]["torch"]
    assert manifest["workload"]["prompt_ids"] == ["prompts-2", "prompts-1", "prompts-3"]  # round robin: code, chat
    assert set(requests["category"]) == {"chat", "code"}


def test_rerun_resumes_and_fresh_starts_over(project):
    first = specbench.run("tiny.toml")
    assert len(first.ran) == N_POINTS
    again = specbench.run("tiny.toml")
    assert again.ran == []
    assert again.points.equals(first.points)
    fresh = specbench.run("tiny.toml", fresh=True)
    assert len(fresh.ran) == N_POINTS
    assert_each_point_once(project / "results" / "tiny")


def test_a_crash_mid_sweep_resumes_with_every_point_once(project, monkeypatch):
    calls = {"n": 0}
    real = InProcessSession.run_point

    def crashing(self, spec, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt  # not an Exception: it ends the sweep like a kill would
        return real(self, spec, **kwargs)

    monkeypatch.setattr(InProcessSession, "run_point", crashing)
    with pytest.raises(KeyboardInterrupt):
        specbench.run("tiny.toml")
    points, _ = read(project / "results" / "tiny")
    assert len(points) == 3
    monkeypatch.setattr(InProcessSession, "run_point", real)
    resumed = specbench.run("tiny.toml")
    assert len(resumed.ran) == N_POINTS - 3
    assert_each_point_once(project / "results" / "tiny")


def test_kill_9_then_rerun_finishes_with_every_point_once(project):
    out = project / "results" / "tiny"
    command = [sys.executable, "-m", "specbench.cli", "run", "tiny.toml"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=project)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        points = results.read_parquet(out / "points.parquet")  # the sweep replaces it as we poll
        if points is not None and len(points) >= 2:
            break
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    killed_at = len(pd.read_parquet(out / "points.parquet"))
    assert 2 <= killed_at < N_POINTS, "the kill should land mid-sweep"
    rerun = subprocess.run(command, capture_output=True, text=True, cwd=project)
    assert rerun.returncode == 0, rerun.stderr
    assert_each_point_once(out)


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(project, monkeypatch):
    real = InProcessSession.run_point

    def flaky(self, spec, **kwargs):
        if spec.point_id == "ngram-g3-t0.8-p1":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore details")
        return real(self, spec, **kwargs)

    monkeypatch.setattr(InProcessSession, "run_point", flaky)
    result = run_cli("tiny.toml")
    assert result.exit_code == 1
    points, requests = read(project / "results" / "tiny")
    failed = points[points["status"] == "failed"]
    assert list(failed["point_id"]) == ["ngram-g3-t0.8-p1"]
    assert failed["error"].iloc[0] == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert (points["status"] == "ok").sum() == N_POINTS - 1
    assert "ngram-g3-t0.8-p1" not in set(requests["point_id"])
    # the next run retries only the failed point
    monkeypatch.setattr(InProcessSession, "run_point", real)
    assert specbench.run("tiny.toml").ran == ["ngram-g3-t0.8-p1"]
    assert_each_point_once(project / "results" / "tiny")


def test_a_draft_with_another_tokenizer_runs_through_the_shared_vocabulary(project, tmp_path):
    """Every word shared, every id different: drafted through the intersection (tests/test_vocab.py has the rest)."""
    other = tiny_llama(vocab_size=len(WORDS), seed=5)
    tokenizer = word_tokenizer()
    swapped = list(reversed(WORDS))
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(swapped)}, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")
    write_model_folder(project / "alien", other, tokenizer)
    (project / "tiny.toml").write_text(PROFILE.replace('model = "./draft"', 'model = "./alien"'))
    result = run_cli("tiny.toml")
    assert result.exit_code == 0, result.output
    points, _ = read(project / "results" / "tiny")
    alien = points[points["draft"] == "close"]
    assert len(alien) == 4 and (alien["status"] == "ok").all()
    assert (alien["vocabulary"] == "intersection").all() and (alien["shared_tokens"] == len(WORDS)).all()
    assert alien[alien["temperature"] == 0]["outputs_match_baseline"].all()
    assert points[points["draft"] != "close"]["vocabulary"].isna().all()


def test_json_summary_and_overrides(project):
    result = CliRunner().invoke(app, ["run", "tiny.toml", "--json", "--max-prompts", "1", "--out", "elsewhere"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout[result.stdout.index("{"):])
    assert summary["out_dir"] == "elsewhere" and summary["failed"] == 0
    assert len(summary["points"]) == N_POINTS
    assert all(point["n_requests"] == 2 for point in summary["points"])


def test_hf_backend_runs_the_same_sweep(project):
    result = run_cli("tiny.toml", "--backend", "hf", "--max-prompts", "2")
    assert result.exit_code == 0, result.output
    points, _ = read(project / "results" / "tiny")
    assert (points["backend"] == "hf").all() and (points["status"] == "ok").all()
    greedy = points[points["temperature"] == 0]
    assert greedy["outputs_match_baseline"].all()
    assert points["acceptance_rate"].isna().all()  # HF does not expose what it drafted


@pytest.mark.parametrize("profile_text, message", [
    ("name = 'x'\n[target\n", "tiny.toml: invalid TOML at line 2"),
    (PROFILE.replace("gamma = [2, 3]", "gamma = [0]"), "tiny.toml: sweep.gamma[0]: must be an integer >= 1 (got 0)"),
    (PROFILE.replace('"prompts.jsonl"', '"nope.jsonl"'), "tiny.toml: workload.prompts: file not found:"),
    (PROFILE.replace('"./target"', '"builtin:gpt-9"'), 'tiny.toml: target.model: unknown builtin model "gpt-9"'),
])
def test_bad_profiles_fail_in_one_line_with_nothing_written(project, profile_text, message):
    (project / "tiny.toml").write_text(profile_text)
    result = run_cli("tiny.toml")
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line and message in line
    assert not (project / "results").exists()


def test_bad_prompts_file_and_missing_device_fail_cleanly(project):
    (project / "prompts.jsonl").write_text('{"prompt": "the cat"}\n{"text": "oops"}\n')
    result = run_cli("tiny.toml")
    assert result.exit_code == 2 and "prompts.jsonl line 2" in result.output
    assert not (project / "results").exists()


def test_max_new_tokens_past_the_context_window_is_refused_up_front(project):
    (project / "tiny.toml").write_text(PROFILE.replace("max_new_tokens = 16", "max_new_tokens = 100000000"))
    result = run_cli("tiny.toml")
    assert result.exit_code == 2
    line = result.output.strip().splitlines()[-1]  # after the "loading target" progress line
    assert line.startswith("error: tiny.toml: workload.max_new_tokens: 100000000 new tokens after the longest prompt (")
    assert "exceed the target's context window of 512 tokens; use max_new_tokens <= " in line
    assert not (project / "results").exists()


def test_a_draft_with_a_shorter_context_window_fails_its_own_points(project):
    short = tiny_llama(vocab_size=len(WORDS), seed=3)
    short.config.max_position_embeddings = 12  # the prompts plus 16 new tokens do not fit
    write_model_folder(project / "short", short)
    (project / "tiny.toml").write_text(PROFILE.replace('model = "./draft"', 'model = "./short"'))
    result = run_cli("tiny.toml")
    assert result.exit_code == 1
    points, _ = read(project / "results" / "tiny")
    failed = points[points["status"] == "failed"]
    assert set(failed["draft"]) == {"close"}
    assert failed["error"].str.startswith("ProfileError: tiny.toml: workload.max_new_tokens: 16 new tokens").all()
    assert failed["error"].str.contains("exceed the draft close's context window of 12 tokens").all()
    assert (points[points["draft"] != "close"]["status"] == "ok").all()


def test_missing_cuda_is_a_clear_error(project):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = run_cli("tiny.toml", "--device", "cuda")
    assert result.exit_code == 2 and "CUDA is not available" in result.output
    assert not (project / "results").exists()


def test_resuming_into_a_folder_of_another_run_is_refused(project):
    assert run_cli("tiny.toml", "--max-prompts", "1").exit_code == 0
    result = run_cli("tiny.toml")
    assert result.exit_code == 2 and "use --fresh" in result.output
    assert run_cli("tiny.toml", "--fresh").exit_code == 0


def test_the_quickstart_profile_plans_baselines_first():
    profile = load_profile(Path(__file__).parents[1] / "profiles" / "quickstart.toml")
    points = plan_points(profile)
    assert [p.point_id for p in points if p.method == "baseline"] == ["baseline-t0-p1", "baseline-t0.8-p1"]
    assert points[0].method == "baseline"
    assert len(points) == len(profile.sweep.temperature) * (1 + len(profile.drafts) * len(profile.sweep.gamma))


def test_a_draft_with_its_own_gammas_is_swept_at_those_only(tmp_path):
    profile = profile_from_dict({
        "name": "g", "target": {"model": "builtin:smollm2-135m-instruct"},
        "drafts": [{"name": "ngram", "method": "ngram", "gamma": [3]},
                   {"name": "self", "method": "draft", "model": "builtin:smollm2-135m-instruct"}],
        "sweep": {"gamma": [1, 2], "temperature": [0.0]}, "workload": {"prompts": "builtin:mixed"}})
    assert [p.point_id for p in plan_points(profile)] == ["baseline-t0-p1", "ngram-g3-t0-p1", "self-g1-t0-p1",
                                                          "self-g2-t0-p1"]
    assert profile.all_gammas() == (1, 2, 3)


def test_a_results_file_reads_whole_while_a_sweep_replaces_it(tmp_path):
    """pyarrow looks a path's size up and opens it separately: a replace in between failed about one read
    in five here. results.read_parquet reads one version's bytes."""
    path = tmp_path / "points.parquet"
    results.write_parquet_atomic(pd.DataFrame({"a": [0]}), path)
    stop = threading.Event()

    def replace_again_and_again():
        rows = 1
        while not stop.is_set():
            results.write_parquet_atomic(pd.DataFrame({"a": range(rows), "b": [str(i) * 5 for i in range(rows)]}), path)
            rows = rows % 300 + 1

    writer = threading.Thread(target=replace_again_and_again)
    writer.start()
    try:
        lengths = [len(results.read_parquet(path)) for _ in range(300)]
    finally:
        stop.set()
        writer.join()
    assert all(1 <= length <= 300 for length in lengths)

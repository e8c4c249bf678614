"""The server backend against a real llama.cpp llama-server on the embedded SmolLM2 GGUF (built by `make
engines`; skipped where it is not installed): acceptance from the engine, per-response counts that add up
to its /metrics, greedy outputs equal to the baseline's at concurrency 1, one launch per configuration,
no server left behind — also when the server dies mid-point — and a missing binary refused up front."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from installed_engines import LLAMA_SERVER, needs_llama_server, processes_running
from specbench.cli import app

pytestmark = needs_llama_server

PROFILE = f"""
name = "llama-tiny"
backend = "server"
[server]
engine = "llama.cpp"
binary = "{LLAMA_SERVER}"
ready_timeout_s = 120
extra_args = ["-t", "1", "-np", "4"]
[target]
model = "builtin:smollm2-135m-instruct"
[[drafts]]
name = "ngram"
method = "ngram"
[[drafts]]
name = "self"
method = "draft"
model = "builtin:smollm2-135m-instruct"
[sweep]
gamma = [3]
temperature = [0.0, 0.8]
concurrency = [1, 4]
[workload]
prompts = "builtin:mixed"
max_prompts = 4
max_new_tokens = 16
[run]
repeats = 1
warmup = 1
"""


def server_pids() -> set[int]:
    return processes_running(b"llama-server")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    (folder / "llama.toml").write_text(PROFILE)
    before = server_pids()
    result = subprocess.run([sys.executable, "-m", "specbench.cli", "run", "llama.toml", "--out", "out"], cwd=folder,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    out = folder / "out"
    return (pd.read_parquet(out / "points.parquet").set_index("point_id"), pd.read_parquet(out / "requests.parquet"),
            json.loads((out / "manifest.json").read_text()), out, before, result.stdout)


def test_the_self_draft_is_accepted_and_the_engine_counts_add_up(sweep):
    points, requests, *_ = sweep
    for point_id in ("self-g3-t0-p1", "self-g3-t0-p1-c4"):
        self_draft = points.loc[point_id]
        assert self_draft["acceptance_source"] == "metrics"
        assert self_draft["acceptance_rate"] >= 0.95, point_id  # measured 0.98-1.00 here; far lower: wrong accounting
        assert 1.0 < self_draft["mean_accepted_length"] <= 4.0
    for point_id, row in points[points["method"] != "baseline"].iterrows():
        mine = requests[requests["point_id"] == point_id]
        # llama.cpp's per-response timings (draft_n, draft_n_accepted) sum to its /metrics counters
        assert row["engine_draft_tokens"] == mine["drafted_tokens"].sum(), point_id
        assert row["engine_accepted_tokens"] == mine["accepted_tokens"].sum(), point_id


def test_greedy_outputs_at_concurrency_1_equal_the_baseline_and_every_level_has_its_baseline(sweep):
    points, *_ = sweep
    assert points.loc["ngram-g3-t0-p1", "outputs_match_baseline"]
    assert points.loc["self-g3-t0-p1", "outputs_match_baseline"]
    assert set(points["concurrency"]) == {1, 4}
    for point_id, row in points.iterrows():
        assert row["status"] == "ok", (point_id, row["error"])
        assert row["speedup_ci_low"] <= row["speedup"] <= row["speedup_ci_high"]
        assert row["peak_memory_mb"] > 50  # the server's resident memory, not this process's
        # what llama-server held, sampled from its /metrics every 0.5 s: requests in its slots; it exposes no KV-cache
        # usage (none since mid-2025) and no preemption counter: None, not a guess. A short point at concurrency 1 can
        # end before a sample, or be sampled between two requests (both seen in CI), so its peaks are read, not required
        if row["metrics_samples"] >= 1:
            assert row["requests_running_peak"] >= 0 and row["requests_waiting_peak"] >= 0, point_id
        else:
            assert pd.isna(row["requests_running_peak"]), point_id
        assert pd.isna(row["kv_cache_usage_peak"]) and pd.isna(row["preemptions"])
    assert points["metrics_samples"].sum() >= 1 and points["requests_running_peak"].max() >= 1  # the samples see slots


def test_each_launch_happens_once_with_its_argv_and_log_and_no_server_is_left(sweep):
    points, _, manifest, out, before, stdout = sweep
    server = manifest.get("server") or {}
    argvs = [launch["argv"] for launch in server.get("launches", [])]
    assert len(argvs) == 3  # the baseline, the n-gram, the self-draft: temperatures and concurrency per request
    assert any("--spec-type" in argv and "ngram-simple" in argv for argv in argvs)
    assert any("-md" in argv and "draft-simple" in argv for argv in argvs)
    assert all((out / launch["log"]).is_file() for launch in server["launches"])
    assert server_pids() <= before  # nothing launched is still running
    assert "concurrency 4" in stdout


def test_a_server_killed_mid_point_fails_that_point_only_and_leaves_no_process(tmp_path):
    (tmp_path / "llama.toml").write_text(PROFILE.replace("gamma = [3]", "gamma = [4]")
                                         .replace("temperature = [0.0, 0.8]", "temperature = [0.0]")
                                         .replace("concurrency = [1, 4]", "concurrency = [1]")
                                         .replace("max_new_tokens = 16", "max_new_tokens = 64"))
    before = server_pids()
    process = subprocess.Popen([sys.executable, "-m", "specbench.cli", "run", "llama.toml", "--out", "out"],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed = []

    def kill_the_second_launch() -> None:
        deadline = time.monotonic() + 300
        earlier: set[int] = set()  # the baseline's server
        while time.monotonic() < deadline and process.poll() is None:
            running = server_pids() - before
            logs = sorted((tmp_path / "out" / "server-logs").glob("*.log")) if (tmp_path / "out").exists() else []
            if not (len(logs) >= 2 and "ngram" in logs[-1].name):
                earlier |= running
            elif running - earlier:
                log = logs[-1].read_text(errors="replace")
                # the warm-up request done and the first measured one started: measuring, whatever the pace
                if log.count("stop processing") >= 1 and log.count("launch_slot_") >= 2:
                    for pid in running - earlier:
                        os.kill(pid, signal.SIGKILL)
                    killed.extend(running - earlier)
                    return
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_the_second_launch)
    watcher.start()
    output, _ = process.communicate(timeout=600)
    watcher.join()
    assert killed, "the n-gram server should have been killed mid-point"
    assert process.returncode == 1, output[-2000:]
    points = pd.read_parquet(tmp_path / "out" / "points.parquet").set_index("point_id")
    assert points.loc["ngram-g4-t0-p1", "status"] == "failed"
    assert "log " in points.loc["ngram-g4-t0-p1", "error"] or "Disconnected" in points.loc["ngram-g4-t0-p1", "error"] \
        or "Failed" in points.loc["ngram-g4-t0-p1", "error"]
    assert (points.drop(index="ngram-g4-t0-p1")["status"] == "ok").all()
    assert server_pids() <= before


def test_a_missing_binary_is_one_line_exit_2_and_nothing_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama.toml").write_text(PROFILE.replace(str(LLAMA_SERVER), "/nowhere/llama-server"))
    result = CliRunner().invoke(app, ["run", "llama.toml"])
    assert result.exit_code == 2
    assert result.output.strip() == ("error: llama.toml: server.binary: /nowhere/llama-server is not an executable "
                                     "file; install the engine (make engines) or fix the path")
    assert not (tmp_path / "results").exists()


def test_attached_to_a_running_server_only_per_request_axes_are_swept_and_it_is_left_running(tmp_path):
    from specbench.backends.server.process import free_port
    from specbench.models.load import resolve_model

    port = free_port()
    gguf = resolve_model("builtin:smollm2-135m-instruct").location
    server = subprocess.Popen([str(LLAMA_SERVER), "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", "1",
                               "-np", "2", "--metrics"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "LD_LIBRARY_PATH": str(LLAMA_SERVER.resolve().parent)})
    try:
        profile = PROFILE.split("[[drafts]]")[0].replace(f'binary = "{LLAMA_SERVER}"', f'url = "http://127.0.0.1:{port}"')
        profile += ('[sweep]\ngamma = [1]\ntemperature = [0.0, 0.8]\nconcurrency = [1, 2]\n'
                    '[workload]\nprompts = "builtin:mixed"\nmax_prompts = 2\nmax_new_tokens = 48\nignore_eos = true\n')
        (tmp_path / "attach.toml").write_text(profile.replace("extra_args = [\"-t\", \"2\", \"-np\", \"4\"]\n", ""))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the test's own server: wait for its model to load
            try:
                import urllib.request

                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(0.3)
        result = subprocess.run([sys.executable, "-m", "specbench.cli", "run", "attach.toml", "--out", "out"],
                                cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        points = pd.read_parquet(tmp_path / "out" / "points.parquet")
        assert sorted(points["point_id"]) == ["baseline-t0-p1", "baseline-t0-p1-c2", "baseline-t0.8-p1",
                                              "baseline-t0.8-p1-c2"]
        assert (points["status"] == "ok").all()
        # sampled attached too (every 0.5 s: a point of a few requests that llama-server answers in under a second each
        # may see one sample, taken between two requests; seen in CI): the samples, over the points, see its slots
        assert (points["metrics_samples"] >= 1).all() and points["requests_running_peak"].max() >= 1
        manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
        assert manifest["server"]["launches"] == []
        assert manifest["server"]["attached"] == f"http://127.0.0.1:{port}"
        assert manifest["server"]["reports"]["baseline"]["/v1/models"]["data"][0]["id"]  # what it says of itself
        assert server.poll() is None  # not ours to stop
    finally:
        server.kill()
        server.wait()
    dead = CliRunner().invoke(app, ["run", str(tmp_path / "attach.toml")])  # the same url, nobody answering now
    assert dead.exit_code == 2
    assert not (tmp_path / "results").exists()
    assert dead.output.strip().startswith(f"error: {tmp_path / 'attach.toml'}: server.url: http://127.0.0.1:{port} does not "
                                  "answer")

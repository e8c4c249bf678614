"""Faults under load against a real llama.cpp llama-server (skipped where `make engines` has not built it): a
request the engine refuses is a row with its error and its point stands unless most fail; an engine stopped with
SIGSTOP mid-point fails that point within seconds, is killed, and the next point launches it again; kill -9 of
specbench takes its engine with it, and the next run of the folder ends an engine an earlier run left; bad input
is refused before any engine starts (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.backends.server import client
from specbench.backends.server.backend import BACKEND
from specbench.backends.server.process import start_time
from specbench.cli import app
from specbench.models.load import resolve_model
from specbench.profile import profile_from_dict
from installed_engines import LLAMA_SERVER, needs_llama_server
from test_server import server_pids

pytestmark = needs_llama_server

PROFILE = f"""
name = "faults"
backend = "server"
[server]
engine = "llama.cpp"
binary = "{LLAMA_SERVER}"
ready_timeout_s = 120
extra_args = ["-t", "1", "-np", "2"]
[target]
model = "builtin:smollm2-135m-instruct"
[[drafts]]
name = "ngram"
method = "ngram"
[sweep]
gamma = [3]
temperature = [0.0]
[workload]
prompts = "builtin:mixed"
max_prompts = 4
max_new_tokens = 64
[run]
warmup = 1
"""


def run(folder: Path, profile: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    (folder / "p.toml").write_text(profile)
    return subprocess.run([sys.executable, "-m", "specbench.cli", "run", "p.toml", "--out", "out", *args], cwd=folder,
                          capture_output=True, text=True, timeout=timeout)


def launched_and_measuring(folder: Path, before: set[int], *, deadline_s: float = 120) -> int:
    """The pid of the first llama-server a run in `folder` launched, once it has answered a measured request."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        new = server_pids() - before
        logs = sorted((folder / "out" / "server-logs").glob("*.log")) if (folder / "out").exists() else []
        if new and logs and "stop processing" in logs[0].read_text(errors="replace"):  # the warm-up answered
            time.sleep(1.0)  # into the measured requests
            return min(new)
        time.sleep(0.1)
    raise AssertionError("no llama-server was launched and measuring")


def test_a_request_the_engine_refuses_is_a_row_and_the_point_fails_only_when_most_do(tmp_path):
    # -c 160 in the argv template (not checked up front): llama-server refuses a longer prompt with HTTP 400
    short, long = "Say hi.", "Summarise: " + "the cat sat on the mat and looked at the dog. " * 30
    for name, prompts in (("one", [short, short, short, long]), ("most", [short, long, long, long])):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
        profile = (PROFILE.split("[[drafts]]")[0].replace(f'binary = "{LLAMA_SERVER}"', f'command = ["{LLAMA_SERVER}", '
                   '"-m", "{target}", "--port", "{port}", "--metrics", "-c", "160", "-np", "1", "-t", "1"]')
                   .replace('extra_args = ["-t", "1", "-np", "2"]\n', "")
                   + '[sweep]\ngamma = [3]\ntemperature = [0.0]\n[workload]\nprompts = "prompts.jsonl"\n'
                     'max_new_tokens = 8\n[slo]\nttft_ms = 100000\n'
                   + ("[run]\nwarmup = 0\n" if name == "most" else ""))  # a warm-up as long as most: refused too
        result = run(folder, profile)
        points = pd.read_parquet(folder / "out" / "points.parquet").set_index("point_id")
        requests = pd.read_parquet(folder / "out" / "requests.parquet") if name == "one" else None
        row = points.loc["baseline-t0-p1"]
        if name == "one":
            assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
            assert (row["status"], row["n_requests"], row["failed_requests"]) == ("ok", 3, 1)
            assert row["slo_met_fraction"] == 0.75  # the refused request met no SLO
            assert row["request_errors"].startswith("1 x HTTP 400: ")
            failed = requests[requests["error"].notna()]
            assert len(failed) == 1 and failed["ttft_ms"].isna().all() and failed["prompt_id"].iloc[0] == "prompts-4"
            assert "1 of 4 requests failed (1 x HTTP 400" in " ".join(result.stdout.split())
        else:
            assert result.returncode == 1
            assert row["status"] == "failed"
            assert row["error"].startswith("PointAborted: more than 50% of the requests failed (3 of 4: 3 x HTTP 400")


def test_an_engine_stopped_mid_point_fails_that_point_within_seconds_and_the_sweep_goes_on(tmp_path):
    before = server_pids()
    (tmp_path / "p.toml").write_text(PROFILE)
    process = subprocess.Popen([sys.executable, "-m", "specbench.cli", "run", "p.toml", "--out", "out"], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stopped: list[tuple[int, float]] = []

    def stop_the_first_engine() -> None:
        pid = launched_and_measuring(tmp_path, before)
        os.kill(pid, signal.SIGSTOP)
        stopped.append((pid, time.monotonic()))

    watcher = threading.Thread(target=stop_the_first_engine)
    watcher.start()
    output, _ = process.communicate(timeout=600)
    finished = time.monotonic()
    watcher.join()
    assert stopped, output[-2000:]
    assert process.returncode == 1, output[-2000:]
    points = pd.read_parquet(tmp_path / "out" / "points.parquet").set_index("point_id")
    error = points.loc["baseline-t0-p1", "error"]
    assert error.startswith("PointAborted: no byte from the server for ") and "its process is stopped" in error
    # seen stopped after a short silence (client.STOPPED_S, then two looks a second apart), not after client.STALL_S
    silent_s = int(error.removeprefix("PointAborted: no byte from the server for ").split(" s ")[0])
    assert client.STOPPED_S <= silent_s < client.STALL_S, error
    assert points.loc["ngram-g3-t0-p1", "status"] == "ok"  # launched again, measured
    assert finished - stopped[0][1] < 180  # the stopped point failed in ~7 s, then the n-gram point ran
    assert not Path(f"/proc/{stopped[0][0]}").exists()  # the stopped engine was killed
    assert server_pids() <= before


def test_kill_9_of_specbench_takes_its_engine_and_the_next_run_ends_a_leftover(tmp_path):
    before = server_pids()
    (tmp_path / "p.toml").write_text(PROFILE)
    process = subprocess.Popen([sys.executable, "-m", "specbench.cli", "run", "p.toml", "--out", "out"], cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        engine = launched_and_measuring(tmp_path, before)
    finally:
        process.kill()  # kill -9: no handler, no atexit, no finally runs in specbench
        process.wait()
    deadline = time.monotonic() + 5
    while Path(f"/proc/{engine}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{engine}").exists(), "the engine outlived specbench's kill -9"

    # an engine an earlier run of this folder left (as one without a lifeline would): recorded, its launcher gone
    gguf = resolve_model("builtin:smollm2-135m-instruct").location
    leftover = subprocess.Popen([str(LLAMA_SERVER), "-m", gguf, "--port", "0", "-t", "1"], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, "LD_LIBRARY_PATH": str(LLAMA_SERVER.resolve().parent)})
    gone = subprocess.Popen(["true"])
    gone.wait()
    record = {"owner_pid": gone.pid, "owner_start": 1, "pgid": leftover.pid, "started": start_time(leftover.pid),
              "argv": [str(LLAMA_SERVER), "-m", gguf], "log": "server-logs/01-baseline.log"}
    (tmp_path / "out" / "server-logs" / f".engine-{gone.pid}.json").write_text(json.dumps(record))
    try:
        result = run(tmp_path, PROFILE.replace("max_prompts = 4", "max_prompts = 1"), "--fresh")
        assert leftover.wait(timeout=10) == -signal.SIGKILL
    finally:
        leftover.kill()
    output = " ".join(result.stdout.split())
    assert f"ended llama-server (process group {leftover.pid}), left running by an earlier run of this folder " \
           f"(pid {gone.pid}" in output, output[-2000:]
    assert result.returncode == 0, output[-2000:]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["server"]["ended_leftovers"][0]["pid"] == leftover.pid
    assert not list((tmp_path / "out" / "server-logs").glob(".engine-*.json"))  # nothing running, nothing recorded
    assert server_pids() <= before


@pytest.mark.parametrize(("change", "message"), [
    (('binary = "X"', 'command = ["X", "-m", "{target}", "--port", "{port}", "--alias", "{nope}"]'),
     "server.command: unknown placeholder {nope} in '{nope}'; the known placeholders are {target}, {draft}, {host}, "
     "{port} (write {{ and }} for literal braces)"),
    (('"-np", "2"]', '"-np", "2", "--port", "8080"]'),
     "server.extra_args: --port is chosen by specbench (it launches the engine on 127.0.0.1 and a free port); remove "
     "it, or start the server yourself and set server.url"),
    (("max_new_tokens = 64", "max_new_tokens = 100000"),
     "workload.max_new_tokens: 100000 new tokens after the longest prompt (252 tokens) exceed the context the engine "
     "serves, 8192 tokens (the target's max_position_embeddings); use max_new_tokens <= 7940"),
    (('"-np", "2"]', '"-np", "2", "-c", "2048"]'),
     None),  # fits: -c 2048 over 2 slots is 1024 per slot
    (('"-np", "2"]', '"-np", "4", "-c", "1200"]'),
     "workload.max_new_tokens: 64 new tokens after the longest prompt (252 tokens) exceed the context the engine "
     "serves, 300 tokens (-c 1200 shared by -np 4 slots in server.extra_args); use max_new_tokens <= 48"),
])
def test_bad_input_is_refused_before_any_engine_starts(tmp_path, monkeypatch, change, message):
    old, new = change
    profile = PROFILE.replace(old.replace("X", str(LLAMA_SERVER)), new.replace("X", str(LLAMA_SERVER)))
    if message is None:  # the refusal's counterpart: checked, not refused (the run itself is not needed)
        BACKEND.open(profile_from_dict(tomllib.loads(profile)), observer=SimpleNamespace(message=lambda text: None),
                     out_dir=tmp_path / "out").close()
        return
    before = server_pids()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.toml").write_text(profile)
    result = CliRunner().invoke(app, ["run", "p.toml", "--out", "out"])
    assert result.exit_code == 2, result.output[-2000:]
    lines = result.output.strip().splitlines()
    assert lines[-1] == f"error: p.toml: {message}" and sum(line.startswith("error") for line in lines) == 1
    assert not (tmp_path / "out").exists() and server_pids() <= before

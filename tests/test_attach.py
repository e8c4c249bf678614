"""Comparing deployments that already run, without draining them: server.url is the baseline's deployment and each
[[drafts]] table names the running deployment that serves it (`url`). Two real llama-servers here, one with n-gram
speculation: the attached comparison sends the same requests at the same loads as a launched sweep of the same
settings, and gets the same outputs and acceptance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pandas as pd
import pytest
from typer.testing import CliRunner

from installed_engines import LLAMA_SERVER, needs_llama_server
from specbench.cli import app

pytestmark = needs_llama_server

NGRAM = ["--spec-type", "ngram-simple", "--spec-draft-n-max", "3", "--spec-ngram-simple-size-n", "3",
         "--spec-ngram-simple-size-m", "3"]
COMMON = ["-t", "1", "-np", "2"]
TAIL = """[target]
model = "builtin:smollm2-135m-instruct"
[sweep]
gamma = [3]
temperature = [0.0]
concurrency = [1, 2]
[workload]
prompts = "builtin:code"
max_prompts = 2
max_new_tokens = 24
[run]
repeats = 1
warmup = 1
"""


def start(port: int, *extra: str) -> subprocess.Popen:
    from specbench.models.load import resolve_model

    gguf = resolve_model("builtin:smollm2-135m-instruct").location
    return subprocess.Popen([str(LLAMA_SERVER), "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "--metrics",
                             *COMMON, *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "LD_LIBRARY_PATH": str(LLAMA_SERVER.resolve().parent)})


def wait_healthy(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"llama-server on {port} did not start")


def run(folder, profile: str) -> pd.DataFrame:
    (folder / "p.toml").write_text(profile)
    result = subprocess.run([sys.executable, "-m", "specbench.cli", "run", "p.toml", "--out", "out"], cwd=folder,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return pd.read_parquet(folder / "out" / "requests.parquet"), pd.read_parquet(folder / "out" / "points.parquet")


def test_two_running_deployments_compared_as_a_launched_sweep_compares_them(tmp_path):
    from specbench.backends.server.process import free_port

    ports = free_port(), free_port()
    servers = [start(ports[0]), start(ports[1], *NGRAM)]
    try:
        for port in ports:
            wait_healthy(port)
        (tmp_path / "attached").mkdir()
        attached = (f'name = "live"\nbackend = "server"\n[server]\nengine = "llama.cpp"\n'
                    f'url = "http://127.0.0.1:{ports[0]}"\n[[drafts]]\nname = "ngram"\nmethod = "ngram"\n'
                    f'url = "http://127.0.0.1:{ports[1]}"\n' + TAIL)
        requests, points = run(tmp_path / "attached", attached)
        manifest = json.loads((tmp_path / "attached" / "out" / "manifest.json").read_text())
        assert all(server.poll() is None for server in servers)  # not ours to stop
    finally:
        for server in servers:
            server.kill()
            server.wait()
    (tmp_path / "launched").mkdir()
    launched = (f'name = "live"\nbackend = "server"\n[server]\nengine = "llama.cpp"\nbinary = "{LLAMA_SERVER}"\n'
                f'extra_args = {json.dumps(COMMON)}\n[[drafts]]\nname = "ngram"\nmethod = "ngram"\nngram_max = 3\n'
                + TAIL)
    launched_requests, launched_points = run(tmp_path / "launched", launched)

    assert sorted(points["point_id"]) == sorted(launched_points["point_id"]) == [
        "baseline-t0-p1", "baseline-t0-p1-c2", "ngram-g3-t0-p1", "ngram-g3-t0-p1-c2"]
    assert (points["status"] == "ok").all()
    drafted = points.set_index("point_id").loc[["ngram-g3-t0-p1", "ngram-g3-t0-p1-c2"]]
    assert drafted["speedup"].notna().all()  # over the baseline's deployment, at the same load
    assert (drafted["engine_draft_tokens"] > 0).all() and drafted["acceptance_source"].notna().all()
    # the same requests, and with greedy decoding the same outputs, as the launched sweep of the same settings
    key = ["point_id", "request_id"]
    mine = requests.sort_values(key).set_index(key)
    theirs = launched_requests.sort_values(key).set_index(key)
    assert list(mine.index) == list(theirs.index)
    assert (mine["output_sha"] == theirs["output_sha"]).all()
    assert manifest["server"]["launches"] == []
    assert manifest["server"]["deployments"] == {"ngram": f"http://127.0.0.1:{ports[1]}"}
    assert set(manifest["server"]["reports"]) == {"baseline", "ngram"}


@pytest.mark.parametrize(("profile", "message"), [
    ('[server]\nengine = "llama.cpp"\nurl = "http://127.0.0.1:9"\n[[drafts]]\nname = "ngram"\nmethod = "ngram"\n',
     "drafts[0].url: required with server.url: the url of the running deployment that serves this draft (nothing "
     "is launched)"),
    (f'[server]\nengine = "llama.cpp"\nbinary = "{LLAMA_SERVER}"\n[[drafts]]\nname = "ngram"\nmethod = "ngram"\n'
     'url = "http://127.0.0.1:9"\n',
     "drafts[0].url: used with server.url, the baseline's running deployment: set server.url, or remove url to let "
     "specbench launch this draft"),
    ('[server]\nengine = "llama.cpp"\nurl = "http://127.0.0.1:9"\n[[drafts]]\nname = "ngram"\nmethod = "ngram"\n'
     'url = "http://127.0.0.1:10"\ngamma = [1, 3]\n',
     "drafts[0].gamma: a running deployment drafts at one gamma: set gamma = [N] to the one it runs"),
    ('[server]\nengine = "llama.cpp"\nurl = "http://127.0.0.1:9"\n[[drafts]]\nname = "ngram"\nmethod = "ngram"\n'
     'url = "http://127.0.0.1:10"\n',
     "drafts[0].url: http://127.0.0.1:10 does not answer"),
])
def test_bad_attached_deployments_are_one_line_and_write_nothing(tmp_path, monkeypatch, profile, message):
    (tmp_path / "p.toml").write_text('name = "live"\nbackend = "server"\n' + profile
                                     + TAIL.replace("url = ", "").replace("server.url = ", ""))
    monkeypatch.chdir(tmp_path)
    if "does not answer" in message:  # the baseline's url answers: another llama-server; the draft's does not
        from specbench.backends.server.process import free_port

        port = free_port()
        server = start(port)
        (tmp_path / "p.toml").write_text((tmp_path / "p.toml").read_text().replace("127.0.0.1:9\"", f"127.0.0.1:{port}\""))
        try:
            wait_healthy(port)
            result = CliRunner().invoke(app, ["run", "p.toml", "--out", "out"])
        finally:
            server.kill()
            server.wait()
        assert result.output.strip().splitlines()[-1].startswith(f"error: p.toml: {message}"), result.output[-1000:]
    else:
        result = CliRunner().invoke(app, ["run", "p.toml", "--out", "out"])
        assert result.output.strip().splitlines()[-1] == f"error: p.toml: {message}"
    assert result.exit_code == 2
    assert not (tmp_path / "out").exists()

"""A launched engine's temporary files go with it. vLLM keeps its ZeroMQ sockets (ipc://TMP/UUID) in the folder
VLLM_RPC_BASE_PATH names, /tmp by default, and leaves them there when it is killed: a tune of hundreds of launches
would leave hundreds of sockets. Each launch gets a scratch folder of its own, removed when the engine ends: stopped,
specbench killed with kill -9 (by the engine's lifeline), or ended as a leftover by the next run of its folder.
The engine here is a real process that binds a Unix socket where the variable points, as vLLM does. These tests make
their scratch folders in a temporary folder of their own (tests/test_server_vllm.py looks for any left in /tmp)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from specbench.backends.server.process import ServerProcess, end_leftovers, free_port, start_time

# binds ipc-like sockets in $VLLM_RPC_BASE_PATH, says where (and what it sees of SPECBENCH_SCRATCH), then serves on
ENGINE = """
import json, os, socket, sys, time, uuid
base = os.environ["VLLM_RPC_BASE_PATH"]
bound = []
for _ in range(2):
    server = socket.socket(socket.AF_UNIX)
    server.bind(os.path.join(base, str(uuid.uuid4())))
    bound.append(server)
with open(sys.argv[1] + ".tmp", "w") as out:
    json.dump({"base": base, "sockets": [s.getsockname() for s in bound],
               "scratch_seen": os.environ.get("SPECBENCH_SCRATCH")}, out)
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)
"""


@pytest.fixture(autouse=True)
def temporary(monkeypatch, tmp_path):  # tmp_path first: pytest makes it in the real temporary folder
    """A temporary folder of this test's, short: a Unix socket's path holds at most 107 bytes."""
    folder = tempfile.mkdtemp(prefix="sb-")
    monkeypatch.setattr(tempfile, "tempdir", folder)
    monkeypatch.setenv("TMPDIR", folder)  # and the launcher's, killed with kill -9
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


def _engine(tmp_path: Path, **options) -> tuple[ServerProcess, dict]:
    said = tmp_path / "said.json"
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "engine.py").write_text(ENGINE)
    server = ServerProcess([sys.executable, str(tmp_path / "engine.py"), str(said)],
                           log_path=tmp_path / "logs" / "01.log", port=free_port(), **options).start()
    return server, _read(said, server)


def _read(said: Path, server: ServerProcess | None = None) -> dict:
    deadline = time.monotonic() + 30
    while not said.exists():
        assert time.monotonic() < deadline, (server.log_path.read_text() if server else "no engine output")
        time.sleep(0.05)
    return json.loads(said.read_text())


def test_each_launch_gets_a_scratch_folder_of_its_own_removed_when_it_stops(tmp_path, temporary):
    first, said = _engine(tmp_path / "a", scratch_env=("VLLM_RPC_BASE_PATH",))
    second, said_too = _engine(tmp_path / "b", scratch_env=("VLLM_RPC_BASE_PATH",))
    try:
        scratch = Path(said["base"])
        assert scratch == first.scratch and scratch.parent == temporary
        assert scratch.name.startswith("specbench-engine-") and Path(said_too["base"]) != scratch
        assert all(Path(path).is_socket() and Path(path).parent == scratch for path in said["sockets"])
        assert said["scratch_seen"] is None  # the lifeline's, not passed on to the engine
        assert json.loads(first.record_path.read_text())["scratch"] == str(scratch)
    finally:
        first.stop(grace_s=2)
        second.stop(grace_s=2)
    assert not scratch.exists() and not Path(said_too["base"]).exists()


def test_a_folder_the_profile_or_the_environment_names_is_the_engines_and_kept(tmp_path, temporary, monkeypatch):
    mine = temporary / "mine"
    mine.mkdir()
    server, said = _engine(tmp_path, env={"VLLM_RPC_BASE_PATH": str(mine)}, scratch_env=("VLLM_RPC_BASE_PATH",))
    server.stop(grace_s=2)
    assert said["base"] == str(mine) and server.scratch is None and mine.is_dir()
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(mine))
    server, said = _engine(tmp_path / "env", scratch_env=("VLLM_RPC_BASE_PATH",))
    server.stop(grace_s=2)
    assert said["base"] == str(mine) and server.scratch is None and mine.is_dir()


LAUNCHER = """
import sys, time
from pathlib import Path
from specbench.backends.server.process import ServerProcess, free_port
folder = Path(sys.argv[1])
server = ServerProcess([sys.executable, sys.argv[2], str(folder / "said.json")], log_path=folder / "logs" / "01.log",
                       port=free_port(), scratch_env=("VLLM_RPC_BASE_PATH",)).start()
time.sleep(120)
"""


def test_kill_9_of_specbench_takes_the_engine_and_its_scratch_folder(tmp_path, temporary):
    (tmp_path / "engine.py").write_text(ENGINE)
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path), str(tmp_path / "engine.py")],
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        said = _read(tmp_path / "said.json")
        record = json.loads(next(tmp_path.joinpath("logs").glob(".engine-*.json")).read_text())
        assert Path(said["base"]).parent == temporary and record["scratch"] == said["base"]
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    deadline = time.monotonic() + 10
    while (start_time(record["pgid"]) is not None or Path(said["base"]).exists()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert start_time(record["pgid"]) is None, "the engine outlived specbench"
    assert not Path(said["base"]).exists(), "its scratch folder outlived it"


def test_a_leftover_engines_scratch_folder_is_removed_with_it_and_a_running_launchers_is_kept(tmp_path):
    live_owner = subprocess.Popen(["sleep", "60"])
    engines = []
    try:
        for owner in (live_owner, None):
            engine = subprocess.Popen(["sleep", "60"], start_new_session=True)
            scratch = Path(tempfile.mkdtemp(prefix="specbench-engine-"))
            with socket.socket(socket.AF_UNIX) as bound:
                bound.bind(str(scratch / "ipc"))
            owner_pid = owner.pid if owner is not None else engine.pid + 100000  # a launcher that is gone
            record = {"owner_pid": owner_pid, "owner_start": start_time(owner.pid) if owner else 1, "pgid": engine.pid,
                      "started": start_time(engine.pid), "argv": ["sleep", "60"], "log": "l", "scratch": str(scratch)}
            (tmp_path / f".engine-{owner_pid}.json").write_text(json.dumps(record))
            engines.append((engine, scratch))
        (kept, kept_scratch), (orphan, orphan_scratch) = engines
        assert [ended["pid"] for ended in end_leftovers(tmp_path)] == [orphan.pid]
        assert orphan.wait(5) == -signal.SIGKILL and not orphan_scratch.exists()
        assert kept.poll() is None and (kept_scratch / "ipc").is_socket()
    finally:
        for process in [live_owner, *(engine for engine, _ in engines)]:
            process.kill()
            process.wait()
        for _, scratch in engines:
            shutil.rmtree(scratch, ignore_errors=True)

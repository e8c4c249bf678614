"""One launched serving engine: started from an argv list (never a shell) in its own process group on
127.0.0.1 and a free port, with its output in a log file; ready once its health endpoint and model list
answer; stopped — the whole group terminated, then killed — on any exit of specbench: normal, an
exception, Ctrl-C or SIGTERM; and killed with its group by its lifeline (`lifeline.py`) when specbench is
killed outright (kill -9). Each launch is recorded in the run's folder while it runs, so a run of the same folder
finds and ends an engine an earlier run left behind (`end_leftovers`). No server is ever left behind, nor the files it
keeps in a temporary folder: where the engine names that folder by an environment variable (vLLM's IPC sockets,
`VLLM_RPC_BASE_PATH`), each launch gets a scratch folder of its own, removed when the engine ends."""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from specbench.backends.server import client
from specbench.core import progress as liveness

HOST = "127.0.0.1"
LIFELINE = Path(__file__).with_name("lifeline.py")
RECORD_GLOB = ".engine-*.json"  # beside the launch logs, while an engine runs: who launched it, which process it is
_RUNNING: set["ServerProcess"] = set()  # stopped at exit and on SIGTERM
_HANDLERS_INSTALLED = False


class ServerFailed(RuntimeError):
    """The server did not become ready, or died; the message ends with the tail of its log."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def log_tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip()[:200] for line in text[-lines:])


class ServerProcess:
    def __init__(self, argv: Sequence[str], *, log_path: Path, env: dict[str, str] | None = None, port: int,
                 scratch_env: Sequence[str] = ()):
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env or {})
        self.port = port
        # the variables that point the engine's temporary files at a folder; unless already set, at this launch's own
        self.scratch_env = [name for name in scratch_env if name not in self.env and name not in os.environ]
        self.scratch: Path | None = None
        self.url = f"http://{HOST}:{port}"
        self.process: subprocess.Popen | None = None  # the lifeline, leader of the engine's process group
        self._lifeline: int | None = None  # the pipe end whose closing (specbench gone) ends the group
        self._engine: int | None = None  # the engine's pid (the lifeline's child)
        self.record_path = log_path.parent / f".engine-{os.getpid()}.json"

    def start(self) -> "ServerProcess":
        _install_handlers()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.scratch_env:  # short, in the temporary folder: a Unix socket's path holds at most 107 bytes
            self.scratch = Path(tempfile.mkdtemp(prefix="specbench-engine-"))
            self.env.update({name: str(self.scratch) for name in self.scratch_env}, SPECBENCH_SCRATCH=str(self.scratch))
        watched, self._lifeline = os.pipe()  # both ends close-on-exec: only the lifeline inherits its end
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen([sys.executable, "-I", "-S", str(LIFELINE), str(watched), *self.argv],
                                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env={**os.environ, **self.env}, start_new_session=True,
                                            pass_fds=(watched,))
        os.close(watched)
        _RUNNING.add(self)
        record = {"owner_pid": os.getpid(), "owner_start": start_time(os.getpid()), "pgid": self.process.pid,
                  "started": start_time(self.process.pid), "argv": self.argv, "log": str(self.log_path),
                  "scratch": str(self.scratch) if self.scratch else None}
        self.record_path.write_text(json.dumps(record))
        return self

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        """Whether the engine runs: its lifeline has not exited, and the engine under it is not dead (a killed engine
        is a zombie, then gone, a moment before its lifeline reaps it and exits)."""
        if self.process is None or self.process.poll() is not None:
            return False
        if self._engine is None:  # the lifeline's child, once it has started it
            self._engine = next((pid for pid in self.descendants() if pid != self.pid), None)
        if self._engine is None:
            return True
        try:
            return Path(f"/proc/{self._engine}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except (OSError, IndexError):
            return False

    def exit_code(self, *, wait_s: float = 2.0) -> int | None:
        """The engine's exit status (its lifeline's, which exits with it), waiting up to `wait_s` for it."""
        try:
            return self.process.wait(timeout=wait_s) if self.process is not None else None
        except subprocess.TimeoutExpired:
            return None

    def wait_ready(self, *, timeout_s: float, health_path: str = "/health") -> None:
        """Poll the health endpoint, then the model list, until both answer or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            liveness.mark()  # a launch that is still coming up is progress (bounded by timeout_s)
            if not self.alive():
                raise ServerFailed(f"the server exited with code {self.exit_code()} before it was ready; "
                                   f"log {self.log_path}: {log_tail(self.log_path)}")
            if self._answers(health_path) and self._answers("/v1/models"):
                return
            time.sleep(0.5)
        self.stop()
        raise ServerFailed(f"the server was not ready after {timeout_s:g} s (raise server.ready_timeout_s?); "
                           f"log {self.log_path}: {log_tail(self.log_path)}")

    def _answers(self, path: str) -> bool:
        try:
            status, _ = asyncio.run(client.get_text(self.url + path, timeout_s=2.0))
        except Exception:  # noqa: BLE001 - refused, reset or timed out: not up yet
            return False
        return status == 200

    def descendants(self) -> list[int]:
        """The server's process tree (it may fork workers), from /proc."""
        if self.pid is None:
            return []
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
        tree, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo += children.get(pid, [])
        return tree

    def engine_pids(self) -> list[int]:
        """The engine's process tree without its lifeline (what its memory is measured over)."""
        return [pid for pid in self.descendants() if pid != self.pid]

    def progress(self) -> tuple[bool, int]:
        """Whether any process of the engine is stopped (SIGSTOP, a debugger), and the CPU time its tree has used
        (clock ticks): a hung engine is stopped, or uses none."""
        stopped, ticks = False, 0
        for pid in self.engine_pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            stopped |= fields[0] in ("T", "t")
            ticks += int(fields[11]) + int(fields[12])  # utime + stime
        return stopped, ticks

    def stop(self, *, grace_s: float = 10.0) -> None:
        """SIGTERM to the whole process group (and SIGCONT, so a stopped engine gets to answer it), then SIGKILL
        to whatever is left after `grace_s`."""
        _RUNNING.discard(self)
        if self.process is None:
            return
        for sent in (signal.SIGTERM, signal.SIGCONT) if grace_s > 0 else ():
            try:
                os.killpg(self.process.pid, sent)
            except ProcessLookupError:
                pass
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # workers that outlived their parent, too
        except ProcessLookupError:
            pass
        self.process.wait()
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        self.record_path.unlink(missing_ok=True)

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_time(pid: int) -> int | None:
    """When a process started (clock ticks after boot, /proc/PID/stat): with its pid, what tells it from a later
    process that reuses the pid."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def group_members(pgid: int) -> list[int]:
    """The processes of a process group, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                    members.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return members


def end_leftovers(folder: Path) -> list[dict]:
    """End the engines an earlier run of this folder launched and left running (it was killed outright, and its
    engine outlived it); returns what was ended (argv, pid, log). An engine is this folder's leftover when its
    record's launcher has exited and its process group still runs: its leader with the recorded start time, or,
    the leader gone, members still in its group (a group id is not reused while the group has members). Records
    of engines that are gone are removed; those of launchers still running (another worker on this folder) kept."""
    ended = []
    for path in sorted(folder.glob(RECORD_GLOB)):
        try:
            record = json.loads(path.read_text())
            owner, pgid = int(record["owner_pid"]), int(record["pgid"])
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)
            continue
        if start_time(owner) is not None and start_time(owner) == record.get("owner_start"):
            continue  # its launcher still runs: not a leftover
        leader = start_time(pgid)
        members = group_members(pgid) if leader is None or leader == record.get("started") else []
        if members:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            ended.append({"argv": record.get("argv"), "pid": pgid, "log": record.get("log"),
                          "launched_by_pid": owner})
        if isinstance(record.get("scratch"), str) and Path(record["scratch"]).name.startswith("specbench-engine-"):
            shutil.rmtree(record["scratch"], ignore_errors=True)
        path.unlink(missing_ok=True)
    return ended


def stop_all() -> None:
    for server in list(_RUNNING):
        server.stop(grace_s=5.0)


def _install_handlers() -> None:
    """At exit, and on SIGTERM (which would otherwise end Python without running `finally` blocks), stop
    every server this process launched."""
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(stop_all)
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame):
        stop_all()
        if callable(previous) and previous not in (signal.SIG_DFL, signal.SIG_IGN):
            previous(signum, frame)
        raise SystemExit(128 + signum)

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread: atexit still covers normal exits
        pass


def peak_rss_mb(pids: list[int]) -> float | None:
    """The sum of the processes' peak resident memory (VmHWM) in MiB; None when /proc cannot tell."""
    total_kb, seen = 0, False
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total_kb += int(line.split()[1])
                    seen = True
        except OSError:
            continue
    return total_kb / 1024 if seen else None


def reset_peak_rss(pids: list[int]) -> None:
    for pid in pids:
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        except OSError:
            pass

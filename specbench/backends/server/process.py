"""One launched serving engine: started from an argv list (never a shell) in its own process group on
127.0.0.1 and a free port, with its output in a log file; ready once its health endpoint and model list
answer; stopped — the whole group terminated, then killed — on any exit of specbench: normal, an
exception, Ctrl-C or SIGTERM. No server is ever left behind."""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from specbench.backends.server import client

HOST = "127.0.0.1"
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
    def __init__(self, argv: Sequence[str], *, log_path: Path, env: dict[str, str] | None = None, port: int):
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> "ServerProcess":
        _install_handlers()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env={**os.environ, **(self.env or {})}, start_new_session=True)
        _RUNNING.add(self)
        return self

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, *, timeout_s: float, health_path: str = "/health") -> None:
        """Poll the health endpoint, then the model list, until both answer or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServerFailed(f"the server exited with code {self.process.returncode} before it was ready; "
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

    def stop(self, *, grace_s: float = 10.0) -> None:
        """SIGTERM to the whole process group, then SIGKILL to whatever is left after `grace_s`."""
        _RUNNING.discard(self)
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
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

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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

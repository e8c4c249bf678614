"""Where the real serving engines are (made by `make engines`), and the markers every test that runs one carries:
`llama_cpp` (llama.cpp's llama-server binary) and `vllm` (vLLM's CPU build). conftest.py skips a marked test where
its engine is not installed and adds up what the marked tests cost against tests/budget.toml."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
LLAMA_SERVER = Path(os.environ.get("SPECBENCH_LLAMA_SERVER", ROOT / ".engines" / "llama-server"))
VLLM_PYTHON = Path(os.environ.get("SPECBENCH_VLLM_PYTHON", ROOT / ".engines" / "vllm" / "bin" / "python"))

needs_llama_server = pytest.mark.llama_cpp
needs_vllm = pytest.mark.vllm

MISSING = {
    "llama_cpp": (LLAMA_SERVER, f"no llama-server at {LLAMA_SERVER} (make engine-llama.cpp builds it)"),
    "vllm": (VLLM_PYTHON, f"no vLLM at {VLLM_PYTHON} (make engine-vllm installs it)"),
}


def missing_engine(markers: set[str]) -> str | None:
    """Why a test with these markers cannot run here, or None."""
    for name in sorted(markers & MISSING.keys()):
        path, reason = MISSING[name]
        if not os.access(path, os.X_OK):
            return reason
    return None


WORKER = "PYTEST_XDIST_WORKER"  # set by pytest-xdist in each worker; inherited by what its tests start


def processes_running(marker: bytes) -> set[int]:
    """The pids of processes (other than this one) whose executable path, as started, contains `marker` and that
    this test worker started: `make test` runs the vLLM tests and the llama.cpp tests on two workers at once, so a
    check that no engine is left behind looks at its own worker's engines (they inherit the worker's
    PYTEST_XDIST_WORKER through specbench) and not at those the other worker runs meanwhile."""
    mine = f"{WORKER}={os.environ.get(WORKER, '')}".encode()
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "cmdline").read_bytes().split(b"\0")[0] and _worker_entry(entry) == mine:
                    pids.add(int(entry.name))
            except OSError:
                continue
    return pids


def _worker_entry(process: Path) -> bytes:
    """WORKER=VALUE as the process's environment has it ("WORKER=" where it has none)."""
    prefix = f"{WORKER}=".encode()
    return next((item for item in (process / "environ").read_bytes().split(b"\0") if item.startswith(prefix)), prefix)

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


def processes_running(marker: bytes) -> set[int]:
    """The pids of processes (other than this one) whose executable path, as started, contains `marker`."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "cmdline").read_bytes().split(b"\0")[0]:
                    pids.add(int(entry.name))
            except OSError:
                continue
    return pids

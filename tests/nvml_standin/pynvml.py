"""A stand-in for NVIDIA's `pynvml` (nvidia-ml-py) on a machine without a GPU: the calls specbench makes
(core/gpus.py `Nvml`), answered for a box of GPUs whose processes are real processes of this machine. Put its folder
first on PYTHONPATH; specbench and every worker process it spawns then import it as NVML.

A process is on GPU i when its environment carries this box's token (SPECBENCH_NVML_STANDIN) and a
CUDA_VISIBLE_DEVICES that lists i (as a launch pinned there has), and it is not a Python process (specbench's own
workers and an engine's lifeline carry the variables without touching a GPU): a launched llama-server, or a `sleep`
started by a test as another team's job. What it holds is its resident memory. The box's settings, from the environment:

- SPECBENCH_NVML_STANDIN: the token (required: the box exists only where it is set)
- SPECBENCH_NVML_STANDIN_GPUS: how many GPUs (default 8)
- SPECBENCH_NVML_STANDIN_PIDS: "own" (NVML numbers processes as this machine does), "host" (as a container's host
  does: every pid shifted by HOST_PID_OFFSET, as in a pod whose pid namespace NVML does not see), "none" (NVML
  lists no process, as some container runtimes give)
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

HOST_PID_OFFSET = 7_000_000  # above Linux's largest pid: a host number no process here has
BASE_USED_MB = 600.0  # what a GPU uses with no process on it (driver, ECC)
TOTAL_MB = 81559.0
NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2


class NVMLError(Exception):
    pass


def _gpus() -> int:
    return int(os.environ.get("SPECBENCH_NVML_STANDIN_GPUS", "8"))


def _uuid(index: int) -> str:
    return f"GPU-{index:08x}-5a4d-4e1f-9c3b-standin00000"


def nvmlInit() -> None:
    if not os.environ.get("SPECBENCH_NVML_STANDIN"):
        raise NVMLError("NVML stand-in: SPECBENCH_NVML_STANDIN is not set")


def nvmlSystemGetDriverVersion() -> str:
    return "580.65.06"


def nvmlSystemGetCudaDriverVersion() -> int:
    return 13000


def nvmlDeviceGetCount() -> int:
    return _gpus()


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if not 0 <= index < _gpus():
        raise NVMLError(f"no GPU {index}")
    return index


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> int:
    text = uuid.decode() if isinstance(uuid, bytes) else uuid
    for index in range(_gpus()):
        if _uuid(index) == text:
            return index
    raise NVMLError(f"no GPU {text}")


def nvmlDeviceGetUUID(handle: int) -> str:
    return _uuid(handle)


def nvmlDeviceGetName(handle: int) -> str:
    return "NVIDIA H100 80GB HBM3"


def nvmlDeviceGetMigMode(handle: int) -> tuple[int, int]:
    return 0, 0


def nvmlDeviceGetEnforcedPowerLimit(handle: int) -> int:
    return 700_000


def nvmlDeviceGetMaxClockInfo(handle: int, clock: int) -> int:
    return 1980 if clock == NVML_CLOCK_SM else 2619


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    return SimpleNamespace(gpu=50, memory=20)


def nvmlDeviceGetTotalEnergyConsumption(handle: int) -> int:
    return int(time.monotonic() * 100_000)  # mJ at 100 W


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    used = (BASE_USED_MB + sum(mb for _, mb in _on_gpu(handle))) * 2**20
    return SimpleNamespace(total=TOTAL_MB * 2**20, used=used, free=TOTAL_MB * 2**20 - used)


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[SimpleNamespace]:
    mode = os.environ.get("SPECBENCH_NVML_STANDIN_PIDS", "own")
    if mode == "none":
        return []
    offset = HOST_PID_OFFSET if mode == "host" else 0
    return [SimpleNamespace(pid=pid + offset, usedGpuMemory=int(mb * 2**20)) for pid, mb in _on_gpu(handle)]


def _on_gpu(index: int) -> list[tuple[int, float]]:
    """(pid, resident MiB) of this box's non-Python processes pinned to GPU `index`."""
    token = os.environ["SPECBENCH_NVML_STANDIN"].encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            environ = dict(item.split(b"=", 1) for item in (entry / "environ").read_bytes().split(b"\0") if b"=" in item)
            status = (entry / "status").read_text()
        except (OSError, ValueError):
            continue
        if comm.startswith("python") or environ.get(b"SPECBENCH_NVML_STANDIN") != token:
            continue
        visible = environ.get(b"CUDA_VISIBLE_DEVICES", b"").decode()
        if str(index) not in [part.strip() for part in visible.split(",")]:
            continue
        rss_kb = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        found.append((int(entry.name), max(rss_kb / 1024, 1.0)))
    return found

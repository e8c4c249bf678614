"""Which GPUs a launched engine runs on, and waiting for them to be free again.

A launch takes `server.tensor_parallel` GPUs from `server.gpus` (default: every GPU this process sees), pinned with
CUDA_VISIBLE_DEVICES (and CUDA_DEVICE_ORDER=PCI_BUS_ID, so indices mean what nvidia-smi shows); `--workers N` hands
worker i the i-th disjoint group (scaleout/workers.py), so each worker's engine sees only its own. What cannot be
placed is refused in one line before anything launches. After an engine is stopped, the next launch waits, with a
deadline, until every process of the old engine is gone and none of them holds memory on the group's GPUs (told apart
as its launch's claim found them: in a container NVML's pids are the host's, core/gpus.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from specbench.core import gpus
from specbench.profile.server import ServerSpec

RELEASE_TIMEOUT_S = 120.0  # a stopped engine's GPU memory is back within this, or the next launch fails
RELEASE_SLACK_MB = 1024.0  # judged by used memory alone (NVML lists no process): back within this of before the launch
GIB = 2**30


def candidates(settings: ServerSpec, machine: Sequence[gpus.Gpu], *, where: str = "") -> list[gpus.Gpu]:
    """The GPUs a launch may take: `server.gpus` (each must be visible) or every visible one; none on a machine without
    GPUs, where asking for any is refused."""
    asked = settings.gpus is not None or settings.tensor_parallel > 1
    if not machine:
        if asked:
            key = "gpus" if settings.gpus is not None else "tensor_parallel"
            raise gpus.GpuError(f"{where}server.{key}: no NVIDIA GPU is visible here (NVML found none): run on the "
                                f"GPU machine, or remove server.{key} to serve on the CPU")
        return []
    if settings.gpus is None:
        return list(machine)
    shown = {gpu.index: gpu for gpu in machine}
    missing = [index for index in settings.gpus if index not in shown]
    if missing:
        raise gpus.GpuError(f"{where}server.gpus: GPU {', '.join(map(str, missing))} "
                            f"{'is' if len(missing) == 1 else 'are'} not visible here (visible: "
                            f"{', '.join(str(g.index) for g in machine)}); list visible GPUs or check "
                            "CUDA_VISIBLE_DEVICES")
    return [shown[index] for index in settings.gpus]


def launch_group(settings: ServerSpec, machine: Sequence[gpus.Gpu], *, where: str = "") -> tuple[gpus.Gpu, ...]:
    """The GPUs one launch runs on: the first `tensor_parallel` candidates; () on a CPU machine."""
    pool = candidates(settings, machine, where=where)
    if not pool:
        return ()
    if settings.tensor_parallel > len(pool):
        raise gpus.GpuError(f"{where}server.tensor_parallel: {settings.tensor_parallel} GPUs per launch, but "
                            f"{len(pool)} {'is' if len(pool) == 1 else 'are'} available "
                            f"({', '.join(str(g.index) for g in pool)}); lower tensor_parallel")
    return tuple(pool[:settings.tensor_parallel])


def worker_groups(settings: ServerSpec, machine: Sequence[gpus.Gpu], *, workers: int,
                  where: str = "") -> list[tuple[gpus.Gpu, ...]]:
    """A disjoint group of `tensor_parallel` GPUs per worker; [] on a CPU machine (the workers share the CPU)."""
    pool = candidates(settings, machine, where=where)
    if not pool:
        return []
    try:
        return gpus.groups(pool, size=settings.tensor_parallel, count=workers)
    except gpus.GpuError as error:
        raise gpus.GpuError(f"{where}--workers {workers}: {error}; use fewer workers or a smaller "
                            "server.tensor_parallel") from None


def launch_env(group: Sequence[gpus.Gpu]) -> dict[str, str]:
    """The environment that pins a launch to `group` (nothing on a CPU machine)."""
    return {"CUDA_VISIBLE_DEVICES": gpus.device_list(group), **gpus.PCI_ORDER} if group else {}


def model_bytes(path: str | None) -> int | None:
    """The weights' size of a local model (a GGUF file, or a folder's weight files); None when not local."""
    if path is None or not os.path.exists(path):
        return None
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, name)) for name in files
                     if name.endswith((".safetensors", ".bin", ".gguf", ".pt")))
    return total or None


def ready_timeout_s(configured: float | None, weights: Sequence[int | None]) -> float:
    """How long a launch may take to answer: `server.ready_timeout_s`, else 300 s plus 30 s per GiB of weights
    (reading them, compiling, capturing CUDA graphs: a 16 GiB 8B model gets 13 minutes), 900 s when a model's size is
    unknown (a hub id: its first download too)."""
    if configured is not None:
        return configured
    if any(size is None for size in weights):
        return 900.0
    return 300.0 + 30.0 * sum(weights) / GIB


def wait_released(pids: Sequence[int], group: Sequence[gpus.Gpu], *, alive: Callable[[int], bool],
                  nvml: gpus.Nvml | None, claim: gpus.Claim | None = None, timeout_s: float = RELEASE_TIMEOUT_S,
                  poll_s: float = 0.5) -> None:
    """Wait until none of a stopped engine's `pids` runs and none of its processes holds memory on `group`'s GPUs:
    its processes as its launch's `claim` tells them (in a container, NVML's numbers are not `pids`), or where NVML
    listed none of them, until each GPU uses no more than before the launch (RELEASE_SLACK_MB over). GpuError naming
    what is still held after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    old = set(pids)
    listed = claim.engine_pids(old) if claim is not None else old
    by_memory = claim is not None and claim.match is None
    while True:
        running = sorted(pid for pid in old if alive(pid))
        holding: dict[str, float] = {}
        for sample in (nvml.sample([gpu.uuid for gpu in group]) if nvml is not None and group else []):
            if by_memory:
                grown = (sample.memory_used_mb or 0.0) - (claim.used_before_mb.get(sample.uuid) or 0.0)
                if sample.memory_used_mb is not None and grown > RELEASE_SLACK_MB:
                    holding[sample.uuid] = grown
            elif any(pid in listed for pid in sample.process_memory_mb):
                holding[sample.uuid] = sum(mb or 0.0 for pid, mb in sample.process_memory_mb.items() if pid in listed)
        if not running and not holding:
            return
        if time.monotonic() >= deadline:
            what = []
            if running:
                what.append(f"process(es) {', '.join(map(str, running[:5]))} still run")
            if holding:
                indices = {gpu.uuid: gpu.index for gpu in group}
                what.append(("its GPUs still use more than before it launched: " if by_memory else "it still holds ")
                            + ", ".join(f"{mb:.0f} MiB on GPU {indices.get(uuid, uuid)}"
                                        for uuid, mb in holding.items()))
            raise gpus.GpuError(f"the previous engine was stopped {timeout_s:g} s ago, but {' and '.join(what)}: "
                                "the next launch would not get its memory (kill it, then run again)")
        time.sleep(poll_s)


def pid_alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False

"""Local worker processes for `specbench run --workers N` and `specbench tune --workers N`.

Each worker is a spawned process (CUDA does not survive a fork) that runs `target(plan, index)`, pinned through
CUDA_VISIBLE_DEVICES to GPUs of its own: where the profile's backend runs models in this process and the profile is
not on the cpu, one visible GPU each (more workers than GPUs are refused; `device = "cuda:N"` shares GPU N on
purpose); on the server backend, a disjoint group of `server.tensor_parallel` GPUs each, which its engines run on
(backends/server/placement.py), with its profile narrowed to them (`server.gpus` = its group, whatever the profile
listed: the others' GPUs are not visible to it). Every worker's GPUs are settled before any starts: too few is one
line. On the cpu, in-process workers split the cores between them (torch.set_num_threads). A worker that fails sends its error's one line back; the launcher raises WorkerError naming the worker.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.queues import SimpleQueue
from typing import Protocol, TypeVar

from specbench.backends import get_backend
from specbench.backends.server import placement
from specbench.core import gpus as gpu_facts
from specbench.core.errors import OneLineError, one_line
from specbench.profile import Profile, with_overrides


class WorkerError(OneLineError, RuntimeError):
    """A local worker process failed; the message is one line: which worker, and why."""


class WorkerPlan(Protocol):
    """A dataclass a worker receives (pickled): what it runs, with the profile it runs it on."""

    profile: Profile


class WorkerObserver(Protocol):
    def message(self, text: str) -> None: ...


PlanT = TypeVar("PlanT", bound=WorkerPlan)


def run_workers(target: Callable[[PlanT, int], None], plan: PlanT, *, workers: int,
                observer: WorkerObserver) -> None:
    """Run `target(plan, index)` for each index in 0..workers-1, each in its own process, and wait for all.
    `target` must be a module-level function (the spawned process imports it). Raises WorkerError when a
    worker failed."""
    slots = worker_slots(plan.profile, workers=workers)
    local = get_backend(plan.profile.backend).pins_local_devices
    threads = max(1, (os.cpu_count() or 1) // workers) if local and slots[0].visible is None else 0
    context = multiprocessing.get_context("spawn")
    errors = context.SimpleQueue()  # (index, the error's one line) from each worker that raised
    processes = []
    saved = {name: os.environ.get(name) for name in ("CUDA_VISIBLE_DEVICES", *gpu_facts.PCI_ORDER)}
    try:
        for index, slot in enumerate(slots):
            if slot.visible is not None:  # inherited by the process started now
                os.environ["CUDA_VISIBLE_DEVICES"] = slot.visible
                if not local:  # NVML's indices, as the engines' launches take them
                    os.environ.update(gpu_facts.PCI_ORDER)
            worker_plan = replace(plan, profile=slot.profile) if slot.profile is not plan.profile else plan
            process = context.Process(target=_worker_main, args=(target, worker_plan, index, threads, errors),
                                      name=f"specbench-worker-{index}")
            process.start()
            processes.append(process)
            observer.message(f"worker {index} started (pid {process.pid})"
                             + (f" on GPU {slot.visible}" if slot.visible is not None else ""))
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    for process in processes:
        process.join()
    reasons = {}
    while not errors.empty():
        index, reason = errors.get()
        reasons[index] = reason
    failed = [index for index, process in enumerate(processes) if process.exitcode != 0]
    if failed:
        first = failed[0]
        others = failed[1:]
        also = f" (worker{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} failed too)" if others else ""
        reason = reasons.get(first) or _exit_reason(processes[first].exitcode)
        raise WorkerError(f"worker {first} of {workers} failed: {reason}{also}")


@dataclass(frozen=True)
class Slot:
    """What one worker runs with: its CUDA_VISIBLE_DEVICES (None: the launcher's, inherited) and its profile."""

    visible: str | None
    profile: Profile


def worker_slots(profile: Profile, *, workers: int) -> list[Slot]:
    """Each worker's GPUs and profile, settled before any worker starts (WorkerError or GpuError, one line, where the
    GPUs do not go round): in-process, one visible GPU each (device "cuda" inside); on the server backend, a disjoint
    group of server.tensor_parallel GPUs each, and server.gpus narrowed to it, so that its launches find it visible."""
    if get_backend(profile.backend).pins_local_devices:
        gpus = worker_gpus(profile.device, workers=workers)
        if not gpus:
            return [Slot(None, profile)] * workers
        on_gpu = with_overrides(profile, device="cuda")
        return [Slot(gpus[index % len(gpus)], on_gpu) for index in range(workers)]
    groups = server_groups(profile, workers=workers)
    if not groups:
        return [Slot(None, profile)] * workers
    return [Slot(gpu_facts.device_list(group),
                 with_overrides(profile, server_gpus=tuple(gpu.index for gpu in group))) for group in groups]


def _worker_main(target: Callable[[PlanT, int], None], plan: PlanT, index: int, threads: int,
                 errors: SimpleQueue) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)
    try:
        target(plan, index)
    except Exception as error:  # noqa: BLE001 - reported to the launcher as one line
        if not isinstance(error, ValueError):  # bad input (a ValueError) is its one line; a bug keeps its traceback
            traceback.print_exc()
        errors.put((index, one_line(error)))
        sys.exit(1)


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"


def worker_gpus(device: str, *, workers: int = 1, visible: list[str] | None = None) -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries the in-process workers take in turn: none on the cpu; for cuda:N only the
    N-th visible GPU (every worker shares it, as asked); otherwise one visible GPU each (none on a machine without),
    more workers than GPUs refused."""
    if device == "cpu":
        return []
    visible = _visible_gpus() if visible is None else visible
    if device.startswith("cuda:"):
        index = int(device.removeprefix("cuda:"))
        if index >= len(visible):
            raise WorkerError(f"device {device}: only {len(visible)} GPU(s) are visible; use cuda:0.."
                              f"{max(len(visible) - 1, 0)}, or cuda to spread the workers over all of them")
        return [visible[index]]
    if visible and workers > len(visible):
        raise WorkerError(f"--workers {workers}: one GPU per worker, but {len(visible)} "
                          f"{'is' if len(visible) == 1 else 'are'} visible; use --workers {len(visible)} or fewer "
                          f"(or device = \"cuda:N\" to share one GPU on purpose)")
    return visible[:workers]


def server_groups(profile: Profile, *, workers: int) -> list[tuple[gpu_facts.Gpu, ...]]:
    """A disjoint group of server.tensor_parallel GPUs per worker of the server backend, from server.gpus (or every
    visible GPU); none on a CPU machine or for an attached server."""
    if profile.server is None or profile.server.url is not None:
        return []
    where = f"{profile.source}: " if profile.source else ""
    machine = gpu_facts.machine_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"))
    return placement.worker_groups(profile.server, machine, workers=workers, where=where)


def _visible_gpus() -> list[str]:
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(torch.cuda.device_count()))))
    return [gpu.strip() for gpu in visible.split(",") if gpu.strip()]

"""Local worker processes for `specbench run --workers N` and `specbench tune --workers N`.

Each worker is a spawned process (CUDA does not survive a fork) that runs `target(plan, index)`. Where the
profile's backend runs models in this process and the profile is not on the cpu, each worker sees one GPU, round robin over the visible ones, through
CUDA_VISIBLE_DEVICES; on the cpu, the workers split the cores between them (torch.set_num_threads).
A worker that fails sends its error's one line back; the launcher raises WorkerError naming the worker.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.queues import SimpleQueue
from typing import Protocol, TypeVar

from specbench.backends import get_backend
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
    local = get_backend(plan.profile.backend).pins_local_devices
    gpus = worker_gpus(plan.profile.device) if local else []
    threads = max(1, (os.cpu_count() or 1) // workers) if local and not gpus else 0
    context = multiprocessing.get_context("spawn")
    errors = context.SimpleQueue()  # (index, the error's one line) from each worker that raised
    processes = []
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        for index in range(workers):
            worker_plan = plan
            if gpus:
                os.environ["CUDA_VISIBLE_DEVICES"] = gpus[index % len(gpus)]  # inherited by the process started now
                worker_plan = replace(plan, profile=with_overrides(plan.profile, device="cuda"))
            process = context.Process(target=_worker_main, args=(target, worker_plan, index, threads, errors),
                                      name=f"specbench-worker-{index}")
            process.start()
            processes.append(process)
            observer.message(f"worker {index} started (pid {process.pid})"
                             + (f" on GPU {os.environ['CUDA_VISIBLE_DEVICES']}" if gpus else ""))
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
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


def worker_gpus(device: str) -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries the workers take in turn: none on the cpu; for cuda:N only the
    N-th visible GPU (every worker shares it); otherwise every visible GPU (none on a machine without)."""
    if device == "cpu":
        return []
    visible = _visible_gpus()
    if device.startswith("cuda:"):
        index = int(device.removeprefix("cuda:"))
        if index >= len(visible):
            raise WorkerError(f"device {device}: only {len(visible)} GPU(s) are visible; use cuda:0.."
                              f"{max(len(visible) - 1, 0)}, or cuda to spread the workers over all of them")
        return [visible[index]]
    return visible


def _visible_gpus() -> list[str]:
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(torch.cuda.device_count()))))
    return [gpu.strip() for gpu in visible.split(",") if gpu.strip()]

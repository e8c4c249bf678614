"""`specbench run --workers N`: N processes of this machine (one per visible GPU where there are GPUs) share one sweep
and its output folder. The launch groups (every point one engine launch serves; in-process, every point of one
configuration) are handed out in plan order from a counter the workers share, so each launch happens in one worker;
every worker writes into the folder under its file lock, and the last write computes every speedup against the
folder's one baseline (one machine, so comparable). What each worker's sweep does (loading, each point started and
finished, each request) is relayed to the launcher's observer, so a job log shows every worker's points as one
process's would. A worker that dies leaves its launch group's remaining points
unrecorded: the run fails naming the worker, and running it again resumes them. Across machines, a sweep is split
with `--shard I/N` instead (each shard its own folder and baselines, `specbench merge` joins them)."""

from __future__ import annotations

import multiprocessing
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbench.core import results
from specbench.core.manifest import MANIFEST_FILE, read_manifest
from specbench.profile import Profile
from specbench.scaleout.workers import run_workers, worker_slots
from specbench.sweep.capacity import by_launch
from specbench.sweep.context import open_run
from specbench.sweep.files import RunFiles
from specbench.core.results import PointSpec
from specbench.sweep.loop import RunResult, SilentObserver, SweepObserver, evaluate_point, n_requests, planned_points


@dataclass(frozen=True)
class LocalPlan:
    """What each worker receives (pickled as it is spawned, the shared counters with it)."""

    profile: Profile
    out_dir: Path
    next_launch: Any  # multiprocessing.Value: the index of the next launch group to hand out
    opened: Any  # multiprocessing.Value: whether a worker has opened the folder for this run
    events: Any  # multiprocessing.SimpleQueue: (worker, observer method, arguments), relayed to the launcher's observer


def run_local(profile: Profile, *, out_dir: Path, workers: int, fresh: bool = False,
              observer: SweepObserver | None = None) -> RunResult:
    """Run (or resume) `profile` into `out_dir` with `workers` local processes."""
    observer = observer or SilentObserver()
    worker_slots(profile, workers=workers)  # GPUs that do not go round are one line before anything is removed
    if fresh:
        for name in (results.REQUESTS_FILE, results.POINTS_FILE, MANIFEST_FILE):
            (out_dir / name).unlink(missing_ok=True)
    context = multiprocessing.get_context("spawn")
    plan = LocalPlan(profile, out_dir, context.Value("i", 0), context.Value("b", False), context.SimpleQueue())
    relay = threading.Thread(target=_relay, args=(plan.events, observer), name="specbench-worker-events", daemon=True)
    relay.start()
    try:
        run_workers(_worker_main, plan, workers=workers, observer=observer)
    finally:
        plan.events.put(None)
        relay.join()
    files = RunFiles(out_dir)
    points, requests = files.read()
    return RunResult(out_dir, points, requests, read_manifest(files.manifest_path))


def _worker_main(plan: LocalPlan, index: int) -> None:
    observer = WorkerEvents(plan.events, index)
    ctx = open_run(plan.profile, observer=observer, out_dir=plan.out_dir)
    try:
        planned = planned_points(ctx)
        files = RunFiles(plan.out_dir)
        with files.lock("open"), plan.opened.get_lock():  # the first worker checks and opens the folder, once
            if not plan.opened.value:
                earlier = files.open(ctx, planned, fresh=False)
                plan.opened.value = True
                observer.sweep_started(planned + earlier, [spec for spec in planned if files.recorded(spec, ctx) is None])
        launches = by_launch(planned, ctx.backend.launch_key)
        while (taken := _take(plan)) < len(launches):
            for spec in launches[taken]:
                with files.lock():
                    done = files.recorded(spec, ctx) is not None
                if not done:
                    observer.point_started(spec, n_requests(ctx, spec))
                    points = files.record(spec, ctx, evaluate_point(spec, ctx, observer=observer), order=planned)
                    observer.point_finished(spec, points[points["point_id"] == spec.point_id].iloc[0].to_dict())
        points = files.record(None, ctx, order=planned)  # every speedup against the folder's baseline
        files.finish(points, ctx)
    finally:
        ctx.session.close()


class WorkerEvents:
    """A worker's sweep observer: each call sent to the launcher (its messages marked with the worker)."""

    def __init__(self, events: Any, index: int):
        self.events, self.index = events, index

    def _send(self, method: str, *args: Any) -> None:
        self.events.put((method, args))

    def sweep_started(self, points: list[PointSpec], to_run: list[PointSpec]) -> None:
        self._send("sweep_started", points, to_run)

    def point_started(self, spec: PointSpec, n_requests: int) -> None:
        self._send("point_started", spec, n_requests)

    def request_done(self, spec: PointSpec) -> None:
        self._send("request_done", spec)

    def point_finished(self, spec: PointSpec, row: dict[str, Any]) -> None:
        self._send("point_finished", spec, row)

    def message(self, text: str) -> None:
        self._send("message", f"worker {self.index}: {text}")


def _relay(events: Any, observer: SweepObserver) -> None:
    """The launcher's side: each worker's observer calls, in the order they arrive, until None. A display that fails
    is not worth a sweep: the events are still drained (a full pipe would block the workers)."""
    while (event := events.get()) is not None:
        method, args = event
        try:
            getattr(observer, method)(*args)
        except Exception:  # noqa: BLE001 - see above
            continue


def _take(plan: LocalPlan) -> int:
    with plan.next_launch.get_lock():
        taken = plan.next_launch.value
        plan.next_launch.value += 1
    return taken

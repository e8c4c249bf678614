"""`specbench run --workers N`: N processes of this machine (one per visible GPU where there are GPUs) share one sweep
and its output folder. The launch groups (every point one engine launch serves; in-process, every point of one
configuration) are handed out in plan order from a counter the workers share, so each launch happens in one worker;
every worker writes into the folder under its file lock, and the last write computes every speedup against the
folder's one baseline (one machine, so comparable). A worker that dies leaves its launch group's remaining points
unrecorded: the run fails naming the worker, and running it again resumes them. Across machines, a sweep is split
with `--shard I/N` instead (each shard its own folder and baselines, `specbench merge` joins them)."""

from __future__ import annotations

import multiprocessing
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
from specbench.sweep.loop import RunResult, SilentObserver, SweepObserver, evaluate_point, planned_points


@dataclass(frozen=True)
class LocalPlan:
    """What each worker receives (pickled as it is spawned, the shared counters with it)."""

    profile: Profile
    out_dir: Path
    next_launch: Any  # multiprocessing.Value: the index of the next launch group to hand out
    opened: Any  # multiprocessing.Value: whether a worker has opened the folder for this run


def run_local(profile: Profile, *, out_dir: Path, workers: int, fresh: bool = False,
              observer: SweepObserver | None = None) -> RunResult:
    """Run (or resume) `profile` into `out_dir` with `workers` local processes."""
    observer = observer or SilentObserver()
    worker_slots(profile, workers=workers)  # GPUs that do not go round are one line before anything is removed
    if fresh:
        for name in (results.REQUESTS_FILE, results.POINTS_FILE, MANIFEST_FILE):
            (out_dir / name).unlink(missing_ok=True)
    context = multiprocessing.get_context("spawn")
    plan = LocalPlan(profile, out_dir, context.Value("i", 0), context.Value("b", False))
    run_workers(_worker_main, plan, workers=workers, observer=observer)
    files = RunFiles(out_dir)
    points, requests = files.read()
    return RunResult(out_dir, points, requests, read_manifest(files.manifest_path))


def _worker_main(plan: LocalPlan, index: int) -> None:
    ctx = open_run(plan.profile, observer=SilentObserver(), out_dir=plan.out_dir)
    try:
        planned = planned_points(ctx)
        files = RunFiles(plan.out_dir)
        with files.lock("open"), plan.opened.get_lock():  # the first worker checks and opens the folder, once
            if not plan.opened.value:
                files.open(ctx, planned, fresh=False)
                plan.opened.value = True
        launches = by_launch(planned, ctx.backend.launch_key)
        while (taken := _take(plan)) < len(launches):
            for spec in launches[taken]:
                with files.lock():
                    done = files.recorded(spec, ctx) is not None
                if not done:
                    files.record(spec, ctx, evaluate_point(spec, ctx), order=planned)
        points = files.record(None, ctx, order=planned)  # every speedup against the folder's baseline
        files.finish(points, ctx)
    finally:
        ctx.session.close()


def _take(plan: LocalPlan) -> int:
    with plan.next_launch.get_lock():
        taken = plan.next_launch.value
        plan.next_launch.value += 1
    return taken

"""The sweep loop of `specbench run` in one process: plan the points through the backend, run each one not
yet recorded, record it (or its failure) before the next; a point that raises is recorded as failed and
the sweep goes on."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from specbench.core.manifest import Manifest
from specbench.backends import AfterPrompt
from specbench.core.contention import ConditionsProbe
from specbench.core.errors import one_line
from specbench.profile import Profile
from specbench.core.results import PointSpec
from specbench.capacity.document import CapacityDocument
from specbench.sweep.capacity import CapacitySearch, by_launch
from specbench.sweep.context import RunContext, open_run
from specbench.sweep.files import RunFiles
from specbench.sweep.plan import plan_points
from specbench.sweep.point import PointRun, SilentObserver, SweepObserver
from specbench.sweep.shard import Shard, shard_points


@dataclass
class RunResult:
    out_dir: Path
    points: pd.DataFrame
    requests: pd.DataFrame
    manifest: Manifest
    ran: list[str] = field(default_factory=list)  # point ids run by this call (the others were resumed)
    capacity: CapacityDocument | None = None  # capacity.json, where the profile asks for a capacity search
    capacity_probes: list[str] = field(default_factory=list)  # the points it added to the sweep's

    @property
    def failed(self) -> int:
        return int((self.points["status"] == "failed").sum()) if len(self.points) else 0

    @property
    def capacity_not_found(self) -> int:
        """Capacity searches that found no capacity (not bracketed, or failed)."""
        return sum(not entry.found for entry in self.capacity.configurations) if self.capacity else 0


def planned_points(ctx: RunContext) -> list[PointSpec]:
    return plan_points(ctx.profile, launch_key=ctx.backend.launch_key)


def run_sweep(profile: Profile, *, out_dir: Path, fresh: bool = False, observer: SweepObserver | None = None,
              shard: Shard | None = None) -> RunResult:
    """Run (or resume) every point of `profile` into `out_dir`; with `shard`, its baselines and its share of the
    rest (specbench.sweep.shard)."""
    observer = observer or SilentObserver()
    files = RunFiles(out_dir)
    files.check_shard(shard, fresh=fresh)  # before anything loads: a folder of another shard is not resumed
    ctx = open_run(profile, observer=observer, out_dir=out_dir)
    try:
        planned = planned_points(ctx)
        if shard is not None:
            planned = shard_points(planned, ctx.backend.launch_key, shard)
        earlier = files.open(ctx, planned, fresh=fresh, shard=shard)
        specs = planned + earlier  # points of an earlier, wider sweep of the same run stay in the files
        to_run = [spec for spec in planned if files.recorded(spec, ctx) is None]
        observer.sweep_started(specs, to_run)

        ran: list[str] = []
        capacity = (CapacitySearch(ctx, files, observer, order=planned, evaluate=evaluate_point)
                    if profile.capacity is not None else None)
        for launch in by_launch(planned, ctx.backend.launch_key):  # a capacity search while the launch is up
            for spec in (spec for spec in launch if spec in to_run):
                observer.point_started(spec, n_requests(ctx, spec))
                points = files.record(spec, ctx, evaluate_point(spec, ctx, observer=observer), order=planned)
                ran.append(spec.point_id)
                observer.point_finished(spec, points[points["point_id"] == spec.point_id].iloc[0].to_dict())
            if capacity is not None:
                capacity.search(launch)
        if capacity is not None:  # [capacity] repeats: every search again, the launches in turn (A B, B A, A B, ...)
            launches = by_launch(planned, ctx.backend.launch_key)
            for repeat in range(1, profile.capacity.repeats):
                for launch in reversed(launches) if repeat % 2 else launches:
                    capacity.search(launch, repeat=repeat)

        points = files.record(None, ctx, order=planned)
        found = capacity.finish() if capacity is not None else None
        manifest = files.finish(points, ctx)
    finally:
        ctx.session.close()
    _, requests = files.read()
    return RunResult(out_dir, points, requests, manifest, ran, found, capacity.probe_points if capacity else [])


def n_requests(ctx: RunContext, spec: PointSpec | None = None) -> int:
    """Requests a point sends: every prompt x repeat; at a request rate, `load.requests` where given."""
    every = len(ctx.session.prompts) * ctx.profile.run.repeats
    return (ctx.profile.load.requests or every) if spec is not None and spec.open_loop else every


def evaluate_point(spec: PointSpec, ctx: RunContext, *, observer: SweepObserver | None = None,
                   after_prompt: AfterPrompt | None = None) -> PointRun:
    """Run one point: its request rows, or no rows and the one-line reason it failed, and how much other
    processes used the machine meanwhile. `after_prompt` sees the rows so far after each prompt's repeats;
    an exception it raises that is not an `Exception` (a pruned trial, an interrupt) stops the point and
    propagates."""
    observer = observer or SilentObserver()
    rows, error = [], None
    with ConditionsProbe(ctx.session.own_pids, gpus=ctx.session.gpu_uuids, claimed=ctx.session.gpu_claimed) as probe:
        try:
            rows = ctx.session.run_point(spec, point_key=ctx.point_key(spec),
                                         on_request=lambda: observer.request_done(spec), after_prompt=after_prompt)
        except Exception as failure:  # noqa: BLE001 - a failed point is data, not a crash
            error = one_line(failure)
    measured = ctx.session.point_measurements() if error is None else {}
    return PointRun(rows, error, {**probe.conditions.as_dict(), **measured})

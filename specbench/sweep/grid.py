"""`specbench run --storage/--study/--workers`: one grid sweep shared by processes on any number of machines.

The planned points are the choices of one Optuna study. A process asks for a trial (the storage numbers
trials atomically), proposes the first planned point no trial has claimed yet, and runs it only if the
claim rule (`specbench.scaleout.claims`) gives the point to this trial; otherwise the trial ends as a
duplicate and the process asks again. So no point runs twice, and each is written once to the run's
files (RunFiles, under a file lock: machines that share an output folder need a filesystem whose file
locks work across machines). A worker that dies mid-point stops sending heartbeats; a worker on any
machine then fails its trial and runs the point.

No trial is enqueued: Optuna hands out an enqueued (WAITING) trial with a read then an update, which on
SQLite two processes can both win; a trial created by `ask` belongs to one process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from specbench.core.manifest import MANIFEST_FILE, read_manifest
from specbench.core import results
from specbench.profile import Profile
from specbench.core.results import PointSpec, stable_hash
from specbench.sweep.context import RunContext, open_run
from specbench.sweep.files import RunFiles
from specbench.sweep.loop import (
    PointRun, RunResult, SilentObserver, SweepObserver, evaluate_point, n_requests, planned_points,
)
from specbench.scaleout.claims import claims, verdict
from specbench.scaleout.liveness import (
    Heartbeat, asked, fail_stale_trials, new_worker_id, others_running, release, wait_for_others,
)
from specbench.scaleout.storage import (
    ScaleOutError, check_study, delete_study, open_storage, open_study, quiet_optuna, storage_url,
)
from specbench.scaleout.workers import run_workers

PARAM = "point_id"


@dataclass(frozen=True)
class GridPlan:
    """What a worker needs; picklable, so local worker processes receive it."""

    profile: Profile
    out_dir: Path
    storage_url: str
    study: str


def run_grid(profile: Profile, *, out_dir: Path, storage: str | None = None, study: str | None = None,
             workers: int = 1, fresh: bool = False, observer: SweepObserver | None = None) -> RunResult:
    """Run (or join) the sweep of `profile` shared through the study `study` (default: <profile name>-run)
    in `storage` (default: study.db in `out_dir`). A storage that cannot be opened raises ScaleOutError
    before anything is written."""
    if workers < 1:
        raise ScaleOutError(f"--workers: must be an integer >= 1 (got {workers})")
    observer = observer or SilentObserver()
    url = storage_url(storage, out_dir)
    if storage is None:
        out_dir.mkdir(parents=True, exist_ok=True)  # the default SQLite file lives there
    store = open_storage(url)
    plan = GridPlan(profile, out_dir, url, study or f"{profile.name}-run")
    if fresh:
        delete_study(store, plan.study)
        for name in (results.REQUESTS_FILE, results.POINTS_FILE, MANIFEST_FILE):
            (out_dir / name).unlink(missing_ok=True)
    if workers == 1:
        return work(plan, observer=observer)
    run_workers(_worker_main, plan, workers=workers, observer=observer)
    files = RunFiles(out_dir)
    points, requests = files.read()
    return RunResult(out_dir, points, requests, read_manifest(files.manifest_path))


def work(plan: GridPlan, *, observer: SweepObserver) -> RunResult:
    """One worker: claim and run points until every planned point is claimed and no other worker's point is
    still running (a point whose worker dies is taken up)."""
    quiet_optuna()
    ctx = open_run(plan.profile, observer=observer, out_dir=plan.out_dir)
    try:
        return _work(plan, ctx, observer=observer)
    finally:
        ctx.session.close()


def _work(plan: GridPlan, ctx: RunContext, *, observer: SweepObserver) -> RunResult:
    planned = planned_points(ctx)
    by_id = {spec.point_id: spec for spec in planned}
    attrs = {"run_key": ctx.run_key, "grid": stable_hash({spec.point_id: ctx.point_key(spec) for spec in planned})}
    storage = open_storage(plan.storage_url)
    check_study(storage, plan.study, attrs)
    study = open_study(storage, plan.study, attrs, directions=["maximize"], sampler=_FirstUnclaimed(list(by_id)),
                       pruner=optuna.pruners.NopPruner())
    files = RunFiles(plan.out_dir)
    earlier = files.open(ctx, planned, fresh=False)
    worker = new_worker_id()
    fail_stale_trials(study, storage, worker=worker)
    held = _claimed(study)
    observer.sweep_started(planned + earlier, [spec for spec in planned if spec.point_id not in held])

    ran: list[str] = []
    while True:
        trial = _claim_next(study, storage, list(by_id), worker=worker)
        if trial is None:
            if not others_running(study, storage, worker=worker):
                break
            wait_for_others(study, storage, worker=worker)
            continue
        spec = by_id[trial.params[PARAM]]
        with Heartbeat(study, storage, trial):
            row = _run_claimed(study, trial, spec, ctx, files, planned, observer=observer)
        if row is not None:
            ran.append(spec.point_id)
            observer.point_finished(spec, row)

    _keep_failures(study, files, ctx, by_id, planned)
    points = files.record(None, ctx, order=planned)
    manifest = files.finish(points, ctx)
    _, requests = files.read()
    return RunResult(plan.out_dir, points, requests, manifest, ran)


def _run_claimed(study: optuna.Study, trial: optuna.Trial, spec: PointSpec, ctx: RunContext, files: RunFiles,
                 planned: list[PointSpec], *, observer: SweepObserver) -> dict | None:
    """Run the claimed point and tell the study; None when the files already held it."""
    with files.lock():  # a read between another process's write and rename would see half a file
        done = files.recorded(spec, ctx) is not None
    if done:  # by an earlier run into this folder
        trial.set_user_attr("resumed", True)
        study.tell(trial, _value(_row(files.record(None, ctx, order=planned), spec)))
        return None
    observer.point_started(spec, n_requests(ctx, spec))
    run = evaluate_point(spec, ctx, observer=observer)
    row = _row(files.record(spec, ctx, run, order=planned), spec)
    if run.error is not None:
        trial.set_user_attr("error", run.error)  # a failed point keeps its claim: it is not rerun
        study.tell(trial, state=TrialState.FAIL)
    else:
        study.tell(trial, _value(row))
    return row


class _FirstUnclaimed(optuna.samplers.BaseSampler):
    """Proposes the first planned point that no trial holds, by the claim rule."""

    def __init__(self, point_ids: list[str]):
        self.point_ids = point_ids

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        held = _claimed(study)
        return next((p for p in self.point_ids if p not in held), self.point_ids[0])


def _claim_next(study: optuna.Study, storage: BaseStorage, point_ids: list[str], *, worker: str) -> optuna.Trial | None:
    """A trial that holds an unclaimed point, or None once every point is claimed."""
    while set(point_ids) - _claimed(study):
        trial = asked(study, storage)
        try:
            trial.set_user_attr("worker", worker)
            trial.suggest_categorical(PARAM, point_ids)
            if verdict(study, trial, budget=None) == "run":
                return trial
            trial.set_user_attr("role", "duplicate")
            study.tell(trial, state=TrialState.FAIL)
        except BaseException:
            release(study, storage, trial)
            raise
    return None


def _claimed(study: optuna.Study) -> set[str]:
    return {dict(point)[PARAM] for point in claims(study.get_trials(deepcopy=False), budget=None).points}


def _keep_failures(study: optuna.Study, files: RunFiles, ctx: RunContext, by_id: dict[str, PointSpec],
                   planned: list[PointSpec]) -> None:
    """A worker that opens the folder after a point failed drops that failure from the files (resume reruns
    failed points); the study keeps it, so write it back."""
    points, _ = files.read()
    listed = set(points["point_id"]) if points is not None else set()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        point_id = trial.params.get(PARAM)
        if "error" in trial.user_attrs and point_id in by_id and point_id not in listed:
            files.record(by_id[point_id], ctx, PointRun([], trial.user_attrs["error"], {}), order=planned)


def _row(points, spec: PointSpec) -> dict:
    return points[points["point_id"] == spec.point_id].iloc[0].to_dict()


def _value(row: dict) -> float:
    """The trial's value: the point's tokens/s (the study only shares the work; nothing is optimised)."""
    value = float(row.get("tokens_per_s") or 0.0)
    return value if math.isfinite(value) else 0.0


def _worker_main(plan: GridPlan, index: int) -> None:
    work(plan, observer=SilentObserver())

"""`specbench run --storage/--study/--workers`: one grid sweep shared by processes on any number of machines.

The planned points are the choices of one Optuna study. A process asks for a trial (the storage numbers
trials atomically), proposes the first planned point no trial has claimed yet, and runs it only if the
claim rule of `specbench.tune.study` gives the point to this trial; otherwise the trial ends as a
duplicate and the process asks again. So no point runs twice, and each is written once to the run's
files (RunFiles, under a file lock: machines that share an output folder need a filesystem whose file
locks work across machines).

No trial is enqueued: Optuna hands out an enqueued (WAITING) trial with a read then an update, which on
SQLite two processes can both win; a trial created by `ask` belongs to one process.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import optuna
import pandas as pd
from optuna.trial import TrialState

from specbench import results
from specbench.profile import Profile
from specbench.results import PointSpec
from specbench.sweep import RunFiles, RunResult, SweepObserver, _Silent, evaluate_point, plan_points, point_key, prepare
from specbench.tune.space import TuneError
from specbench.tune.study import (
    check_study, claims, fail_stale_trials, new_worker_id, open_storage, open_study, storage_url, verdict,
)
from specbench.workers import run_workers

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
    in `storage` (default: study.db in `out_dir`). A storage that cannot be opened raises TuneError before
    anything is written."""
    if workers < 1:
        raise TuneError(f"--workers: must be an integer >= 1 (got {workers})")
    observer = observer or _Silent()
    url = storage_url(storage, out_dir)
    if storage is None:
        out_dir.mkdir(parents=True, exist_ok=True)  # the default SQLite file lives there
    store = open_storage(url)
    plan = GridPlan(profile, out_dir, url, study or f"{profile.name}-run")
    if fresh:
        _clear(plan, store)
    if workers == 1:
        return work(plan, observer=observer)
    run_workers(_worker_main, plan, workers=workers, observer=observer)
    return _read_result(out_dir)


def work(plan: GridPlan, *, observer: SweepObserver) -> RunResult:
    """One worker: claim and run points until every planned point is claimed."""
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ctx = prepare(plan.profile, observer=observer)
    planned = plan_points(plan.profile)
    by_id = {spec.point_id: spec for spec in planned}
    attrs = {"run_key": ctx.run_key, "grid": _hash({spec.point_id: point_key(spec, ctx) for spec in planned})}
    storage = open_storage(plan.storage_url)
    check_study(storage, plan.study, attrs)
    study = open_study(storage, plan.study, attrs, directions=["maximize"], sampler=_FirstUnclaimed(list(by_id)),
                       pruner=optuna.pruners.NopPruner())
    files = RunFiles(plan.out_dir)
    earlier = files.open(ctx, planned, fresh=False)
    worker = new_worker_id()
    fail_stale_trials(study, worker=worker)
    held = _claimed(study)
    observer.sweep_started(planned + earlier, [spec for spec in planned if spec.point_id not in held])

    ran: list[str] = []
    while (trial := _claim_next(study, list(by_id), worker=worker)) is not None:
        spec = by_id[trial.params[PARAM]]
        try:
            with files.lock():  # a read between another process's write and rename would see half a file
                done = files.recorded(spec, ctx) is not None
            if done:  # by an earlier run into this folder
                trial.set_user_attr("resumed", True)
                study.tell(trial, _value(_row(files.record(None, ctx, [], order=planned), spec)))
                continue
            observer.point_started(spec, len(ctx.prompts) * plan.profile.run.repeats)
            rows, error = evaluate_point(spec, ctx, observer=observer)
            row = _row(files.record(spec, ctx, rows, error=error, order=planned), spec)
            if error is not None:
                trial.set_user_attr("error", error)  # a failed point keeps its claim: it is not rerun
                study.tell(trial, state=TrialState.FAIL)
            else:
                study.tell(trial, _value(row))
        except BaseException:
            _release(study, trial)
            raise
        ran.append(spec.point_id)
        observer.point_finished(spec, row)

    _keep_failures(study, files, ctx, by_id, planned)
    points = files.record(None, ctx, [], order=planned)
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    manifest = files.finish(points) if not running else json.loads(files.manifest_path.read_text())
    with files.lock():
        requests = results.read_parquet(plan.out_dir / results.REQUESTS_FILE)
    return RunResult(plan.out_dir, points, requests if requests is not None else pd.DataFrame(), manifest, ran)


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



def _claim_next(study: optuna.Study, point_ids: list[str], *, worker: str) -> optuna.Trial | None:
    """A trial that holds an unclaimed point, or None once every point is claimed."""
    while set(point_ids) - _claimed(study):
        trial = study.ask()
        try:
            trial.set_user_attr("worker", worker)
            trial.suggest_categorical(PARAM, point_ids)
            if verdict(study, trial, budget=None) == "run":
                return trial
            trial.set_user_attr("role", "duplicate")
            study.tell(trial, state=TrialState.FAIL)
        except BaseException:
            _release(study, trial)
            raise
    return None


def _claimed(study: optuna.Study) -> set[str]:
    return {dict(point)[PARAM] for point in claims(study.get_trials(deepcopy=False), budget=None).points}


def _release(study: optuna.Study, trial: optuna.Trial) -> None:
    """An interrupted trial gives its point back."""
    if study._storage.get_trial(trial._trial_id).state == TrialState.RUNNING:
        trial.set_user_attr("role", "interrupted")
        study.tell(trial, state=TrialState.FAIL)


def _keep_failures(study: optuna.Study, files: RunFiles, ctx, by_id: dict[str, PointSpec],
                   planned: list[PointSpec]) -> None:
    """A worker that opens the folder after a point failed drops that failure from the files (resume reruns
    failed points); the study keeps it, so write it back."""
    with files.lock():
        points = results.read_parquet(files.out_dir / results.POINTS_FILE)
    listed = set(points["point_id"]) if points is not None else set()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        point_id = trial.params.get(PARAM)
        if "error" in trial.user_attrs and point_id in by_id and point_id not in listed:
            files.record(by_id[point_id], ctx, [], error=trial.user_attrs["error"], order=planned)


def _row(points, spec: PointSpec) -> dict:
    return points[points["point_id"] == spec.point_id].iloc[0].to_dict()


def _value(row: dict) -> float:
    """The trial's value: the point's tokens/s (the study only shares the work; nothing is optimised)."""
    value = float(row.get("tokens_per_s") or 0.0)
    return value if math.isfinite(value) else 0.0


def _hash(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _clear(plan: GridPlan, storage) -> None:
    """--fresh: drop the study and the run's files."""
    try:
        optuna.delete_study(study_name=plan.study, storage=storage)
    except KeyError:
        pass  # not created yet
    for name in (results.REQUESTS_FILE, results.POINTS_FILE, results.MANIFEST_FILE):
        (plan.out_dir / name).unlink(missing_ok=True)


def _worker_main(plan: GridPlan, index: int) -> None:
    work(plan, observer=_Silent())


def _read_result(out_dir: Path) -> RunResult:
    with RunFiles(out_dir).lock():
        points = results.read_parquet(out_dir / results.POINTS_FILE)
        requests = results.read_parquet(out_dir / results.REQUESTS_FILE)
    manifest = json.loads((out_dir / results.MANIFEST_FILE).read_text())
    return RunResult(out_dir, points, requests if requests is not None else pd.DataFrame(), manifest)

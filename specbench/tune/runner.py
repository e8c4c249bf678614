"""`specbench tune`: plan the studies, run the search in one or more workers, write what it found.

One study per temperature (and top_p). A worker measures the baseline, then runs Optuna's optimisation loop on the
study (`tune.shared`): each trial runs the first point of the queue of `propose` that no trial holds (one calibration
point per draft at the largest gamma, then the configurations the analytic model predicts best), else what the seeded
TPE sampler proposes, or the untried configuration nearest to it when that one is held already. Workers in any number
of processes and machines share a study through an RDB storage (PostgreSQL across machines): no point run twice, the
budget exact, a trial whose worker died retried elsewhere, the verification run once.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import optuna
import pandas as pd
from optuna.storages import BaseStorage

from specbench.core.manifest import MANIFEST_FILE
from specbench.core import results
from specbench.profile import Profile
from specbench.sweep import RunFiles
from specbench.sweep.context import open_run
from specbench.sweep.loop import SilentObserver
from specbench.core import progress
from specbench.core.host import host_name
from specbench.scaleout.storage import open_storage, open_study, quiet_optuna
from specbench.scaleout.workers import run_workers, worker_slots
from specbench.tune import outputs
from specbench.tune.capacity import capacity_search, run_capacity_trial, search_baseline
from specbench.tune.evaluate import Evaluator, Live, Pruned, Replay
from specbench.tune.load import IDENTITY_COLUMNS, level_entry, mix_value
from specbench.tune.measure import NotMeasured, measure
from specbench.tune.plan import Group, Plan, TuneResult, TuneSettings, clear, make_plan
from specbench.tune.propose import QueueFirst, held_points, record_warm_start
from specbench.tune.shared import PointFailed, fix_point, host_key, optimize, verify_once
from specbench.tune.verify import VERIFY_DIR, VerifyProgress, skip_reason, verify
from specbench.tune.warmstart import calibrate


class TuneObserver(Protocol):
    def message(self, text: str) -> None: ...
    def trial_finished(self, study: str, row: dict[str, Any]) -> None: ...


def tune(profile: Profile | None, *, out_dir: Path, settings: TuneSettings, replay: Path | None = None,
         observer: TuneObserver | None = None) -> TuneResult:
    """Tune `profile` (or the profile of the recording `replay`) into `out_dir`; resumes the studies
    found in the storage. Bad input raises TuneError before anything is written."""
    observer = observer or SilentObserver()
    plan = make_plan(profile, out_dir=out_dir, settings=settings, replay=replay)
    if settings.workers > 1:
        worker_slots(plan.profile, workers=settings.workers)  # GPUs that do not go round: one line, nothing cleared
    if settings.fresh:
        clear(plan)
    out_dir.mkdir(parents=True, exist_ok=True)
    if plan.warm_start_unavailable is not None and settings.warm_start > 0:
        observer.message(f"warm start: {plan.warm_start_unavailable}; the search starts from TPE after the "
                         "calibration points")
    if settings.workers == 1:
        work(plan, worker_index=0, observer=observer)
    else:
        run_workers(_worker_main, plan, workers=settings.workers, observer=observer)
    result = finish(plan)
    if skip_reason(plan) is not None:
        return verify(plan, result, observer=VerifyProgress(observer))
    verified: dict[str, TuneResult] = {}

    def run_verification() -> None:
        observer.message("verifying the recommendation: launching it at every load level beside the single setting "
                         f"and the baseline (into {plan.out_dir / VERIFY_DIR})")
        verified["result"] = verify(plan, result, observer=VerifyProgress(observer))

    holder = verify_once(open_storage(plan.storage_url), f"{plan.groups[0].study}-verification",
                         worker=worker_id(0), run=run_verification)
    if holder is not None:
        observer.message(f"verification: run once for the study, by worker {holder} (into its own output folder)")
        return verify(plan, result, observer=VerifyProgress(observer), elsewhere=holder)
    return verified["result"]


def _worker_main(plan: Plan, index: int) -> None:
    work(plan, worker_index=index, observer=SilentObserver())


def worker_id(index: int) -> str:
    """host:pid/index, stored with each trial: where it ran."""
    import os

    return f"{host_name()}:{os.getpid()}/{index}"


def work(plan: Plan, *, worker_index: int, observer: TuneObserver) -> None:
    """One worker: every study of the plan, until each has its trials and no trial of any worker runs or waits."""
    quiet_optuna()
    progress.mark()
    worker = worker_id(worker_index)
    evaluator = _evaluator(plan, observer)
    storage = open_storage(plan.storage_url)
    capacity = capacity_search(evaluator, observer) if plan.settings.objective.name == "capacity" else None
    try:
        for group in plan.groups:
            sampler = _sampler(plan, worker_index)
            study = open_study(storage, group.study, plan.attrs(group),
                               directions=list(plan.settings.objective.directions), sampler=sampler, pruner=_pruner(plan))
            baselines = _baselines(study, group, plan=plan, evaluator=evaluator)
            if capacity is not None:
                search_baseline(study, baselines[0][0].at_load(concurrency=1), capacity, host=host_name())
            _search(study, storage, group, plan=plan, sampler=sampler, evaluator=evaluator, worker=worker,
                    baselines=baselines, observer=observer, capacity=capacity)
    finally:
        evaluator.close()


def _baselines(study: optuna.Study, group: Group, *, plan: Plan, evaluator: Evaluator) -> list[tuple]:
    """(spec, rows) of the baseline at each load level; with several levels, each one's objective value is stored
    with the study (the schedule falls back to it where speculation does not pay)."""
    baselines = [evaluator.baseline(group.temperature, group.top_p, concurrency=level.concurrency,
                                    request_rate=level.request_rate) for level in plan.levels]
    key = host_key("load_baselines", host_name())  # each box's own baseline: trials compare with their own box's
    if len(plan.levels) > 1 and key not in study.user_attrs:
        values = []
        for spec, rows in baselines:
            try:
                measured = measure(spec, rows, baseline=spec, baseline_rows=rows, objective=plan.settings.objective,
                                   context=evaluator.context(spec), slo=plan.profile.slo.limits())
                values.append({"point_id": spec.point_id, "value": measured.values[0],
                               "tokens_per_s": measured.metrics.get("tokens_per_s"),
                               "goodput": measured.metrics.get("goodput")})
            except NotMeasured:
                values.append({"point_id": spec.point_id, "value": None})
        study.set_user_attr(key, values)
    return baselines


def _evaluator(plan: Plan, observer: TuneObserver) -> Evaluator:
    if plan.replay is not None:
        return Replay(plan.replay)
    ctx = open_run(plan.profile, observer=observer, out_dir=plan.out_dir)
    files = RunFiles(plan.out_dir)
    files.open(ctx, [], fresh=False)
    return Live(ctx, files)


def _sampler(plan: Plan, worker_index: int) -> QueueFirst:
    constraints = plan.settings.constraints
    has_constraints = constraints.max_peak_memory_mb is not None or constraints.min_acceptance_rate is not None
    tpe = optuna.samplers.TPESampler(
        seed=sampler_seed(plan.settings.seed, host=host_name(), index=worker_index, shared=plan.settings.storage is not None),
        n_startup_trials=len(plan.space.drafts), multivariate=True, group=True,
        constraints_func=_constraint_values if has_constraints else None,
    )
    return QueueFirst(plan.space, tpe)


def sampler_seed(seed: int, *, host: str, index: int, shared: bool) -> int:
    """Each worker's own seed: the local workers' by their index, and on a storage shared across machines by the host
    too, so boxes do not all propose the same points (a point two propose is run once anyway)."""
    import zlib

    return seed + 1000 * index + (zlib.crc32(host.encode()) % 1_000_003 * 1000 if shared else 0)


def _constraint_values(trial: optuna.trial.FrozenTrial) -> list[float]:
    return trial.user_attrs.get("constraints", [])


def _pruner(plan: Plan) -> optuna.pruners.BasePruner:
    if not plan.settings.prune or plan.settings.objective.is_pareto:
        return optuna.pruners.NopPruner()
    # clearly worse: below the bottom quarter of the trials measured on the same prompts, from the second prompt
    return optuna.pruners.PercentilePruner(75.0, n_startup_trials=4, n_warmup_steps=1)


def _search(study: optuna.Study, storage: BaseStorage, group: Group, *, plan: Plan, sampler: QueueFirst,
            evaluator: Evaluator, worker: str, baselines: list[tuple], observer: TuneObserver, capacity=None) -> None:
    """Optuna's loop on the study until its budget is held, or every configuration is, and no trial of any worker is
    left running or waiting for a retry (a trial whose worker died is retried by whoever is left)."""
    size = len(plan.space.configs())
    budget = min(plan.settings.trials, size)

    def objective(trial: optuna.Trial):
        record_warm_start(study, space=plan.space, count=plan.settings.warm_start,
                          unavailable=plan.warm_start_unavailable)
        fixed = fix_point(study, storage, trial, sampler=sampler, space=plan.space, budget=budget, worker=worker)
        spec = plan.space.point(fixed.config, temperature=group.temperature, top_p=group.top_p)
        trial.set_user_attr("point_id", spec.point_id)
        if capacity is not None:  # a capacity search, its launch reused across the probes
            values, row = run_capacity_trial(trial, spec, search=capacity, constraints=plan.settings.constraints)
        elif len(plan.levels) > 1:
            values, row = _run_levels(trial, config=fixed.config, group=group, plan=plan, evaluator=evaluator,
                                      baselines=baselines)
        else:
            (baseline, baseline_rows), = baselines
            values, row = _run_trial(trial, spec, config=fixed.config, plan=plan, evaluator=evaluator,
                                     baseline=baseline, baseline_rows=baseline_rows)
        observer.trial_finished(group.study, row)
        if row["state"] == "FAIL":
            raise PointFailed(row["error"])
        if row["state"] == "PRUNED":
            raise optuna.TrialPruned()
        return values

    def abandoned(number: int) -> None:
        observer.message(f"{group.study}: trial {number} was given up while this worker was stalled (no progress for "
                         "longer than the stall limit); Optuna retries its point on another worker")

    optimize(study, objective, budget=budget, size=size, on_abandoned=abandoned)
    if len(held_points(study.get_trials(deepcopy=False))) >= size:
        observer.message(f"{group.study}: every one of the {size} configurations of the search space has been "
                         "evaluated; nothing is left to try")


def _run_trial(trial: optuna.Trial, spec, *, config, plan: Plan, evaluator: Evaluator, baseline,
               baseline_rows: pd.DataFrame) -> tuple[list[float] | None, dict[str, Any]]:
    """The trial's values (None unless it completed) and its row for the observer."""
    objective = plan.settings.objective
    context = evaluator.context(spec)
    prunable = plan.settings.prune and trial.user_attrs.get("role") != "calibration"

    def judge(rows: pd.DataFrame) -> None:
        """Report the objective on the prompts so far (every single-objective trial, so the pruner can
        compare); stop the trial if the pruner judges it clearly worse."""
        progress.mark()
        if objective.is_pareto:
            return
        try:
            measured = measure(spec, rows, baseline=baseline, baseline_rows=baseline_rows, objective=objective,
                               context=context, slo=plan.profile.slo.limits())
        except NotMeasured:
            return
        trial.report(measured.values[0], step=int(rows["prompt_id"].nunique()))
        if prunable and trial.should_prune():
            raise Pruned(rows)

    try:
        outcome = evaluator.run(spec, judge)
    except Pruned as pruned:
        partial = measure(spec, pruned.rows, baseline=baseline, baseline_rows=baseline_rows, objective=objective,
                          context=context, slo=plan.profile.slo.limits())
        _set_measurement(trial, partial, plan, evaluated=True)
        return None, {"number": trial.number, "point_id": spec.point_id, "state": "PRUNED", "value": partial.values[0]}
    if outcome.error is None:
        try:
            measured = measure(spec, outcome.rows, baseline=baseline, baseline_rows=baseline_rows,
                               objective=objective, context=context, slo=plan.profile.slo.limits())
        except NotMeasured as error:
            outcome = replace(outcome, error=str(error))
    if outcome.error is not None:
        trial.set_user_attr("error", outcome.error)
        trial.set_user_attr("evaluated", outcome.evaluated)
        return None, {"number": trial.number, "point_id": spec.point_id, "state": "FAIL", "error": outcome.error}
    _set_measurement(trial, measured, plan, evaluated=outcome.evaluated)
    if trial.user_attrs.get("role") == "calibration" and plan.warm_start_unavailable is None:
        calibration = calibrate(outcome.rows, baseline_rows, gamma=config.gamma,
                                verify_ms_by_tokens=evaluator.verify_costs(config.gamma + 1),
                                greedy=spec.temperature == 0)
        if calibration is not None:
            trial.set_user_attr("calibration", calibration.as_dict())
    return list(measured.values), {"number": trial.number, "point_id": spec.point_id, "state": "COMPLETE",
                                   "value": measured.values[0], "evaluated": outcome.evaluated}


def _run_levels(trial: optuna.Trial, *, config, group: Group, plan: Plan, evaluator: Evaluator,
                baselines: list[tuple]) -> tuple[list[float] | None, dict[str, Any]]:
    """One configuration at every load level (one launch serves them all, in level order); the trial's value is the
    objective over the load mix, each level's own value kept in its `levels` attr. Not pruned: a level left out
    would leave the per-level choices without it."""
    objective = plan.settings.objective
    entries, violations, evaluated, metrics = [], [], False, {}
    for level, (baseline, baseline_rows) in zip(plan.levels, baselines):
        spec = plan.space.point(config, temperature=group.temperature, top_p=group.top_p,
                                concurrency=level.concurrency, request_rate=level.request_rate)
        outcome = evaluator.run(spec, lambda rows: progress.mark())
        evaluated = evaluated or outcome.evaluated
        error = outcome.error
        if error is None:
            try:
                measured = measure(spec, outcome.rows, baseline=baseline, baseline_rows=baseline_rows,
                                   objective=objective, context=evaluator.context(spec), slo=plan.profile.slo.limits())
            except NotMeasured as problem:
                error = str(problem)
        if error is not None:
            error = f"{level.label}: {error}"
            trial.set_user_attr("error", error)
            trial.set_user_attr("evaluated", evaluated)
            return None, {"number": trial.number, "point_id": spec.point_id, "state": "FAIL", "error": error}
        entries.append(level_entry(level, measured.values[0], measured.metrics))
        violations.append(plan.settings.constraints.violations(measured.metrics))
        metrics = metrics or {k: measured.metrics.get(k) for k in IDENTITY_COLUMNS}
    value = mix_value([e["value"] for e in entries], plan.levels)
    trial.set_user_attr("levels", entries)
    trial.set_user_attr("metrics", {**metrics, "point_id": plan.space.point(
        config, temperature=group.temperature, top_p=group.top_p).point_id})
    trial.set_user_attr("repeat_values", [value])
    trial.set_user_attr("noise", 0.0)
    trial.set_user_attr("evaluated", evaluated)
    trial.set_user_attr("constraints", [max(v) for v in zip(*violations)] if violations and violations[0] else [])
    return [value], {"number": trial.number, "point_id": trial.user_attrs.get("point_id"), "state": "COMPLETE",
                     "value": value, "evaluated": evaluated}


def _set_measurement(trial: optuna.Trial, measured, plan: Plan, *, evaluated: bool) -> None:
    trial.set_user_attr("metrics", measured.metrics)
    trial.set_user_attr("repeat_values", list(measured.repeat_values))
    trial.set_user_attr("noise", measured.noise)
    trial.set_user_attr("evaluated", evaluated)
    trial.set_user_attr("constraints", plan.settings.constraints.violations(measured.metrics))


def finish(plan: Plan) -> TuneResult:
    """trials.parquet, recommendation.json and recommendation.toml from the studies as they stand."""
    storage = open_storage(plan.storage_url)
    studies = {group.study: optuna.load_study(study_name=group.study, storage=storage) for group in plan.groups}
    if plan.replay is None and (plan.out_dir / MANIFEST_FILE).exists():
        files = RunFiles(plan.out_dir)
        points = results.read_parquet(plan.out_dir / results.POINTS_FILE)
        if points is not None:
            files.finish(points)
    return outputs.write(plan, studies)

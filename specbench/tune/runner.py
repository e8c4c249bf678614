"""`specbench tune`: plan the studies, run the search in one or more workers, write what it found.

One study per temperature (and top_p). A worker measures the baseline, then asks for trials: each runs
the first point of the queue of `propose` that no trial holds (one calibration point per draft at the
largest gamma, then the configurations the analytic model predicts best), else what the seeded TPE sampler
proposes, or the untried configuration nearest to it when that one is held already; every trial goes
through the claim rule of `specbench.scaleout.claims`, so workers in any number of processes and machines
share a study with no point run twice. A study ends at its trials, or when every configuration is held.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import optuna
import pandas as pd
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from specbench.core.manifest import MANIFEST_FILE
from specbench.core import results
from specbench.profile import Profile
from specbench.sweep import RunFiles
from specbench.sweep.context import open_run
from specbench.sweep.loop import SilentObserver
from specbench.scaleout.claims import claims, verdict
from specbench.scaleout.liveness import (
    Heartbeat, asked, fail_stale_trials, new_worker_id, others_running, release, wait_for_others,
)
from specbench.scaleout.storage import open_storage, open_study, quiet_optuna
from specbench.scaleout.workers import run_workers
from specbench.tune import outputs
from specbench.tune.capacity import capacity_search, run_capacity_trial, search_baseline
from specbench.tune.evaluate import Evaluator, Live, Pruned, Replay
from specbench.tune.load import IDENTITY_COLUMNS, level_entry, mix_value
from specbench.tune.measure import NotMeasured, measure
from specbench.tune.plan import Group, Plan, TuneResult, TuneSettings, clear, make_plan
from specbench.tune.propose import QueueFirst, record_warm_start
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
    if skip_reason(plan) is None:
        observer.message("verifying the recommendation: launching it at every load level beside the single setting "
                         f"and the baseline (into {plan.out_dir / VERIFY_DIR})")
    return verify(plan, result, observer=VerifyProgress(observer))


def _worker_main(plan: Plan, index: int) -> None:
    work(plan, worker_index=index, observer=SilentObserver())


def work(plan: Plan, *, worker_index: int, observer: TuneObserver) -> None:
    """One worker: every study of the plan, until each has its trials."""
    quiet_optuna()
    worker = new_worker_id()
    evaluator = _evaluator(plan, observer)
    storage = open_storage(plan.storage_url)
    capacity = capacity_search(evaluator, observer) if plan.settings.objective.name == "capacity" else None
    try:
        for group in plan.groups:
            sampler = _sampler(plan, worker_index)
            study = open_study(storage, group.study, plan.attrs(group),
                               directions=list(plan.settings.objective.directions), sampler=sampler, pruner=_pruner(plan))
            fail_stale_trials(study, storage, worker=worker)
            baselines = _baselines(study, group, plan=plan, evaluator=evaluator)
            if capacity is not None:
                search_baseline(study, baselines[0][0].at_load(concurrency=1), capacity)
            _search(study, storage, group, plan=plan, sampler=sampler, evaluator=evaluator, worker=worker,
                    baselines=baselines, observer=observer, capacity=capacity)
    finally:
        evaluator.close()


def _baselines(study: optuna.Study, group: Group, *, plan: Plan, evaluator: Evaluator) -> list[tuple]:
    """(spec, rows) of the baseline at each load level; with several levels, each one's objective value is stored
    with the study (the schedule falls back to it where speculation does not pay)."""
    baselines = [evaluator.baseline(group.temperature, group.top_p, concurrency=level.concurrency,
                                    request_rate=level.request_rate) for level in plan.levels]
    if len(plan.levels) > 1 and "load_baselines" not in study.user_attrs:
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
        study.set_user_attr("load_baselines", values)
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
        seed=plan.settings.seed + 1000 * worker_index, n_startup_trials=len(plan.space.drafts), multivariate=True,
        group=True,
        constraints_func=_constraint_values if has_constraints else None,
    )
    return QueueFirst(plan.space, tpe)


def _constraint_values(trial: optuna.trial.FrozenTrial) -> list[float]:
    return trial.user_attrs.get("constraints", [])


def _pruner(plan: Plan) -> optuna.pruners.BasePruner:
    if not plan.settings.prune or plan.settings.objective.is_pareto:
        return optuna.pruners.NopPruner()
    # clearly worse: below the bottom quarter of the trials measured on the same prompts, from the second prompt
    return optuna.pruners.PercentilePruner(75.0, n_startup_trials=4, n_warmup_steps=1)


def _search(study: optuna.Study, storage: BaseStorage, group: Group, *, plan: Plan, sampler: QueueFirst,
            evaluator: Evaluator, worker: str, baselines: list[tuple], observer: TuneObserver, capacity=None) -> None:
    """Ask for trials until the budget is claimed, or every configuration is held, and no other worker's trial
    is left running (one whose worker died gives its point back, and the budget, to this worker)."""
    size = len(plan.space.configs())
    budget = min(plan.settings.trials, size)
    while True:
        held = claims(study.get_trials(deepcopy=False), budget=budget)
        if held.counted >= budget or len(held.points) >= size:
            if not others_running(study, storage, worker=worker):
                if len(held.points) >= size:
                    observer.message(f"{group.study}: every one of the {size} configurations of the search space "
                                     "has been evaluated; nothing is left to try")
                return
            wait_for_others(study, storage, worker=worker)
            continue
        record_warm_start(study, space=plan.space, count=plan.settings.warm_start,
                          unavailable=plan.warm_start_unavailable)
        trial = asked(study, storage)  # its point is fixed as it is created (QueueFirst)
        try:
            trial.set_user_attr("worker", worker)
            proposal = sampler.proposal(trial.number)
            for key, value in (proposal.attrs if proposal is not None else {"role": "search"}).items():
                trial.set_user_attr(key, value)
            config = plan.space.suggest(trial)
            spec = plan.space.point(config, temperature=group.temperature, top_p=group.top_p)
            trial.set_user_attr("point_id", spec.point_id)
            decision = verdict(study, trial, budget=budget)
            if decision != "run":  # another worker took the point or the last of the budget meanwhile
                trial.set_user_attr("role", decision)
                study.tell(trial, state=TrialState.FAIL)
                continue
        except BaseException:
            release(study, storage, trial)
            raise
        with Heartbeat(study, storage, trial):
            if capacity is not None:  # a capacity search, its launch reused across the probes
                row = run_capacity_trial(study, trial, spec, search=capacity, constraints=plan.settings.constraints)
            elif len(plan.levels) > 1:
                row = _run_levels(study, trial, config=config, group=group, plan=plan, evaluator=evaluator,
                                  baselines=baselines)
            else:
                (baseline, baseline_rows), = baselines
                row = _run_trial(study, trial, spec, config=config, plan=plan, evaluator=evaluator, baseline=baseline,
                                 baseline_rows=baseline_rows)
        observer.trial_finished(group.study, row)


def _run_trial(study: optuna.Study, trial: optuna.Trial, spec, *, config, plan: Plan, evaluator: Evaluator, baseline,
               baseline_rows: pd.DataFrame) -> dict[str, Any]:
    objective = plan.settings.objective
    context = evaluator.context(spec)
    prunable = plan.settings.prune and trial.user_attrs.get("role") != "calibration"

    def judge(rows: pd.DataFrame) -> None:
        """Report the objective on the prompts so far (every single-objective trial, so the pruner can
        compare); stop the trial if the pruner judges it clearly worse."""
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
        study.tell(trial, state=TrialState.PRUNED)
        return {"number": trial.number, "point_id": spec.point_id, "state": "PRUNED", "value": partial.values[0]}
    if outcome.error is None:
        try:
            measured = measure(spec, outcome.rows, baseline=baseline, baseline_rows=baseline_rows,
                               objective=objective, context=context, slo=plan.profile.slo.limits())
        except NotMeasured as error:
            outcome = replace(outcome, error=str(error))
    if outcome.error is not None:
        trial.set_user_attr("error", outcome.error)
        trial.set_user_attr("evaluated", outcome.evaluated)
        study.tell(trial, state=TrialState.FAIL)
        return {"number": trial.number, "point_id": spec.point_id, "state": "FAIL", "error": outcome.error}
    _set_measurement(trial, measured, plan, evaluated=outcome.evaluated)
    if trial.user_attrs.get("role") == "calibration" and plan.warm_start_unavailable is None:
        calibration = calibrate(outcome.rows, baseline_rows, gamma=config.gamma,
                                verify_ms_by_tokens=evaluator.verify_costs(config.gamma + 1),
                                greedy=spec.temperature == 0)
        if calibration is not None:
            trial.set_user_attr("calibration", calibration.as_dict())
    study.tell(trial, list(measured.values))
    return {"number": trial.number, "point_id": spec.point_id, "state": "COMPLETE", "value": measured.values[0],
            "evaluated": outcome.evaluated}


def _run_levels(study: optuna.Study, trial: optuna.Trial, *, config, group: Group, plan: Plan, evaluator: Evaluator,
                baselines: list[tuple]) -> dict[str, Any]:
    """One configuration at every load level (one launch serves them all, in level order); the trial's value is the
    objective over the load mix, each level's own value kept in its `levels` attr. Not pruned: a level left out
    would leave the per-level choices without it."""
    objective = plan.settings.objective
    entries, violations, evaluated, metrics = [], [], False, {}
    for level, (baseline, baseline_rows) in zip(plan.levels, baselines):
        spec = plan.space.point(config, temperature=group.temperature, top_p=group.top_p,
                                concurrency=level.concurrency, request_rate=level.request_rate)
        outcome = evaluator.run(spec, lambda rows: None)
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
            study.tell(trial, state=TrialState.FAIL)
            return {"number": trial.number, "point_id": spec.point_id, "state": "FAIL", "error": error}
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
    study.tell(trial, [value])
    return {"number": trial.number, "point_id": trial.user_attrs.get("point_id"), "state": "COMPLETE", "value": value,
            "evaluated": evaluated}


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

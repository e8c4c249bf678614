"""The claim rule that lets any number of processes on any number of machines share one Optuna study with
no point run twice and exactly the requested number of trials.

Trials are ordered by number (the storage assigns numbers atomically). Walking that order, a trial claims
its point unless an earlier trial already claimed the same point (then it is a duplicate) or the budget of
trials is already claimed (then it is surplus). Duplicates and surplus trials end as FAIL with a `role`
saying so, without running anything. A FAIL without an `error` (an interrupted trial, or one whose worker
stopped sending heartbeats) holds no claim: its point is free again. Every worker applies the same rule to
the same ordered history, so they agree without talking to each other.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

UNCLAIMED_ROLES = ("duplicate", "surplus", "stale", "interrupted")  # trials that ran nothing, or did not finish


@dataclass(frozen=True)
class Claims:
    points: dict[tuple, int]  # claimed point -> the number of the trial that holds it
    counted: int  # trials that use the budget: running, completed or pruned claim holders


def point_of(params: dict) -> tuple:
    """A point as the study knows it: its trial parameters, sorted."""
    return tuple(sorted(params.items()))


def claims(trials: list[FrozenTrial], *, budget: int | None) -> Claims:
    """Apply the claim rule to trials in number order."""
    points: dict[tuple, int] = {}
    counted = 0
    for trial in sorted(trials, key=lambda t: t.number):
        if trial.state == TrialState.WAITING or not trial.params or trial.user_attrs.get("role") in UNCLAIMED_ROLES:
            continue
        if trial.state == TrialState.FAIL and "error" not in trial.user_attrs:
            continue
        point = point_of(trial.params)
        uses_budget = trial.state != TrialState.FAIL
        if point in points or (uses_budget and budget is not None and counted >= budget):
            continue  # a duplicate or surplus trial not yet marked as one
        points[point] = trial.number
        counted += uses_budget
    return Claims(points, counted)


def verdict(study: optuna.Study, trial: optuna.Trial, *, budget: int | None, wait_s: float = 30.0) -> str:
    """'run', 'duplicate' or 'surplus' for a trial whose parameters are all set. Waits (briefly) until every
    earlier trial has all its parameters, so that all workers judge the same history: a trial sets its
    parameters one at a time, and says it has them all by asking for its verdict (`proposed`)."""
    trial.set_user_attr("proposed", True)
    deadline = time.monotonic() + wait_s
    while True:
        earlier = [t for t in study.get_trials(deepcopy=False) if t.number < trial.number]
        pending = [t for t in earlier if t.state == TrialState.RUNNING and not t.user_attrs.get("proposed")]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    held = claims(earlier, budget=budget)
    point = point_of(trial.params)
    if point in held.points:
        trial.set_user_attr("duplicate_of", held.points[point])
        return "duplicate"
    if budget is not None and held.counted >= budget:
        return "surplus"
    return "run"

"""What a new trial of a tune proposes: the first queued point that no trial holds, else what the seeded
TPE sampler proposes.

The queue: one calibration point per draft (the largest gamma), then the configurations the warm start
predicts best, and, once the study's last 20 trials were all duplicates (the sampler has converged), an
unclaimed point at random. Nothing is enqueued in Optuna's sense: Optuna hands out an enqueued (WAITING)
trial with a read then an update, which on SQLite two processes can both win. Here every trial is created
by `ask` and belongs to one process; the queue is derived from what every worker sees (the search space,
the study's trials and its `warm_start` user attr); and the claim rule of `study` decides whether the trial
runs the point it proposes.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from specbench.tune.space import SearchSpace
from specbench.scaleout.claims import claims, point_of
from specbench.tune.warmstart import Calibration, predicted_speedup

MAX_DUPLICATES_IN_A_ROW = 20  # then an unclaimed point at random: the sampler has converged


@dataclass(frozen=True)
class Proposal:
    params: dict[str, Any]
    attrs: dict[str, Any]  # stored with the trial: its role, and predicted_speedup for a warm start


class QueueFirst(optuna.samplers.BaseSampler):
    """Proposes `next_queued(study, trial number)` when it gives a point, else what `fallback` samples.
    The choice is made as the trial is created (`before_trial`), once."""

    def __init__(self, next_queued: Callable[[optuna.Study, int], Proposal | None],
                 fallback: optuna.samplers.BaseSampler):
        self.next_queued = next_queued
        self.fallback = fallback
        self._proposals: dict[int, Proposal | None] = {}  # trial number -> what it proposes (this process's trials)

    def proposal(self, number: int) -> Proposal | None:
        return self._proposals.get(number)

    def before_trial(self, study, trial):
        self.fallback.before_trial(study, trial)
        self._proposals[trial.number] = self.next_queued(study, trial.number)

    def infer_relative_search_space(self, study, trial):
        if self.proposal(trial.number) is not None:
            return {}
        return self.fallback.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        if self.proposal(trial.number) is not None:
            return {}
        return self.fallback.sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        proposal = self.proposal(trial.number)
        if proposal is not None:
            return proposal.params[param_name]
        return self.fallback.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study, trial, state, values):
        self._proposals.pop(trial.number, None)
        self.fallback.after_trial(study, trial, state, values)


def next_queued(study: optuna.Study, number: int, *, space: SearchSpace, seed: int) -> Proposal | None:
    """For trial `number`: the first queued point that no trial holds, or None (the sampler proposes)."""
    trials = study.get_trials(deepcopy=False)
    held = claims(trials, budget=None).points
    queued = [Proposal(space.params(config), {"role": "calibration"}) for config in space.calibration_configs()]
    queued += [Proposal(params, {"role": "warm_start", "predicted_speedup": value})
               for params, value in study.user_attrs.get("warm_start", {}).get("queued", [])]
    first = next((p for p in queued if point_of(p.params) not in held), None)
    if first is not None or not _converged(trials, number):
        return first
    unclaimed = [config for config in space.configs() if point_of(space.params(config)) not in held]
    if not unclaimed:
        return None
    config = random.Random(seed * 100_003 + number).choice(unclaimed)
    return Proposal(space.params(config), {"role": "search"})


def record_warm_start(study: optuna.Study, *, space: SearchSpace, count: int) -> None:
    """Once every calibration point is held by a finished trial: predict every configuration of the calibrated
    drafts, and queue the `count` best that no trial holds (the study's `warm_start` user attr, set once)."""
    if count == 0 or "warm_start" in study.user_attrs:
        return
    trials = study.get_trials(deepcopy=False)
    held = claims(trials, budget=None).points
    by_number = {t.number: t for t in trials}
    numbers = [held.get(point_of(space.params(config))) for config in space.calibration_configs()]
    if any(n is None or not by_number[n].state.is_finished() for n in numbers):
        return
    holders = [by_number[n] for n in numbers]
    calibrations = {(t.params["draft"], t.params.get("ngram_max")): Calibration.from_dict(t.user_attrs["calibration"])
                    for t in holders if t.state == TrialState.COMPLETE and "calibration" in t.user_attrs}
    predictions = []
    for config in space.configs():
        params = space.params(config)
        calibration = calibrations.get((config.draft, params.get("ngram_max")))
        if calibration is not None:
            predictions.append((params, predicted_speedup(calibration, config.gamma)))
    predictions.sort(key=lambda item: -item[1])
    queued = [[p, v] for p, v in predictions if point_of(p) not in held][:count]
    study.set_user_attr("warm_start", {"predictions": [[p, round(v, 6)] for p, v in predictions], "queued": queued})


def _converged(trials: list[FrozenTrial], number: int) -> bool:
    """Whether the last MAX_DUPLICATES_IN_A_ROW trials before `number` were all duplicates."""
    earlier = sorted((t for t in trials if t.number < number), key=lambda t: t.number)[-MAX_DUPLICATES_IN_A_ROW:]
    return len(earlier) == MAX_DUPLICATES_IN_A_ROW and all(t.user_attrs.get("role") == "duplicate" for t in earlier)

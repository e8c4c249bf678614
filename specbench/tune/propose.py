"""What a new trial of a tune runs, fixed as the trial is created: the first queued point that no trial holds,
else what the seeded TPE sampler proposes, else — when that point is already held (evaluated, failed or running
on another worker) or the engine refuses it — the untried configuration nearest to it. So a study holds one
trial per evaluation: in a small space TPE keeps proposing points it has seen, and none of them becomes a trial.

The queue: one calibration point per draft (the largest gamma), then the configurations the warm start
predicts best. Nothing is enqueued in Optuna's sense: Optuna hands out an enqueued (WAITING) trial with a read
then an update, which on SQLite two processes can both win. Here every trial is created by `ask` and belongs
to one process; the queue is derived from what every worker sees (the search space, the study's trials and
its `warm_start` user attr). A new trial first waits until every earlier trial has fixed its point (`proposed`,
set by the claim rule of `specbench.scaleout.claims`), so workers sharing a study never propose the same
point; the claim rule still judges every trial, for the rare race it cannot see (a point taken meanwhile).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from specbench.scaleout.claims import claims, point_of
from specbench.tune.space import Config, SearchSpace
from specbench.tune.warmstart import Calibration, predicted_speedup

WAIT_FOR_EARLIER_S = 30.0  # an earlier trial that fixes no point for this long belongs to a dead worker


@dataclass(frozen=True)
class Proposal:
    params: dict[str, Any]
    attrs: dict[str, Any]  # stored with the trial: its role, predicted_speedup for a warm start, what TPE proposed


class QueueFirst(optuna.samplers.BaseSampler):
    """Fixes each trial's point in `before_trial` (`propose`); the trial's suggestions then return it."""

    def __init__(self, space: SearchSpace, fallback: optuna.samplers.BaseSampler):
        self.space = space
        self.fallback = fallback
        self._proposals: dict[int, Proposal] = {}  # trial number -> what it runs (this process's trials)

    def proposal(self, number: int) -> Proposal | None:
        return self._proposals.get(number)

    def before_trial(self, study, trial):
        self.fallback.before_trial(study, trial)
        wait_for_earlier_proposals(study, trial.number)
        self._proposals[trial.number] = propose(study, space=self.space, sampled=lambda: self._sampled(study, trial))

    def _sampled(self, study: optuna.Study, trial: FrozenTrial) -> Config:
        """What the fallback sampler proposes for the whole trial: its relative sample, the rest independently."""
        relative = self.fallback.sample_relative(study, trial, self.fallback.infer_relative_search_space(study, trial))

        def pick(name, distribution):
            if name in relative:
                return relative[name]
            return self.fallback.sample_independent(study, trial, name, distribution)

        return self.space.sample(pick)

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        proposal = self.proposal(trial.number)
        if proposal is None:  # a trial this process did not create
            return self.fallback.sample_independent(study, trial, param_name, param_distribution)
        return proposal.params[param_name]

    def after_trial(self, study, trial, state, values):
        self._proposals.pop(trial.number, None)
        self.fallback.after_trial(study, trial, state, values)


def propose(study: optuna.Study, *, space: SearchSpace, sampled: Callable[[], Config]) -> Proposal:
    """The first queued point no trial holds, else `sampled()` when nobody holds it and the engine
    runs it, else the untried configuration nearest to it (the held one nearest, when none is left untried:
    the claim rule then calls the trial a duplicate)."""
    held = claims(study.get_trials(deepcopy=False), budget=None).points
    queued = next_queued(study, space=space, held=held)
    if queued is not None:
        return queued
    config = sampled()
    params = space.params(config)
    configs = space.configs()
    if point_of(params) not in held and config in configs:
        return Proposal(params, {"role": "search"})
    untried = [c for c in configs if point_of(space.params(c)) not in held]
    nearest = space.nearest(config, among=untried or configs)
    instead = {"sampled": params, **({"sampled_held_by": held[point_of(params)]} if point_of(params) in held else {})}
    return Proposal(space.params(nearest), {"role": "search", **instead})


def next_queued(study: optuna.Study, *, space: SearchSpace, held: dict[tuple, int]) -> Proposal | None:
    """The first queued point that no trial holds, or None (the sampler proposes)."""
    queued = [Proposal(space.params(config), {"role": "calibration"}) for config in space.calibration_configs()]
    queued += [Proposal(params, {"role": "warm_start", "predicted_speedup": value})
               for params, value in study.user_attrs.get("warm_start", {}).get("queued", [])]
    return next((p for p in queued if point_of(p.params) not in held), None)


def wait_for_earlier_proposals(study: optuna.Study, number: int, *, wait_s: float = WAIT_FOR_EARLIER_S) -> None:
    """Until every running trial numbered before `number` has fixed its point (or `wait_s` passed)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if not any(t.number < number and not t.user_attrs.get("proposed") for t in running):
            return
        time.sleep(0.05)


def record_warm_start(study: optuna.Study, *, space: SearchSpace, count: int, unavailable: str | None = None) -> None:
    """Once every calibration point is held by a finished trial: predict every configuration of the calibrated
    drafts, and queue the `count` best that no trial holds (the study's `warm_start` user attr, set once). Where
    the backend's measurements cannot give a prediction (`unavailable`: why), the attr says so at once."""
    if count == 0 or "warm_start" in study.user_attrs:
        return
    if unavailable is not None:
        study.set_user_attr("warm_start", {"unavailable": unavailable, "predictions": [], "queued": []})
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
        if calibration is not None and config.gamma <= calibration.gamma:
            predictions.append((params, predicted_speedup(calibration, config.gamma)))
    predictions.sort(key=lambda item: -item[1])
    queued = [[p, v] for p, v in predictions if point_of(p) not in held][:count]
    study.set_user_attr("warm_start", {"predictions": [[p, round(v, 6)] for p, v in predictions], "queued": queued})

"""What a new trial of a tune runs, fixed under the study's proposal lock (`scaleout.storage.proposal_lock`) as the
trial begins: the first queued point that no trial holds, else what the seeded TPE sampler proposes, else — when that
point is already held (evaluated, failed, running or waiting for a retry, on any worker) or the engine refuses it — the
untried configuration nearest to it. So a study holds one trial per evaluation: in a small space TPE keeps proposing
points it has seen, and none of them becomes a trial; and workers that share a study, whatever their seeds, never
propose one point twice (each reads the others' points under the lock).

The queue: one calibration point per draft (the largest gamma), then the configurations the warm start predicts best;
derived from what every worker sees (the search space, the study's trials and its `warm_start` user attr).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from specbench.tune.space import Config, SearchSpace
from specbench.tune.warmstart import Calibration, predicted_speedup

NOT_RUN = ("duplicate", "surplus", "stale", "interrupted")  # roles of trials that ran nothing (the last two: old studies)


@dataclass(frozen=True)
class Proposal:
    params: dict[str, Any]
    attrs: dict[str, Any]  # stored with the trial: its role, predicted_speedup for a warm start, what TPE proposed


def point_of(params: dict) -> tuple:
    """A point as the study knows it: its trial parameters, sorted."""
    return tuple(sorted(params.items()))


def holds_point(trial: FrozenTrial) -> bool:
    """Whether the trial holds its point: it runs, ran or (a retry) will run it, or it failed with an error (a failed
    point is not run again). A trial whose worker died or was interrupted holds none (its point is free again, and
    Optuna queues a retry), nor do duplicates and surplus trials, which ran nothing."""
    if not trial.params or trial.user_attrs.get("role") in NOT_RUN:
        return False
    return trial.state != TrialState.FAIL or "error" in trial.user_attrs


def uses_budget(trial: FrozenTrial) -> bool:
    """Whether the trial counts toward the study's trials: it holds its point and has not failed."""
    return holds_point(trial) and trial.state != TrialState.FAIL


def held_points(trials: Iterable[FrozenTrial]) -> dict[tuple, int]:
    """Each held point and the number of the first trial that holds it."""
    held: dict[tuple, int] = {}
    for trial in sorted(trials, key=lambda t: t.number):
        if holds_point(trial):
            held.setdefault(point_of(trial.params), trial.number)
    return held


class QueueFirst(optuna.samplers.BaseSampler):
    """Returns, for each of this process's trials, the point `fix` chose for it (under the proposal lock)."""

    def __init__(self, space: SearchSpace, fallback: optuna.samplers.BaseSampler):
        self.space = space
        self.fallback = fallback
        self._proposals: dict[int, Proposal] = {}  # trial number -> what it runs (this process's trials)

    def proposal(self, number: int) -> Proposal | None:
        return self._proposals.get(number)

    def fix(self, study: optuna.Study, trial: FrozenTrial, *, held: dict[tuple, int]) -> Proposal | None:
        """Choose the trial's point (None when every configuration is held); call it under the proposal lock."""
        proposal = propose(study, space=self.space, held=held, sampled=lambda: self._sampled(study, trial))
        if proposal is not None:
            self._proposals[trial.number] = proposal
        return proposal

    def _sampled(self, study: optuna.Study, trial: FrozenTrial) -> Config:
        """What the fallback sampler proposes for the whole trial: its relative sample, the rest independently."""
        relative = self.fallback.sample_relative(study, trial, self.fallback.infer_relative_search_space(study, trial))

        def pick(name, distribution):
            if name in relative:
                return relative[name]
            return self.fallback.sample_independent(study, trial, name, distribution)

        return self.space.sample(pick)

    def before_trial(self, study, trial):
        self.fallback.before_trial(study, trial)

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        proposal = self.proposal(trial.number)
        if proposal is None:  # a trial this process did not fix
            return self.fallback.sample_independent(study, trial, param_name, param_distribution)
        return proposal.params[param_name]

    def after_trial(self, study, trial, state, values):
        self._proposals.pop(trial.number, None)
        self.fallback.after_trial(study, trial, state, values)


def propose(study: optuna.Study, *, space: SearchSpace, held: dict[tuple, int],
            sampled: Callable[[], Config]) -> Proposal | None:
    """The first queued point no trial holds, else `sampled()` when nobody holds it and the engine runs it, else the
    untried configuration nearest to it; None when every configuration is held."""
    queued = next_queued(study, space=space, held=held)
    if queued is not None:
        return queued
    configs = space.configs()
    untried = [c for c in configs if point_of(space.params(c)) not in held]
    if not untried:
        return None
    config = sampled()
    params = space.params(config)
    if point_of(params) not in held and config in configs:
        return Proposal(params, {"role": "search"})
    nearest = space.nearest(config, among=untried)
    instead = {"sampled": params, **({"sampled_held_by": held[point_of(params)]} if point_of(params) in held else {})}
    return Proposal(space.params(nearest), {"role": "search", **instead})


def next_queued(study: optuna.Study, *, space: SearchSpace, held: dict[tuple, int]) -> Proposal | None:
    """The first queued point that no trial holds, or None (the sampler proposes)."""
    queued = [Proposal(space.params(config), {"role": "calibration"}) for config in space.calibration_configs()]
    queued += [Proposal(params, {"role": "warm_start", "predicted_speedup": value})
               for params, value in study.user_attrs.get("warm_start", {}).get("queued", [])]
    return next((p for p in queued if point_of(p.params) not in held), None)


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
    held = held_points(trials)
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

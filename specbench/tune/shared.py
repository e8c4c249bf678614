"""A tune worker's loop over one study, shared with workers in other processes and on other machines: Optuna's own
optimisation loop (`Study.optimize`) on an RDB storage, with Optuna's heartbeats (recorded only while this worker makes
progress, `core.progress`) and Optuna's retry of trials whose worker died (`RetryFailedTrialCallback`, a new
trial of the same point). specbench adds only what Optuna leaves to its user:

- each trial fixes its point and counts the budget under the study's proposal lock (`scaleout.storage`), so no two
  trials hold one point and exactly `budget` trials finish: a trial that finds the budget held ends as `surplus`
  without running anything, one that finds every configuration held likewise;
- a worker whose loop is done stays while other workers' trials run or retries wait, so a retry of a trial whose
  worker died is run by whoever is left;
- a worker that was stalled so long that its trial was given up (and retried elsewhere) goes on with the next trial
  instead of crashing on Optuna's "Cannot tell a FAIL trial".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from specbench.core import progress
from specbench.scaleout.storage import heartbeat_interval, proposal_lock
from specbench.tune.propose import Proposal, QueueFirst, held_points, point_of, uses_budget
from specbench.tune.space import Config


class NotRun(Exception):
    """A trial that runs nothing: a duplicate of a held point, or past the budget (`role` says which)."""


class Abandoned(Exception):
    """The trial was given up as stale (this worker made no progress for too long) and retried elsewhere."""


class PointFailed(Exception):
    """The trial's point failed (its `error` attr says why); the trial holds its point, so it is not rerun."""


@dataclass
class Fixed:
    config: Config
    proposal: Proposal | None  # None for a retry (its point is the failed trial's)


def fix_point(study: optuna.Study, storage: BaseStorage, trial: optuna.Trial, *, sampler: QueueFirst, space,
              budget: int, worker: str) -> Fixed:
    """Under the proposal lock: the trial's point, or NotRun (the trial's `role` set, the worker's loop stopped)."""
    trial.set_user_attr("worker", worker)
    frozen = storage.get_trial(trial._trial_id)
    retry_of = frozen.system_attrs.get("failed_trial")
    with proposal_lock(storage, study.study_name):
        others = [t for t in study.get_trials(deepcopy=False) if t.number != trial.number]
        held = held_points(others)
        if retry_of is not None:  # Optuna's retry of a trial whose worker died: its point is fixed already
            trial.set_user_attr("retry_of", retry_of)
            config = space.suggest(trial)
            holder = held.get(point_of(trial.params))
            if holder is not None and others_state(others, holder) != TrialState.WAITING:
                _not_run(study, trial, "duplicate", duplicate_of=holder)
            return Fixed(config, None)
        if sum(uses_budget(t) for t in others) >= budget:
            _not_run(study, trial, "surplus")
        proposal = sampler.fix(study, frozen, held=held)
        if proposal is None:
            _not_run(study, trial, "surplus")
        for key, value in proposal.attrs.items():
            trial.set_user_attr(key, value)
        config = space.suggest(trial)  # the point's parameters are written now, under the lock
    return Fixed(config, proposal)


def others_state(trials: list[FrozenTrial], number: int) -> TrialState:
    return next(t.state for t in trials if t.number == number)


def _not_run(study: optuna.Study, trial: optuna.Trial, role: str, **attrs: Any) -> None:
    trial.set_user_attr("role", role)
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    if role == "surplus":
        study.stop()
    raise NotRun(role)


def host_key(name: str, host: str) -> str:
    """A study user attr kept per host (a baseline each box measured itself): `<name>@<host>`."""
    return f"{name}@{host}"


def of_host(attrs: dict[str, Any], name: str, worker: str | None) -> Any:
    """The attr `name` as the host of `worker` (host:pid/index) measured it; a study of one host, or older, has one."""
    host = (worker or "").partition(":")[0]
    mine = attrs.get(host_key(name, host))
    if mine is not None:
        return mine
    return attrs.get(name, next((value for key, value in sorted(attrs.items()) if key.startswith(f"{name}@")), None))


def done(study: optuna.Study, *, budget: int, size: int) -> bool:
    """The study has its trials (finished, running or waiting for a retry), or every configuration is held."""
    trials = study.get_trials(deepcopy=False)
    return sum(uses_budget(t) for t in trials) >= budget or len(held_points(trials)) >= size


def optimize(study: optuna.Study, objective: Callable[[optuna.Trial], Any], *, budget: int, size: int,
             on_abandoned: Callable[[int], None]) -> None:
    """Optuna's loop until the study is done and no trial of any worker runs or waits: a worker whose part is done
    watches the others (Optuna fails a trial whose heartbeats stopped and queues its retry, which this worker then
    runs)."""
    current: dict[str, int] = {}

    def tracked(trial: optuna.Trial):
        current["number"] = trial.number
        progress.mark()
        try:
            values = objective(trial)
        except KeyboardInterrupt:  # Optuna fails the trial; its point is free again
            trial.set_user_attr("role", "interrupted")
            raise
        finally:
            if study._storage.get_trial(trial._trial_id).state != TrialState.RUNNING:
                raise Abandoned(trial.number)  # given up as stale meanwhile: Optuna refuses to tell it (see below)
        return values

    def stop_when_done(study: optuna.Study, trial: FrozenTrial) -> None:
        progress.mark()  # the main thread came round: the next trial's first heartbeat is recorded
        if done(study, budget=budget, size=size):
            study.stop()

    while True:
        progress.mark()
        optuna.storages.fail_stale_trials(study)
        waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if waiting or not done(study, budget=budget, size=size):
            try:
                study.optimize(tracked, callbacks=[stop_when_done], catch=(NotRun, PointFailed), gc_after_trial=False)
            except ValueError as error:  # Optuna could not tell a trial that was given up as stale meanwhile
                number = current.get("number")
                if number is None or "Cannot tell" not in str(error):
                    raise
                on_abandoned(number)
            continue
        if not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            return
        time.sleep(heartbeat_interval())


def verify_once(storage: BaseStorage, name: str, *, worker: str, run: Callable[[], Any]) -> str | None:
    """Run `run` once for the whole shared tune: the first worker to get here takes the study `name`'s one trial (under
    the proposal lock) and runs it, with heartbeats (a verifier that dies is replaced); None when this worker ran it,
    else the worker that did or does."""
    study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True)
    holder: dict[str, str] = {}

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr("worker", worker)
        with proposal_lock(storage, name):
            # claimed under this lock: a trial merely running may be another worker's that has not taken the lock
            # yet (and will find this one's claim), or one that already stepped aside
            taken = [t for t in study.get_trials(deepcopy=False) if t.number != trial.number
                     and t.user_attrs.get("role") == "verification"
                     and t.state in (TrialState.RUNNING, TrialState.COMPLETE)]
            if taken:
                holder["worker"] = taken[0].user_attrs.get("worker", "another worker")
                trial.set_user_attr("role", "duplicate")
                raise NotRun("duplicate")
            trial.set_user_attr("role", "verification")
        progress.mark()
        run()
        return 0.0

    optuna.storages.fail_stale_trials(study)
    progress.mark()
    study.optimize(objective, n_trials=1, catch=(NotRun,), gc_after_trial=False)
    return holder.get("worker")

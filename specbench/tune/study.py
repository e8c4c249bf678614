"""Optuna studies shared by workers: opening a storage, creating or checking a study, and the claim
rule that lets any number of processes on any number of machines share one study with no point run
twice and exactly the requested number of trials.

The claim rule. Trials are ordered by number (the storage assigns numbers atomically). Walking that
order, a trial claims its point unless an earlier trial already claimed the same point (then it is a
duplicate) or the budget of trials is already claimed (then it is surplus). Duplicates and surplus
trials end as FAIL with a `role` saying so, without running anything. Every worker applies the same
rule to the same ordered history, so they agree without talking to each other.
"""

from __future__ import annotations

import os
import re
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from specbench.tune.space import TuneError

DEFAULT_STORAGE_FILE = "study.db"

# roles of trials that hold no claim: they ran nothing, or what they ran did not finish
_UNCLAIMED = ("duplicate", "surplus", "stale", "interrupted")


def storage_url(storage: str | None, out_dir: Path) -> str:
    """The default: a SQLite file in the output folder."""
    return storage if storage is not None else f"sqlite:///{(out_dir / DEFAULT_STORAGE_FILE).resolve()}"


def open_storage(url: str, *, attempts: int = 5) -> BaseStorage:
    """Any Optuna storage: an SQLAlchemy URL (sqlite, postgresql, mysql) or a journal file path. Workers
    that start together on a new database race to create Optuna's tables: the losers try again (an
    IntegrityError, or SQLite's "table ... already exists")."""
    for attempt in range(attempts):
        try:
            return _open_storage(url)
        except TuneError as error:
            racing = "IntegrityError" in str(error) or "already exists" in str(error)
            if not racing or attempt == attempts - 1:
                raise
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


def _open_storage(url: str) -> BaseStorage:
    try:
        if "://" not in url:
            return JournalStorage(JournalFileBackend(url))
        connect_args: dict[str, Any] = {}
        if url.startswith("sqlite"):
            connect_args = {"timeout": 60}  # several local workers take turns on one file
        elif url.startswith("postgresql"):
            connect_args = {"connect_timeout": 10}
        return RDBStorage(url, engine_kwargs={"connect_args": connect_args}, skip_compatibility_check=False)
    except Exception as error:  # noqa: BLE001 - any driver's connection error becomes one line
        raise TuneError(f"--storage: cannot open {_masked(url)}: {_first_line(error)}") from None


def study_name(base: str, temperature: float, top_p: float) -> str:
    return f"{base}-t{temperature:g}-p{top_p:g}"


def check_study(storage: BaseStorage, name: str, attrs: dict[str, Any]) -> bool:
    """Whether `name` exists; a study created with another search space or objective is refused."""
    try:
        summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    except Exception as error:  # noqa: BLE001
        raise TuneError(f"--storage: cannot read studies: {_first_line(error)}") from None
    existing = next((s for s in summaries if s.study_name == name), None)
    if existing is None:
        return False
    stored = existing.user_attrs.get("specbench")
    if stored is not None and stored != attrs:
        differs = next(key for key in sorted(set(stored) | set(attrs)) if stored.get(key) != attrs.get(key))
        raise TuneError(f"study {name!r} was created with another {differs.replace('_', ' ')}; "
                        "use --study NAME for a new study, or --fresh to replace it")
    return True


def open_study(storage: BaseStorage, name: str, attrs: dict[str, Any], *, directions: list[str],
               sampler: optuna.samplers.BaseSampler, pruner: optuna.pruners.BasePruner) -> optuna.Study:
    study = optuna.create_study(storage=storage, study_name=name, directions=directions, sampler=sampler,
                                pruner=pruner, load_if_exists=True)
    if "specbench" not in study.user_attrs:
        study.set_user_attr("specbench", attrs)
    return study


def new_worker_id() -> str:
    """host:pid:nonce, stored in each trial's user attrs; a new one per worker run."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def fail_stale_trials(study: optuna.Study, *, worker: str) -> int:
    """RUNNING trials of workers on this machine that are gone (killed, or an earlier run in this same
    process) will never finish: mark them FAIL so their points can be proposed again."""
    host, _, mine = worker.partition(":")
    failed = 0
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = trial.user_attrs.get("worker", "")
        trial_host, _, rest = worker.partition(":")
        pid = rest.partition(":")[0]
        if trial_host != host or not pid.isdigit() or rest == mine:
            continue
        if int(pid) != os.getpid() and _alive(int(pid)):
            continue
        study._storage.set_trial_user_attr(trial._trial_id, "role", "stale")
        study.tell(trial.number, state=TrialState.FAIL)
        failed += 1
    return failed


@dataclass(frozen=True)
class Claims:
    points: dict[tuple, int]  # claimed point -> the number of the trial that holds it
    counted: int  # trials that use the budget: running, completed or pruned claim holders


def point_of(trial: FrozenTrial) -> tuple:
    return tuple(sorted(trial.params.items()))


def claims(trials: list[FrozenTrial], *, budget: int | None) -> Claims:
    """Apply the claim rule to trials in number order."""
    points: dict[tuple, int] = {}
    counted = 0
    for trial in sorted(trials, key=lambda t: t.number):
        if trial.state == TrialState.WAITING or not trial.params or trial.user_attrs.get("role") in _UNCLAIMED:
            continue
        if trial.state == TrialState.FAIL and "error" not in trial.user_attrs:
            continue
        point = point_of(trial)
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
    point = tuple(sorted(trial.params.items()))
    if point in held.points:
        trial.set_user_attr("duplicate_of", held.points[point])
        return "duplicate"
    if budget is not None and held.counted >= budget:
        return "surplus"
    return "run"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _masked(url: str) -> str:
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]

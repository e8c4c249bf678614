"""Trials whose worker is gone must give their point back, on whatever machine the worker ran.

- A running trial sends heartbeats (`Heartbeat`); with an RDB storage (SQLite, PostgreSQL, MySQL) Optuna
  fails a trial whose heartbeat is older than the storage's grace period when any worker calls
  `fail_stale_trials`, and the callback records that its point was re-queued. Without heartbeats (a
  journal file) only workers on the same host can tell, by the dead worker's pid.
- A trial interrupted in this process (Ctrl-C, a crash in specbench) is failed at once (`release`).
A failed trial without an `error` holds no claim (see `claims`), so its point is proposed again.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState

HOST_ENV = "SPECBENCH_HOST"  # the host name written into worker ids (default: this machine's)
HEARTBEAT_ENV = "SPECBENCH_HEARTBEAT_S"  # seconds between a running trial's heartbeats (default 10)


def heartbeat_interval() -> int:
    """Seconds between heartbeats; a trial silent for six intervals is stale."""
    return max(1, int(os.environ.get(HEARTBEAT_ENV, "10")))


def new_worker_id() -> str:
    """host:pid:nonce, stored in each trial's user attrs; a new one per worker run."""
    host = os.environ.get(HOST_ENV) or socket.gethostname()
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _trial_id(storage: BaseStorage, study: optuna.Study, number: int) -> int:
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)


def fail_stale_trials(study: optuna.Study, storage: BaseStorage, *, worker: str) -> None:
    """Fail RUNNING trials that will never finish: those whose heartbeats stopped (any host), and those of
    workers on this host whose process is gone (or an earlier run in this same process)."""
    optuna.storages.fail_stale_trials(study)  # no-op for a storage without heartbeats
    host, _, mine = worker.partition(":")
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.user_attrs.get("worker", "")
        trial_host, _, rest = owner.partition(":")
        pid = rest.partition(":")[0]
        if trial_host != host or not pid.isdigit() or rest == mine:
            continue
        if int(pid) != os.getpid() and _alive(int(pid)):
            continue
        trial_id = _trial_id(storage, study, trial.number)
        try:
            storage.set_trial_user_attr(trial_id, "role", "stale")
            storage.set_trial_state_values(trial_id, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another worker failed it first


def requeue_callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """Optuna's stale-trial callback: the trial already holds no claim; say so in the study for the record."""
    study.set_user_attr(f"requeued_{trial.number}", {"point": trial.params, "worker": trial.user_attrs.get("worker")})


def others_running(study: optuna.Study, storage: BaseStorage, *, worker: str) -> bool:
    """Whether another worker's trial is running that this worker could take up should that worker die: any,
    with heartbeats; only this host's without (a dead worker elsewhere could never be told)."""
    host = worker.partition(":")[0]
    watched = isinstance(storage, optuna.storages.RDBStorage)
    return any(t.user_attrs.get("worker") != worker and (watched or t.user_attrs.get("worker", "").partition(":")[0] == host)
               for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))


def wait_for_others(study: optuna.Study, storage: BaseStorage, *, worker: str) -> None:
    """Sleep one heartbeat interval and fail what went stale meanwhile: called while other workers' trials run
    and nothing is left to claim, so a point whose worker died is taken up here."""
    time.sleep(heartbeat_interval())
    fail_stale_trials(study, storage, worker=worker)


def asked(study: optuna.Study, storage: BaseStorage) -> optuna.Trial:
    """`study.ask()`, with heartbeats from now until the trial is told (where the storage keeps them): a
    worker killed at any moment, even before its trial runs, leaves a trial that goes stale."""
    trial = study.ask()
    if isinstance(storage, optuna.storages.RDBStorage):
        trial_id = _trial_id(storage, study, trial.number)
        storage.record_heartbeat(trial_id)
        threading.Thread(target=_beat_while_running, args=(storage, trial_id), daemon=True,
                         name=f"heartbeat-{trial.number}").start()
    return trial


def _beat_while_running(storage: BaseStorage, trial_id: int) -> None:
    while True:
        time.sleep(heartbeat_interval())
        try:
            if storage.get_trial(trial_id).state != TrialState.RUNNING:
                return
            storage.record_heartbeat(trial_id)
        except Exception:  # noqa: BLE001 - a storage hiccup: the next beat tries again
            continue


class Heartbeat:
    """Around a claimed trial's work: on leaving with an exception (an interrupt, a bug) the trial is failed
    without an `error`, giving its point back. (Its heartbeats are sent from `asked` on.)"""

    def __init__(self, study: optuna.Study, storage: BaseStorage, trial: optuna.Trial):
        self.study, self.storage, self.trial = study, storage, trial

    def __enter__(self) -> "Heartbeat":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if kind is not None:
            release(self.study, self.storage, self.trial)


def release(study: optuna.Study, storage: BaseStorage, trial: optuna.Trial) -> None:
    """An interrupted trial gives its point back (if it is still running)."""
    trial_id = _trial_id(storage, study, trial.number)
    if storage.get_trial(trial_id).state == TrialState.RUNNING:
        try:
            storage.set_trial_user_attr(trial_id, "role", "interrupted")
            study.tell(trial, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

"""Optuna storages and studies shared by tune workers on any number of machines: open a storage (Optuna's heartbeats,
gated by this worker's progress, and Optuna's retry of the trials whose heartbeats stopped), create, check or drop a
study, and the lock under which a worker fixes its trial's point."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, RDBStorage, RetryHeartbeatStaleTrialCallback

from specbench.core.errors import OneLineError, one_line
from specbench.core import progress

DEFAULT_STORAGE_FILE = "study.db"
HEARTBEAT_ENV = "SPECBENCH_HEARTBEAT_S"  # seconds between a running trial's heartbeats (default 10)
MAX_RETRY = 3  # a trial whose worker died is retried (as a new trial, same point) at most this many times


class ScaleOutError(OneLineError, ValueError):
    """Bad input to a shared tune (a storage that cannot be opened or shared, a study of another tune); one line."""


def quiet_optuna() -> None:
    """Optuna's per-trial log lines (a duplicate or surplus trial is logged as a failure) and its experimental-feature
    warnings are noise in specbench's output."""
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    optuna.logging.set_verbosity(optuna.logging.ERROR)


def heartbeat_interval() -> int:
    """Seconds between heartbeats; a trial silent for six intervals is stale."""
    return max(1, int(os.environ.get(HEARTBEAT_ENV, "10")))


def storage_url(storage: str | None, out_dir: Path) -> str:
    """The default: a SQLite file in the output folder."""
    return storage if storage is not None else f"sqlite:///{(out_dir / DEFAULT_STORAGE_FILE).resolve()}"


class ProgressStorage(RDBStorage):
    """An RDB storage whose heartbeats stop when this worker stops making progress (see `progress`): a worker hung in
    a point stops counting as alive although Optuna's heartbeat thread still runs."""

    def record_heartbeat(self, trial_id: int) -> None:
        if not progress.stalled():
            super().record_heartbeat(trial_id)


_OPENED: dict[str, BaseStorage] = {}  # one storage (one connection pool) per URL per process


def open_storage(url: str, *, attempts: int = 5) -> BaseStorage:
    """An RDB storage from an SQLAlchemy URL (postgresql, mysql, sqlite), opened once per process (each opening holds a
    pool of connections: a server's connection limit is shared by every worker). Workers that start together on a new
    database race to create Optuna's tables: the losers try again (an IntegrityError, or SQLite's "table ... already
    exists")."""
    quiet_optuna()
    if url in _OPENED and _same_file(_OPENED[url]):
        return _OPENED[url]
    close_storage(url)
    if "://" not in url:
        raise ScaleOutError(f"--storage {url}: a journal file keeps no heartbeats, so a worker that dies (on this "
                            "machine or another sharing the file) would hold its trial forever; use postgresql://... "
                            "for workers on several machines, or the default SQLite file for --workers N on one")
    for attempt in range(attempts):
        try:
            _OPENED[url] = _open_storage(url)
            return _OPENED[url]
        except ScaleOutError as error:
            racing = "IntegrityError" in str(error) or "already exists" in str(error)
            if not racing or attempt == attempts - 1:
                raise
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


def _same_file(storage: BaseStorage) -> bool:
    """Whether a SQLite storage's connections still reach the file at its path (not one deleted, or replaced, since
    they were opened); always for a server's database."""
    if not isinstance(storage, RDBStorage) or storage.engine.dialect.name != "sqlite":
        return True
    path, inode = storage.engine.url.database, getattr(storage, "_specbench_inode", None)
    return inode is not None and os.path.exists(path) and os.stat(path).st_ino == inode


def close_storage(url: str) -> None:
    """Drop this process's storage of `url` and its connections (before its SQLite file is deleted)."""
    storage = _OPENED.pop(url, None)
    if isinstance(storage, RDBStorage):
        storage.engine.dispose()


def _open_storage(url: str) -> BaseStorage:
    try:
        connect_args: dict[str, Any] = {}
        if url.startswith("sqlite"):
            connect_args = {"timeout": 60}  # several local workers take turns on one file
        elif url.startswith("postgresql"):
            connect_args = {"connect_timeout": 10}
        interval = heartbeat_interval()
        # a RUNNING trial whose worker sent no heartbeat for grace_period seconds is failed by the next worker that
        # looks (Optuna does at the start of every trial), on any machine, and retried as a new trial of its point
        storage = ProgressStorage(url, engine_kwargs={"connect_args": connect_args}, heartbeat_interval=interval,
                                  grace_period=6 * interval,
                                  heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY))
    except Exception as error:  # noqa: BLE001 - any driver's connection error becomes one line
        raise ScaleOutError(f"--storage: cannot open {masked(url)}: {one_line(error, limit=300)}") from None
    if url.startswith("sqlite"):
        _serialize_sqlite(storage)
    return storage


def _serialize_sqlite(storage: RDBStorage) -> None:
    """Every SQLite transaction takes the write lock as it begins (BEGIN IMMEDIATE): Optuna hands out a waiting trial
    (a retry) with a read then an update, which two processes on a deferred transaction could both win."""
    from sqlalchemy import event

    @event.listens_for(storage.engine, "connect")
    def _no_implicit_transactions(connection, record) -> None:
        connection.isolation_level = None

    @event.listens_for(storage.engine, "begin")
    def _begin_immediate(connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    storage.engine.dispose()  # connections opened before the listeners are dropped
    storage._specbench_inode = os.stat(storage.engine.url.database).st_ino  # see _same_file


@contextmanager
def proposal_lock(storage: BaseStorage, study_name: str) -> Iterator[None]:
    """Exclusive across every worker of `study_name`, on any machine: a PostgreSQL or MySQL advisory lock (released by
    the server when the holder's connection drops, a worker killed with it), a file lock beside a SQLite file (one
    machine). A worker reads the study and fixes its trial's point under it, so no two trials ever hold one point and
    the trial budget is counted exactly."""
    assert isinstance(storage, RDBStorage)
    engine = storage.engine
    key = int.from_bytes(hashlib.sha256(f"specbench:{study_name}".encode()).digest()[:8], "big", signed=True)
    dialect = engine.dialect.name
    if dialect == "sqlite":
        database = engine.url.database
        with open(f"{database}.{key & 0xFFFFFFFF:08x}.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return
    from sqlalchemy import text

    lock, unlock = {"postgresql": ("SELECT pg_advisory_lock(:k)", "SELECT pg_advisory_unlock(:k)"),
                    "mysql": ("SELECT GET_LOCK(:k, -1)", "SELECT RELEASE_LOCK(:k)")}[dialect]
    argument = key if dialect == "postgresql" else f"specbench-{key}"
    with engine.connect() as connection:
        connection.execute(text(lock), {"k": argument})
        try:
            yield
        finally:
            connection.execute(text(unlock), {"k": argument})


def check_study(storage: BaseStorage, name: str, attrs: dict[str, Any]) -> bool:
    """Whether `name` exists; a study created with another search space or objective is refused."""
    try:
        summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    except Exception as error:  # noqa: BLE001
        raise ScaleOutError(f"--storage: cannot read studies: {one_line(error, limit=300)}") from None
    existing = next((s for s in summaries if s.study_name == name), None)
    if existing is None:
        return False
    stored = existing.user_attrs.get("specbench")
    if stored is not None and stored != attrs:
        differs = next(key for key in sorted(set(stored) | set(attrs)) if stored.get(key) != attrs.get(key))
        raise ScaleOutError(f"study {name!r} was created with another {differs.replace('_', ' ')}; "
                            "use --study NAME for a new study, or --fresh to replace it")
    return True


def open_study(storage: BaseStorage, name: str, attrs: dict[str, Any], *, directions: list[str],
               sampler: optuna.samplers.BaseSampler, pruner: optuna.pruners.BasePruner) -> optuna.Study:
    study = optuna.create_study(storage=storage, study_name=name, directions=directions, sampler=sampler,
                                pruner=pruner, load_if_exists=True)
    if "specbench" not in study.user_attrs:
        study.set_user_attr("specbench", attrs)
    return study


def delete_study(storage: BaseStorage, name: str) -> None:
    """--fresh: drop a study, if it exists."""
    try:
        optuna.delete_study(study_name=name, storage=storage)
    except KeyError:
        pass  # not created yet


def masked(url: str) -> str:
    """The URL with its password hidden: safe to print and to write to a file."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)

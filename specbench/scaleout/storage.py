"""Optuna storages and studies shared by workers: open a storage (with heartbeats where it keeps them),
create or check a study, drop one."""

from __future__ import annotations

import re
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

from specbench.core.errors import OneLineError, one_line
from specbench.scaleout.liveness import heartbeat_interval, requeue_callback

DEFAULT_STORAGE_FILE = "study.db"


class ScaleOutError(OneLineError, ValueError):
    """Bad input to a shared run or tune (a storage that cannot be opened, a study of another run); one line."""


def quiet_optuna() -> None:
    """Optuna's per-trial log lines and experimental-feature warnings are noise in specbench's output; so is
    its warning that heartbeats are meant for `optimize` (specbench sends them itself, see liveness)."""
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def storage_url(storage: str | None, out_dir: Path) -> str:
    """The default: a SQLite file in the output folder."""
    return storage if storage is not None else f"sqlite:///{(out_dir / DEFAULT_STORAGE_FILE).resolve()}"


def open_storage(url: str, *, attempts: int = 5) -> BaseStorage:
    """Any Optuna storage: an SQLAlchemy URL (sqlite, postgresql, mysql) or a journal file path. Workers
    that start together on a new database race to create Optuna's tables: the losers try again (an
    IntegrityError, or SQLite's "table ... already exists")."""
    quiet_optuna()
    for attempt in range(attempts):
        try:
            return _open_storage(url)
        except ScaleOutError as error:
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
        interval = heartbeat_interval()
        # a RUNNING trial whose worker sent no heartbeat for grace_period seconds is failed by the next
        # worker that looks (fail_stale_trials), on any machine: its point is then free again
        return RDBStorage(url, engine_kwargs={"connect_args": connect_args}, skip_compatibility_check=False,
                          heartbeat_interval=interval, grace_period=6 * interval,
                          heartbeat_stale_trial_callback=requeue_callback)
    except Exception as error:  # noqa: BLE001 - any driver's connection error becomes one line
        raise ScaleOutError(f"--storage: cannot open {masked(url)}: {one_line(error, limit=300)}") from None


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

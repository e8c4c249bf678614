"""Scale-out: two `specbench tune` worker processes share one study, on the default SQLite storage and on a
real PostgreSQL server (started by .ci/run; its URL in SPECBENCH_TEST_POSTGRES_URL). The study ends with
exactly the requested number of finished trials, no point run twice and no point proposed twice; `--workers 2`
does the same locally."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import optuna
import pytest

from specbench.scaleout.claims import verdict

GRID = Path(__file__).parent / "fixtures" / "synthetic-grid"
TRIALS = 12
POSTGRES = os.environ.get("SPECBENCH_TEST_POSTGRES_URL")


def assert_shared_without_duplicates(storage: str, study: str) -> None:
    trials = optuna.load_study(study_name=study, storage=storage).trials
    finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(finished) == TRIALS
    points = [t.user_attrs["point_id"] for t in finished]
    assert len(set(points)) == TRIALS, "a point was run twice"
    # a trial proposes only points nobody holds: no duplicates; a failure is a trial past the budget (two workers
    # asking for the last trial at once) or one whose worker stopped, not lost work
    assert all(t.user_attrs.get("role") in ("surplus", "stale", "interrupted") for t in trials if t.state.name == "FAIL")
    assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]


def two_workers(tmp_path: Path, storage_args: list[str], study: str) -> None:
    command = [sys.executable, "-m", "specbench.cli", "tune", "--replay", str(GRID), "--trials", str(TRIALS),
               "--study", study, "--out", str(tmp_path / "out"), *storage_args]
    processes = [subprocess.Popen([*command, "--seed", str(seed)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for seed in (0, 1)]
    outputs = [p.communicate(timeout=300) for p in processes]
    for process, (stdout, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_worker_processes_share_one_study(tmp_path, backend):
    study = f"scale-{uuid.uuid4().hex[:8]}"
    if backend == "sqlite":
        two_workers(tmp_path, [], study)  # the default storage: study.db in the shared output folder
        storage = f"sqlite:///{tmp_path / 'out' / 'study.db'}"
    else:
        if not POSTGRES:
            pytest.skip("SPECBENCH_TEST_POSTGRES_URL is not set (.ci/run starts a local PostgreSQL server and sets it)")
        two_workers(tmp_path, ["--storage", POSTGRES], study)
        storage = POSTGRES
    for temperature in ("0", "0.8"):
        assert_shared_without_duplicates(storage, f"{study}-t{temperature}-p1")


def test_local_workers_share_the_default_study(tmp_path):
    from typer.testing import CliRunner

    from specbench.cli import app

    result = CliRunner().invoke(app, ["tune", "--replay", str(GRID), "--trials", str(TRIALS), "--workers", "2",
                                      "--study", "local", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    for temperature in ("0", "0.8"):
        assert_shared_without_duplicates(storage, f"local-t{temperature}-p1")


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_a_trial_is_judged_after_every_earlier_trial_has_all_its_parameters():
    """Parameters are set one at a time: a trial whose point is half set must not look unclaimed."""
    study = optuna.create_study(sampler=optuna.samplers.PartialFixedSampler({"draft": "small", "gamma": 3},
                                                                            optuna.samplers.RandomSampler()))
    first, second = study.ask(), study.ask()  # both propose small at gamma 3
    first.suggest_categorical("draft", ["small", "large"])  # its gamma is not set yet
    second.suggest_categorical("draft", ["small", "large"])
    second.suggest_int("gamma", 1, 4)

    def finish_first():
        time.sleep(0.2)
        first.suggest_int("gamma", 1, 4)
        verdict(study, first, budget=None)

    thread = threading.Thread(target=finish_first)
    thread.start()
    assert verdict(study, second, budget=None) == "duplicate"
    thread.join()

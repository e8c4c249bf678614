"""Scale-out of `specbench run`: two processes share one sweep through an Optuna study, on SQLite and on a
real PostgreSQL server (started by .ci/run; its URL in SPECBENCH_TEST_POSTGRES_URL), and `--workers 2`
locally. Every planned point ends in the run's files exactly once, with all its requests."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import optuna
import pytest

from test_sweep import N_POINTS, assert_each_point_once, project, read, run_cli  # noqa: F401 - a fixture

POSTGRES = os.environ.get("SPECBENCH_TEST_POSTGRES_URL")


def assert_study_claims_each_point_once(storage: str, study: str) -> None:
    trials = optuna.load_study(study_name=study, storage=storage).trials
    completed = [t.params["point_id"] for t in trials if t.state.name == "COMPLETE"]
    assert len(completed) == N_POINTS and len(set(completed)) == N_POINTS
    assert all(t.user_attrs.get("role") == "duplicate" for t in trials if t.state.name == "FAIL")
    assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]


def two_processes(project: Path, storage: str, study: str) -> None:
    command = [sys.executable, "-m", "specbench.cli", "run", "tiny.toml", "--storage", storage, "--study", study,
               "--out", "out"]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // 2))}  # two processes share the cores
    processes = [subprocess.Popen(command, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in processes]
    for process, (stdout, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stdout + stderr


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_processes_share_one_sweep(project, backend):
    study = f"run-scale-{uuid.uuid4().hex[:8]}"
    if backend == "sqlite":
        storage = f"sqlite:///{project / 'shared.db'}"
    else:
        if not POSTGRES:
            pytest.skip("SPECBENCH_TEST_POSTGRES_URL is not set (.ci/run starts a local PostgreSQL server and sets it)")
        storage = POSTGRES
    two_processes(project, storage, study)
    assert_each_point_once(project / "out")
    assert_study_claims_each_point_once(storage, study)


def test_local_workers_share_one_sweep(project):
    result = run_cli("tiny.toml", "--workers", "2", "--out", "out")
    assert result.exit_code == 0, result.output
    assert_each_point_once(project / "out")
    assert_study_claims_each_point_once(f"sqlite:///{project / 'out' / 'study.db'}", "tiny-run")


def test_a_joined_sweep_that_is_done_runs_nothing_again(project):
    assert run_cli("tiny.toml", "--study", "again", "--out", "out").exit_code == 0
    before = read(project / "out")[1]
    result = run_cli("tiny.toml", "--study", "again", "--out", "out")
    assert result.exit_code == 0, result.output
    after = read(project / "out")[1]
    assert after["output_sha"].tolist() == before["output_sha"].tolist()
    assert after["e2e_ms"].tolist() == before["e2e_ms"].tolist()  # the same measurements, not a rerun


def test_unreachable_storage_is_one_line_and_writes_nothing(project):
    result = run_cli("tiny.toml", "--storage", "postgresql+psycopg2://nobody@127.0.0.1:9/none", "--out", "out")
    assert result.exit_code == 2
    assert result.output.strip().startswith("error: --storage: cannot open postgresql+psycopg2://nobody@127.0.0.1:9/none: ")
    assert len(result.output.strip().splitlines()) == 1
    assert not (project / "out").exists()

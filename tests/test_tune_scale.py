"""Scale-out of `specbench tune` on Optuna's own distributed study: workers in separate processes, each with its own
host identity and output folder as separate machines would have, share one study on a real PostgreSQL server (started
by .ci/run; its URL in SPECBENCH_TEST_POSTGRES_URL) or on the default SQLite file. A worker killed mid-trial has its
trial retried elsewhere; the budget stays exact; no point is evaluated twice; the verification runs once; workers with
the same host name neither crash nor duplicate; a worker hung in a point stops counting as alive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import optuna
import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from test_tune import project  # noqa: F401 - a fixture
from tiny import tiny_profile

GRID = Path(__file__).parent / "fixtures" / "synthetic-grid"
TRIALS = 12
POSTGRES = os.environ.get("SPECBENCH_TEST_POSTGRES_URL")
needs_postgres = pytest.mark.skipif(not POSTGRES, reason="SPECBENCH_TEST_POSTGRES_URL is not set (.ci/run starts a "
                                                          "local PostgreSQL server and sets it)")


def finished_trials(storage: str, study: str) -> list[optuna.trial.FrozenTrial]:
    return [t for t in optuna.load_study(study_name=study, storage=storage).trials if t.state.name in
            ("COMPLETE", "PRUNED")]


def assert_exact_and_once(storage: str, study: str, budget: int) -> list[optuna.trial.FrozenTrial]:
    trials = optuna.load_study(study_name=study, storage=storage).trials
    finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(finished) == budget, "the budget is exact across workers"
    points = [t.user_attrs["point_id"] for t in finished]
    assert len(set(points)) == budget, "a point was run twice"
    assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]
    return trials


def worker(command: list[str], *, host: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    return subprocess.Popen([sys.executable, "-m", "specbench.cli", *command], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "SPECBENCH_HOST": host, **(env or {})})


def replay_workers(tmp_path: Path, storage_args: list[str], study: str, *, hosts: list[str], seed: int = 0):
    processes = [worker(["tune", "--replay", str(GRID), "--trials", str(TRIALS), "--study", study, "--seed", str(seed),
                         "--out", str(tmp_path / f"out-{index}"), *storage_args], host=host)
                 for index, host in enumerate(hosts)]
    for process in processes:
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stdout + stderr


@needs_postgres
def test_three_workers_on_postgresql_one_killed_mid_trial_finish_the_budget_exactly_each_point_once(project):
    """Three boxes tune tiny models; box 0 is killed with kill -9 while its trial runs a point. Optuna fails that
    trial once its heartbeats stop, a retry of its point runs on another box; exactly the budget finishes, no point
    is evaluated on two boxes."""
    study, budget = f"kill-{uuid.uuid4().hex[:8]}", 6
    # points long enough (about a second each) to be caught mid-point
    (project / "tiny.toml").write_text(tiny_profile(gamma=(1, 3), temperature=(0.0,), max_new_tokens=48, repeats=6,
                                                    warmup=0, ngram=(1, 2)))
    command = ["tune", "tiny.toml", "--trials", str(budget), "--storage", POSTGRES, "--study", study, "--no-prune"]
    env = {"SPECBENCH_HEARTBEAT_S": "1", "OMP_NUM_THREADS": "1"}  # stale after 6 s without a heartbeat
    boxes = [worker([*command, "--out", f"box{index}"], host=f"box{index}", env=env, cwd=project) for index in range(3)]
    name, killed, deadline = f"{study}-t0-p1", None, time.monotonic() + 240
    storage = optuna.storages.RDBStorage(POSTGRES)  # one connection pool for the polling
    while killed is None and time.monotonic() < deadline and boxes[0].poll() is None:
        try:
            trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
        except KeyError:  # not created yet
            trials = []
        running = [t for t in trials if t.state.name == "RUNNING" and "point_id" in t.user_attrs
                   and t.user_attrs.get("worker", "").startswith("box0:")]
        if running and any(t.state.name == "COMPLETE" for t in trials):
            os.kill(boxes[0].pid, signal.SIGKILL)
            killed = running[0]
        time.sleep(0.02)
    assert killed is not None, "box 0 should be killed mid-trial"
    boxes[0].wait()
    for box in boxes[1:]:
        stdout, stderr = box.communicate(timeout=300)
        assert box.returncode == 0, stdout + stderr

    trials = assert_exact_and_once(POSTGRES, name, budget)
    # the killed trial as stored once box 0 is dead: the polled copy above can be torn (PostgreSQL read the trial's
    # parameters and its attributes in separate statements while box 0 wrote them; CI once saw its point_id without
    # its gamma), the stored one is whole
    stale = next(t for t in trials if t.number == killed.number)
    assert stale.state.name == "FAIL" and "error" not in stale.user_attrs
    assert stale.user_attrs["point_id"] == killed.user_attrs["point_id"] and stale.params.items() >= killed.params.items()
    retry = next(t for t in trials if t.system_attrs.get("failed_trial") == killed.number)
    assert retry.state.name in ("COMPLETE", "PRUNED") and retry.params == stale.params
    assert not retry.user_attrs["worker"].startswith("box0:")
    # each box evaluated its own points: none twice across boxes (baselines apart: every box measures its own)
    evaluated = []
    for index in range(3):
        points = project / f"box{index}" / "points.parquet"
        if points.exists():
            ids = pd.read_parquet(points)["point_id"]
            evaluated += [point for point in ids if not point.startswith("baseline")]
    assert len(evaluated) == len(set(evaluated))
    assert killed.user_attrs["point_id"] not in pd.read_parquet(project / "box0" / "points.parquet")["point_id"].tolist()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_workers_with_one_host_name_and_one_seed_share_a_study_without_crash_or_duplicate(tmp_path, backend):
    """Containers or cloned images: the same host name, the same seed, so the same proposals; the proposal lock gives
    each point to one trial."""
    study = f"same-{uuid.uuid4().hex[:8]}"
    if backend == "sqlite":
        storage = f"sqlite:///{tmp_path / 'shared.db'}"
    else:
        if not POSTGRES:
            pytest.skip("SPECBENCH_TEST_POSTGRES_URL is not set (.ci/run starts a local PostgreSQL server and sets it)")
        storage = POSTGRES
    replay_workers(tmp_path, ["--storage", storage], study, hosts=["clone", "clone", "clone"])
    for temperature in ("0", "0.8"):
        trials = assert_exact_and_once(storage, f"{study}-t{temperature}-p1", TRIALS)
        assert all(t.user_attrs.get("role") in ("surplus", "duplicate") for t in trials if t.state.name == "FAIL")


def test_local_workers_share_the_default_study(tmp_path):
    result = CliRunner().invoke(app, ["tune", "--replay", str(GRID), "--trials", str(TRIALS), "--workers", "2",
                                      "--study", "local", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    for temperature in ("0", "0.8"):
        assert_exact_and_once(storage, f"local-t{temperature}-p1", TRIALS)


@needs_postgres
def test_the_verification_runs_once_for_the_study(tmp_path):
    """Three boxes reach the verification together: one runs it, the others name that one."""
    name = f"verify-{uuid.uuid4().hex[:8]}"
    script = ("import sys, time; from specbench.scaleout.storage import open_storage; "
              "from specbench.tune.shared import verify_once\n"
              "def run():\n    time.sleep(1.0)\n    open(sys.argv[2], 'a').write(sys.argv[1] + '\\n')\n"
              f"print(verify_once(open_storage({POSTGRES!r}), {name!r}, worker=sys.argv[1], run=run))\n")
    ran = tmp_path / "ran.txt"
    boxes = [subprocess.Popen([sys.executable, "-c", script, f"box{i}", str(ran)], stdout=subprocess.PIPE, text=True)
             for i in range(3)]
    answers = [box.communicate(timeout=120)[0].strip() for box in boxes]
    assert all(box.returncode == 0 for box in boxes)
    (verifier,) = ran.read_text().split()
    assert sorted(answers) == sorted(["None", verifier, verifier])


def test_a_running_trial_that_has_not_claimed_the_verification_does_not_hold_it(tmp_path):
    """The race CI once met (three boxes on PostgreSQL: one box named a second that never verified, the third ran it):
    another worker's trial is running but has not taken the lock yet, or stepped aside already. Only a claim made
    under the lock holds the verification; this worker runs it, and a later one names this one."""
    from specbench.scaleout.storage import open_storage
    from specbench.tune.shared import verify_once

    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    study = optuna.create_study(storage=storage, study_name="verify")
    study.ask().set_user_attr("worker", "box-before-the-lock")  # running, unclaimed
    ran: list[str] = []
    assert verify_once(storage, "verify", worker="box1", run=lambda: ran.append("box1")) is None
    assert ran == ["box1"]
    assert verify_once(storage, "verify", worker="box2", run=lambda: ran.append("box2")) == "box1"
    assert ran == ["box1"]


def test_a_worker_hung_in_a_point_stops_counting_as_alive_and_its_trial_is_retried(tmp_path, monkeypatch):
    """Optuna's heartbeat thread keeps running while the objective hangs; the storage records no heartbeat once the
    worker made no progress for the stall limit, so the trial goes stale, is retried, and the hung worker, when it
    wakes, goes on instead of crashing on Optuna's "Cannot tell a FAIL trial"."""
    from specbench.scaleout.storage import open_storage
    from specbench.tune.shared import optimize

    monkeypatch.setenv("SPECBENCH_HEARTBEAT_S", "1")
    monkeypatch.setenv("SPECBENCH_STALL_S", "2")
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=open_storage(url), study_name="hung", direction="maximize")
    wake, abandoned = threading.Event(), []

    def objective(trial):
        x = trial.suggest_categorical("x", [1, 2, 3])
        if trial.number == 0:
            wake.wait(timeout=60)  # hung: no progress marked
        return float(x)

    hung = threading.Thread(target=optimize, args=(study, objective),
                            kwargs={"budget": 1, "size": 3, "on_abandoned": abandoned.append})
    hung.start()
    other = optuna.load_study(study_name="hung", storage=open_storage(url))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not other.trials:  # the worker's first trial not asked for yet
        time.sleep(0.05)
    while time.monotonic() < deadline and other.trials[0].state.name == "RUNNING":
        time.sleep(0.5)
        optuna.storages.fail_stale_trials(other)  # what every other worker does before each trial
    assert other.trials[0].state.name == "FAIL", "the hung trial should go stale"
    wake.set()
    hung.join(timeout=60)
    assert not hung.is_alive() and abandoned == [0]
    retry = next(t for t in other.trials if t.system_attrs.get("failed_trial") == 0)
    assert retry.state.name == "COMPLETE" and retry.params == other.trials[0].params


def test_bad_storage_input_is_one_line_exit_2(tmp_path):
    runner = CliRunner()
    journal = runner.invoke(app, ["tune", "--replay", str(GRID), "--storage", str(tmp_path / "journal.log"),
                                  "--out", str(tmp_path / "out")])
    assert journal.exit_code == 2 and len(journal.output.strip().splitlines()) == 1
    assert "a journal file keeps no heartbeats" in journal.output
    # --fresh while another worker's trial runs in the study: refused, nothing deleted
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    from specbench.scaleout.storage import open_storage

    storage = open_storage(url)
    study = optuna.create_study(storage=storage, study_name="busy-t0-p1", direction="maximize")
    running = study.ask()
    storage.record_heartbeat(running._trial_id)
    fresh = runner.invoke(app, ["tune", "--replay", str(GRID), "--storage", url, "--study", "busy", "--fresh",
                                "--out", str(tmp_path / "out")])
    assert fresh.exit_code == 2 and len(fresh.output.strip().splitlines()) == 1, fresh.output
    assert "has 1 trial(s) running" in fresh.output
    assert optuna.load_study(study_name="busy-t0-p1", storage=url).trials[0].state.name == "RUNNING"

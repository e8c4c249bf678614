"""Scale-out liveness: a worker killed mid-point on another host gives its point back through Optuna's
heartbeats, and a worker elsewhere finishes it, once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import optuna

from test_sweep import N_POINTS, assert_each_point_once, project  # noqa: F401 - a fixture


def test_a_worker_killed_on_another_host_has_its_point_finished_elsewhere_once(project):
    storage, study = f"sqlite:///{project / 'shared.db'}", "liveness"
    command = [sys.executable, "-m", "specbench.cli", "run", "tiny.toml", "--storage", storage, "--study", study,
               "--out", "out"]
    env = {**os.environ, "SPECBENCH_HEARTBEAT_S": "1"}  # stale after 6 s without a heartbeat
    elsewhere = subprocess.Popen(command, cwd=project, env={**env, "SPECBENCH_HOST": "elsewhere"},
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed = None
    deadline = time.monotonic() + 120
    while killed is None and time.monotonic() < deadline and elsewhere.poll() is None:
        try:
            trials = optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
        except KeyError:  # the study is not created yet
            trials = []
        running = [t for t in trials if t.state.name == "RUNNING" and t.user_attrs.get("proposed")
                   and t.user_attrs.get("worker", "").startswith("elsewhere:")]
        if len([t for t in trials if t.state.name == "COMPLETE"]) >= 2 and running:
            os.kill(elsewhere.pid, signal.SIGKILL)
            killed = running[0]
        time.sleep(0.01)
    elsewhere.wait()
    assert killed is not None, "the worker elsewhere should be killed mid-sweep"

    here = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert here.returncode == 0, here.stdout + here.stderr
    assert_each_point_once(project / "out")
    loaded = optuna.load_study(study_name=study, storage=storage)
    completed = [t.params["point_id"] for t in loaded.trials if t.state.name == "COMPLETE"]
    assert sorted(completed) == sorted(set(completed)) and len(completed) == N_POINTS
    stale = loaded.trials[killed.number]
    assert stale.state.name == "FAIL" and "error" not in stale.user_attrs
    assert loaded.user_attrs[f"requeued_{killed.number}"]["point"] == killed.params
    finisher = next(t for t in loaded.trials if t.state.name == "COMPLETE" and t.params == killed.params)
    assert not finisher.user_attrs["worker"].startswith("elsewhere:")
    assert not [t for t in loaded.trials if t.state.name in ("RUNNING", "WAITING")]

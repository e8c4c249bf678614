"""The GPU box as teams run it: workers split over its GPUs whatever `server.gpus` lists, and a container whose NVML
numbers processes in the host's pid namespace. This machine has no GPU: NVML is answered by a stand-in
(tests/nvml_standin/pynvml.py) for an 8-GPU box whose processes are this machine's real ones — the launched
llama-server, a `sleep` playing another team's job — driving the real worker processes, placement, summaries and
contention; and by facts supplied to the same logic where a reading is enough."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from installed_engines import needs_llama_server
from specbench.backends.server import placement
from specbench.cli import app
from specbench.core import contention, gpus
from specbench.core.gpus import Sample
from test_gpus import BOX, Facts, sample

STANDIN = Path(__file__).parent / "nvml_standin"
HOST = 7_000_000  # the stand-in's host pid offset: a container's engine as NVML numbers it


# --- facts ---------------------------------------------------------------------------------------------------------

def test_a_launch_claims_its_own_pids_or_what_appeared_with_it():
    before = [sample(0, processes={4242: 900.0}, used_mb=1500.0)]
    shared = [sample(0, processes={4242: 900.0, 101: 20000.0}, used_mb=21500.0)]
    assert gpus.claim(before, shared, own={100, 101}) == gpus.Claim("pid", frozenset({101}), {BOX[0].uuid: 1500.0})
    # in a pod, NVML numbers the engine's processes in the host's namespace: none of them is the run's 100 or 101
    pod = [sample(0, processes={4242: 900.0, HOST + 101: 20000.0, HOST + 102: 300.0}, used_mb=21800.0)]
    assert gpus.claim(before, pod, own={100, 101}) == gpus.Claim("launch", frozenset({HOST + 101, HOST + 102}),
                                                                 {BOX[0].uuid: 1500.0})
    unlisted = [sample(0, processes={}, used_mb=21500.0)]  # a runtime that lists no process
    assert gpus.claim([sample(0, processes={}, used_mb=1500.0)], unlisted, own={100}).match is None


def test_in_a_pod_the_engines_memory_is_its_processes_and_it_is_not_another_process():
    own = {100, 101}  # the run and its engine, as the pod numbers them
    claimed = gpus.Claim("launch", frozenset({HOST + 101}), {BOX[0].uuid: 1500.0})
    readings = [(t, [sample(0, processes={4242: 900.0, HOST + 101: mb}, used_mb=1500.0 + mb)])
                for t, mb in ((0.0, 20000.0), (1.0, 24000.0), (2.0, 22000.0))]
    window = gpus.summarize(readings, own_pids=own, claim=claimed)
    assert (window.peak_memory_mb, window.memory_source, window.process_match, window.other_processes) == \
        (24000.0, "processes", "launch", 1)  # 4242 was there before the launch: another team's
    # before claims: the engine summed over no process of its own (0 MiB), and itself counted as another's
    unclaimed = gpus.summarize(readings, own_pids=own)
    assert (unclaimed.peak_memory_mb, unclaimed.memory_source, unclaimed.other_processes) == (25500.0, "device", 2)
    # NVML lists nothing: the GPU's used memory less what it held before the launch
    hidden = [(t, [Sample(s.uuid, s.utilization_pct, s.memory_used_mb, s.energy_mj, {}) for s in samples])
              for t, samples in readings]
    window = gpus.summarize(hidden, own_pids=own, claim=gpus.Claim(None, frozenset(), {BOX[0].uuid: 1500.0}))
    assert (window.peak_memory_mb, window.memory_source, window.process_match) == \
        (24000.0, "device-since-launch", None)
    assert window.as_columns()["gpu_process_match"] is None


def test_contention_in_a_pod_leaves_out_what_the_launch_claimed():
    facts = Facts([{BOX[0].uuid: sample(0, processes={HOST + 101: 1.0, HOST + 102: 1.0, 4242: 1.0})}])
    with contention.ConditionsProbe(gpus=lambda: (BOX[0].uuid,), claimed=lambda: {HOST + 101, HOST + 102},
                                    nvml=facts) as probe:
        pass
    assert probe.conditions.gpu_other_processes == 1


def test_a_relaunch_in_a_pod_waits_for_the_processes_the_launch_claimed():
    claim = gpus.Claim("launch", frozenset({HOST + 101}), {BOX[0].uuid: 1500.0})
    freed = Facts([{BOX[0].uuid: sample(0, processes={HOST + 101: 30000.0, 4242: 900.0})}] * 3
                  + [{BOX[0].uuid: sample(0, processes={4242: 900.0})}])
    placement.wait_released([101], BOX[:1], claim=claim, alive=lambda pid: False, nvml=freed, timeout_s=10,
                            poll_s=0.001)
    assert freed.calls == 4  # before: the run's pid 101 is never listed, so it waited for nothing
    # NVML lists no process: until the GPU uses no more than before the launch (within the slack)
    unlisted = gpus.Claim(None, frozenset(), {BOX[0].uuid: 1500.0})
    draining = Facts([{BOX[0].uuid: sample(0, processes={}, used_mb=used)} for used in (30000.0, 9000.0, 2000.0)])
    placement.wait_released([101], BOX[:1], claim=unlisted, alive=lambda pid: False, nvml=draining, timeout_s=10,
                            poll_s=0.001)
    assert draining.calls == 3
    stuck = Facts([{BOX[0].uuid: sample(0, processes={}, used_mb=9000.0)}])
    with pytest.raises(gpus.GpuError) as held:
        placement.wait_released([101], BOX[:1], claim=unlisted, alive=lambda pid: False, nvml=stuck, timeout_s=0.05,
                                poll_s=0.001)
    assert str(held.value) == ("the previous engine was stopped 0.05 s ago, but its GPUs still use more than before it "
                               "launched: 7500 MiB on GPU 0: the next launch would not get its memory (kill it, then "
                               "run again)")


# --- the stand-in box ----------------------------------------------------------------------------------------------

@pytest.fixture
def box(monkeypatch):
    """This process on the stand-in's 8-GPU box: its NVML, opened anew; the token its processes carry."""
    token = uuid.uuid4().hex
    monkeypatch.setenv("SPECBENCH_NVML_STANDIN", token)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(STANDIN), os.environ.get("PYTHONPATH")))))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.syspath_prepend(str(STANDIN))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setattr(gpus, "_NVML", [])
    yield token
    sys.modules.pop("pynvml", None)


def _server_profile() -> str:
    """test_server_faults' llama-server profile on two of the box's GPUs: one prompt, one point per launch."""
    from test_server_faults import PROFILE

    edits = (('name = "faults"', 'name = "box"'), ('[server]\n', '[server]\ngpus = [5, 6]\n'),
             ('["-t", "1", "-np", "2"]', '["-t", "1"]'), ("max_prompts = 4", "max_prompts = 1"),
             ("max_new_tokens = 64", "max_new_tokens = 16"), ("warmup = 1", "warmup = 0"))
    text = PROFILE
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    return text


SERVER_PROFILE = _server_profile()


def test_each_worker_runs_a_profile_narrowed_to_its_own_gpus(box):
    from specbench.profile import profile_from_dict
    from specbench.scaleout.workers import worker_slots
    import tomllib

    profile = profile_from_dict(tomllib.loads(SERVER_PROFILE.replace("gpus = [5, 6]", "gpus = [7, 2, 4, 5]\n"
                                                                      "tensor_parallel = 2")))
    slots = worker_slots(profile, workers=2)
    assert [slot.visible for slot in slots] == ["7,2", "4,5"]
    assert [slot.profile.server.gpus for slot in slots] == [(7, 2), (4, 5)]
    assert [slot.profile.model_copy(update={"server": profile.server}) for slot in slots] == [profile, profile]


@pytest.mark.parametrize(("args", "message"), [
    (["--workers", "3"], "box.toml: --workers 3: 3 worker(s) x 1 GPU(s) each need 3 GPUs; 2 are visible; use fewer "
                         "workers or a smaller server.tensor_parallel"),
    (["--workers", "2"], "box.toml: --workers 2: 2 worker(s) x 2 GPU(s) each need 4 GPUs; 2 are visible; use fewer "
                         "workers or a smaller server.tensor_parallel"),
])
def test_workers_times_tensor_parallel_beyond_server_gpus_is_one_line_and_writes_nothing(box, tmp_path, monkeypatch,
                                                                                          args, message):
    text = SERVER_PROFILE if args[1] == "3" else SERVER_PROFILE.replace("gpus = [5, 6]", "gpus = [5, 6]\n"
                                                                                          "tensor_parallel = 2")
    (tmp_path / "box.toml").write_text(text)
    monkeypatch.chdir(tmp_path)
    for command in ("run", "tune"):
        result = CliRunner().invoke(app, [command, "box.toml", *args, "--out", "out", "--fresh"])
        assert result.exit_code == 2, result.output[-2000:]
        assert result.output.strip().splitlines()[-1] == f"error: {message}"
        assert not (tmp_path / "out").exists()


@needs_llama_server
def test_two_workers_on_a_pods_gpus_measure_their_engines_and_only_the_other_teams_job(box, tmp_path):
    """`specbench run --workers 2` with server.gpus = [5, 6] on the stand-in box, NVML numbering processes as a pod's
    host does, another team's job on GPU 6 since before the run: each launch runs on its worker's GPU, its memory is
    its own engine's, the job counts as the one other process on GPU 6 and the engine never does."""
    (tmp_path / "box.toml").write_text(SERVER_PROFILE)
    env = {**os.environ, "SPECBENCH_NVML_STANDIN_PIDS": "host", "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen(["sleep", "600"], env={**env, "CUDA_VISIBLE_DEVICES": "6"})
    try:
        result = subprocess.run([sys.executable, "-m", "specbench.cli", "run", "box.toml", "--workers", "2",
                                 "--out", "out"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    finally:
        job.kill()
        job.wait()
    assert result.returncode == 0, result.stderr[-3000:]
    points = pd.read_parquet(tmp_path / "out" / "points.parquet").set_index("point_id")
    launches = json.loads((tmp_path / "out" / "manifest.json").read_text())["server"]["launches"]
    assert sorted(launch["gpus"][0] for launch in launches) in ([5, 6], [5, 5], [6, 6])  # each on its worker's GPU
    for launch in launches:
        point = points.loc[launch["point"]]
        claim = launch["gpu_claim"]
        engine = [pid - HOST for pid in claim["pids"]]
        assert claim["match"] == "launch" and len(engine) == 1 and engine[0] > 0, claim
        assert (point["status"], point["gpu_process_match"], point["gpu_memory_source"]) == \
            ("ok", "launch", "processes")
        assert point["gpu_peak_memory_mb"] > 50  # the engine's resident memory, never 0 MiB
        assert point["gpu_other_processes"] == (1 if launch["gpus"] == [6] else 0)  # the job, never the engine

"""GPUs as resources: which a process sees, the groups launches and workers take, what a window shows, who else is on
them, and waiting for a stopped engine's memory. This machine has no GPU: NVML's answers are supplied as the facts
an 8-GPU box gives (`Facts`), to the same logic that reads the real ones; the refusals a CPU machine gives are run
for real, through the CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from installed_engines import LLAMA_SERVER, needs_llama_server
from specbench.backends.server import placement
from specbench.cli import app
from specbench.core import contention, gpus
from specbench.core.gpus import Gpu, Sample
from specbench.engines import ENGINES
from specbench.profile.server import ServerSpec

BOX = [Gpu(index=i, uuid=f"GPU-{i:08x}-aaaa", name="NVIDIA H100 80GB HBM3", memory_total_mb=81559.0,
           driver_version="580.65.06", cuda_driver_version="13.0", sm_clock_max_mhz=1980, memory_clock_max_mhz=2619,
           power_limit_w=700.0, mig_mode="disabled") for i in range(8)]


class Facts:
    """NVML's answers as a list of readings, one per call to `sample` (the last repeats)."""

    def __init__(self, readings: list[dict[str, Sample]], box: list[Gpu] = BOX):
        self.readings, self.box, self.calls = readings, box, 0

    def gpus(self) -> list[Gpu]:
        return list(self.box)

    def sample(self, uuids):
        reading = self.readings[min(self.calls, len(self.readings) - 1)]
        self.calls += 1
        return [reading[uuid] for uuid in uuids]


def sample(gpu: int, *, processes: dict[int, float | None], energy_mj: float | None = 0.0, busy: float = 50.0,
           used_mb: float = 1000.0) -> Sample:
    return Sample(BOX[gpu].uuid, busy, used_mb, energy_mj, processes)


def test_cuda_visible_devices_by_index_or_uuid_in_its_order_up_to_the_first_it_cannot_name():
    assert gpus.visible(BOX, None) == BOX
    assert gpus.visible(BOX, "") == []
    assert [g.index for g in gpus.visible(BOX, "3,1")] == [3, 1]
    assert [g.index for g in gpus.visible(BOX, "GPU-00000005,2")] == [5, 2]  # a unique UUID prefix, as CUDA takes it
    assert [g.index for g in gpus.visible(BOX, "2,9,4")] == [2]  # CUDA ignores what follows an invalid entry
    assert gpus.visible(BOX, "GPU-0000000") == []  # ambiguous prefix: names no GPU
    assert gpus.visible(BOX, "MIG-1234") == []


def test_each_worker_gets_a_disjoint_group_and_too_many_are_refused_in_one_line():
    spec = ServerSpec(engine="vllm", tensor_parallel=2)
    groups = placement.worker_groups(spec, BOX, workers=4)
    assert [[g.index for g in group] for group in groups] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with pytest.raises(gpus.GpuError) as refused:
        placement.worker_groups(spec, BOX, workers=5)
    assert str(refused.value) == ("--workers 5: 5 worker(s) x 2 GPU(s) each need 10 GPUs; 8 are visible; use fewer "
                                  "workers or a smaller server.tensor_parallel")
    chosen = ServerSpec(engine="vllm", gpus=(6, 2), tensor_parallel=1)
    assert [[g.index for g in group] for group in placement.worker_groups(chosen, BOX, workers=2)] == [[6], [2]]
    assert placement.worker_groups(ServerSpec(engine="vllm"), [], workers=3) == []  # a CPU machine: they share it
    with pytest.raises(gpus.GpuError, match="^server.tensor_parallel: no NVIDIA GPU is visible here"):
        placement.worker_groups(spec, [], workers=3)


def test_a_launch_takes_tensor_parallel_gpus_pinned_in_pci_order():
    group = placement.launch_group(ServerSpec(engine="vllm", gpus=(4, 5, 6, 7), tensor_parallel=4), BOX)
    assert placement.launch_env(group) == {"CUDA_VISIBLE_DEVICES": "4,5,6,7", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert placement.launch_env(()) == {}
    # inside worker 1 of 2 (CUDA_VISIBLE_DEVICES=2,3), the launch sees only its group
    inside = gpus.visible(BOX, "2,3")
    assert [g.index for g in placement.launch_group(ServerSpec(engine="vllm", tensor_parallel=2), inside)] == [2, 3]
    with pytest.raises(gpus.GpuError, match=r"^server.tensor_parallel: 4 GPUs per launch, but 2 are available "
                                            r"\(2, 3\); lower tensor_parallel$"):
        placement.launch_group(ServerSpec(engine="vllm", tensor_parallel=4), inside)
    with pytest.raises(gpus.GpuError, match=r"^p.toml: server.gpus: GPU 7 is not visible here \(visible: 2, 3\)"):
        placement.launch_group(ServerSpec(engine="vllm", gpus=(2, 7)), inside, where="p.toml: ")


def test_each_engine_is_told_how_many_gpus_it_has():
    assert ENGINES["vllm"].gpu_args(1) == [] and ENGINES["vllm"].gpu_args(4) == ["--tensor-parallel-size", "4"]
    assert ENGINES["sglang"].gpu_args(2) == ["--tp-size", "2"]
    assert ENGINES["llama.cpp"].gpu_args(1) == ["-ngl", "999", "-ngld", "999"]  # every layer, the draft's too


def test_the_ready_timeout_grows_with_the_weights():
    gib = 2**30
    assert placement.ready_timeout_s(None, [16 * gib]) == 300 + 30 * 16  # an 8B model in bf16: 13 minutes
    assert placement.ready_timeout_s(None, [140 * gib, 1 * gib]) == 300 + 30 * 141  # a 70B and its draft
    assert placement.ready_timeout_s(None, [None]) == 900  # a hub id: its size (and first download) unknown
    assert placement.ready_timeout_s(42.0, [140 * gib]) == 42.0


def test_a_window_counts_the_runs_own_processes_and_the_energy_between_its_ends():
    own = {100, 101}
    readings = [
        (0.0, [sample(0, processes={100: 20000.0, 555: 500.0}, energy_mj=1_000_000.0, busy=10.0),
               sample(1, processes={101: 19000.0}, energy_mj=2_000_000.0, busy=30.0)]),
        (1.0, [sample(0, processes={100: 30000.0, 555: 500.0, 777: 10.0}, energy_mj=1_400_000.0, busy=90.0),
               sample(1, processes={101: 29000.0}, energy_mj=2_350_000.0, busy=70.0)]),
        (2.0, [sample(0, processes={100: 25000.0}, energy_mj=1_500_000.0, busy=50.0),
               sample(1, processes={101: 24000.0}, energy_mj=2_500_000.0, busy=50.0)]),
    ]
    window = gpus.summarize(readings, own_pids=own)
    assert window.peak_memory_mb == 59000.0 and window.memory_source == "processes"
    assert window.energy_j == pytest.approx(500.0 + 500.0)  # (1.5 - 1.0) + (2.5 - 2.0) kJ
    assert window.utilization_pct == pytest.approx(50.0)
    assert (window.duration_s, window.samples, window.gpus, window.other_processes) == (2.0, 3, 2, 2)
    # where NVML hides per-process memory (a container without the host's pid namespace): the devices' used memory
    hidden = [(t, [Sample(s.uuid, s.utilization_pct, s.memory_used_mb, None, {pid: None for pid in s.process_memory_mb})
                   for s in samples]) for t, samples in readings]
    window = gpus.summarize(hidden, own_pids=own)
    assert (window.peak_memory_mb, window.memory_source, window.energy_j) == (2000.0, "device", None)


def test_the_monitor_reads_at_both_ends_and_between():
    facts = Facts([{BOX[3].uuid: sample(3, processes={os.getpid(): 100.0 * i}, energy_mj=1000.0 * i)}
                   for i in range(1, 200)])
    with gpus.GpuMonitor(facts, [BOX[3].uuid], lambda: [os.getpid()], interval_s=0.01) as monitor:
        import time

        time.sleep(0.1)
    window = monitor.window
    assert window.samples == facts.calls >= 3
    assert window.peak_memory_mb == 100.0 * window.samples  # the last reading held most
    assert window.energy_j == pytest.approx((window.samples - 1) * 1000.0 / 1e3)


def test_contention_counts_others_on_the_points_gpus_only_and_never_the_runs_own_tree():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # e.g. an engine's worker
    try:
        facts = Facts([{BOX[0].uuid: sample(0, processes={os.getpid(): 1.0, child.pid: 1.0, 4242: 1.0}),
                        BOX[1].uuid: sample(1, processes={5151: 1.0, 6161: 1.0})}])
        with contention.ConditionsProbe(gpus=lambda: (BOX[0].uuid,), nvml=facts) as probe:
            pass
        assert probe.conditions.gpu_other_processes == 1  # 4242; the sibling worker's GPU 1 is not the point's
        with contention.ConditionsProbe(nvml=facts) as unmeasured:
            pass
        assert unmeasured.conditions.gpu_other_processes is None  # no GPU: not measured
    finally:
        child.kill()
        child.wait()


def test_a_relaunch_waits_for_the_old_engines_gpu_memory_and_says_what_it_still_holds():
    freed = Facts([{BOX[0].uuid: sample(0, processes={900: 30000.0})}] * 3 + [{BOX[0].uuid: sample(0, processes={})}])
    placement.wait_released([900], BOX[:1], alive=lambda pid: False, nvml=freed, timeout_s=10, poll_s=0.001)
    assert freed.calls == 4
    stuck = Facts([{BOX[0].uuid: sample(0, processes={900: 30000.0})}])
    with pytest.raises(gpus.GpuError) as held:
        placement.wait_released([900, 901], BOX[:1], alive=lambda pid: pid == 901, nvml=stuck, timeout_s=0.05,
                                poll_s=0.001)
    assert str(held.value) == ("the previous engine was stopped 0.05 s ago, but process(es) 901 still run and it still "
                               "holds 30000 MiB on GPU 0: the next launch would not get its memory (kill it, then run "
                               "again)")


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a machine with an NVIDIA driver")
def test_without_an_nvidia_driver_nvml_is_none_and_no_gpu_is_reported():
    assert gpus.open_nvml() is None and gpus.machine_gpus(None) == []


@needs_llama_server
@pytest.mark.parametrize(("setting", "message"), [
    ("gpus = [0]", "server.gpus: no NVIDIA GPU is visible here (NVML found none): run on the GPU machine, or remove "
                   "server.gpus to serve on the CPU"),
    ("tensor_parallel = 2", "server.tensor_parallel: no NVIDIA GPU is visible here (NVML found none): run on the GPU "
                            "machine, or remove server.tensor_parallel to serve on the CPU"),
])
def test_a_gpu_profile_on_a_machine_without_one_is_one_line_and_writes_nothing(tmp_path, monkeypatch, setting,
                                                                                message):
    from test_server_faults import PROFILE

    (tmp_path / "p.toml").write_text(PROFILE.replace("[server]\n", f"[server]\n{setting}\n"))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["run", "p.toml", "--out", "out"])
    assert result.exit_code == 2, result.output[-2000:]
    assert result.output.strip().splitlines()[-1] == f"error: p.toml: {message}"
    assert not (tmp_path / "out").exists()


def test_gpu_flags_in_extra_args_are_refused_where_specbench_sets_them():
    from specbench.backends.server import checks
    from specbench.profile import ProfileError

    checks.check_extra_args(("-ngl", "20"), "p.toml: ")  # on a CPU machine llama.cpp's -ngl is the user's
    with pytest.raises(ProfileError, match=r"^p.toml: server.extra_args: --tensor-parallel-size is set by specbench "
                                           r"on GPUs"):
        checks.check_extra_args(("--tensor-parallel-size=2",), "p.toml: ", gpu_flags=ENGINES["vllm"].gpu_flags)


def test_profile_keys_for_gpus_are_checked_where_the_profile_enters():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="must list each GPU once"):
        ServerSpec(engine="vllm", gpus=(1, 1))
    with pytest.raises(ValidationError, match="4 GPUs per launch, but server.gpus lists 2"):
        ServerSpec(engine="vllm", gpus=(0, 1), tensor_parallel=4)
    with pytest.raises(ValidationError, match="not used with url"):
        ServerSpec(engine="vllm", url="http://h:8000", tensor_parallel=2)
    assert SimpleNamespace(**ServerSpec(engine="vllm").model_dump()).ready_timeout_s is None


def test_auto_does_not_fall_back_to_the_cpu_silently_where_the_driver_shows_gpus():
    import torch

    from specbench.decoding.devices import DeviceError, resolve_device

    if torch.cuda.is_available():
        pytest.skip("this torch uses the GPUs")
    assert resolve_device("auto", driver_gpus=0).type == "cpu"
    with pytest.raises(DeviceError, match=r"^the NVIDIA driver shows 8 GPU\(s\), but this torch \(.*\) cannot use "
                                          r"them; install a torch built for the driver's CUDA"):
        resolve_device("auto", driver_gpus=8)


def test_a_price_per_gpu_hour_is_multiplied_by_the_gpus_a_replica_uses():
    from specbench.profile import ProfileError, profile_from_dict, with_overrides

    data = {"name": "p", "backend": "server", "server": {"engine": "vllm", "tensor_parallel": 4},
            "target": {"model": "m"}, "sweep": {"gamma": [1], "temperature": [0.0]}, "workload": {"prompts": "builtin:mixed"},
            "cost": {"usd_per_gpu_hour": 2.5}}
    profile = profile_from_dict(data)
    assert (profile.gpus_per_replica, profile.usd_per_replica_hour) == (4, 10.0)
    assert with_overrides(profile, usd_per_hour=7.0).usd_per_replica_hour == 7.0  # the flag prices the replica
    inprocess = profile_from_dict({**data, "backend": "native", "server": None})
    assert inprocess.usd_per_replica_hour == 2.5
    with pytest.raises(ProfileError, match=r"cost.usd_per_gpu_hour: give the price of a replica-hour or of a GPU-hour, "
                                           r"not both \(remove one\)"):
        profile_from_dict({**data, "cost": {"usd_per_hour": 1.0, "usd_per_gpu_hour": 2.5}})


def test_a_hub_model_is_pinned_by_revision_and_a_gated_one_names_the_token_and_the_licence():
    from huggingface_hub.errors import GatedRepoError

    from specbench.models.load import _hub_error, _hub_identity, resolve_model, split_revision

    assert split_revision("meta-llama/Llama-3.1-8B-Instruct@0e9e39f") == ("meta-llama/Llama-3.1-8B-Instruct", "0e9e39f")
    assert split_revision("Qwen/Qwen2.5-0.5B") == ("Qwen/Qwen2.5-0.5B", None)
    source = resolve_model("meta-llama/Llama-3.1-8B-Instruct@0e9e39f")
    assert (source.kind, source.location, source.revision) == ("hub", "meta-llama/Llama-3.1-8B-Instruct", "0e9e39f")
    assert _hub_identity("meta-llama/Llama-3.1-8B-Instruct@0e9e39f", None) == "meta-llama/Llama-3.1-8B-Instruct@0e9e39f"
    try:  # as the hub raises it for a gated repository, wrapped by transformers into an OSError
        try:
            url = "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/resolve/main/config.json"
            response = SimpleNamespace(status_code=401, headers={}, request=None)  # the fields the error reads
            raise GatedRepoError(f"401 Client Error. Cannot access gated repo for url {url}", response=response)
        except GatedRepoError as gated:
            raise OSError("You are trying to access a gated repo.") from gated
    except OSError as error:
        message = str(_hub_error("meta-llama/Llama-3.1-8B-Instruct@0e9e39f", error))
    assert message == ("'meta-llama/Llama-3.1-8B-Instruct' is a gated model on the Hugging Face hub: accept its "
                       "licence at https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct and set HF_TOKEN to a token "
                       "of that account (or run `hf auth login`)")
    assert "offline?" in str(_hub_error("x/y", OSError("Connection refused")))


def test_an_in_process_target_too_large_for_one_gpu_is_refused_before_loading(tmp_path):
    from specbench.backends.inprocess import gpu_fit_problem
    from specbench.models.load import parameter_count
    from tiny import tiny_llama

    gib = 2**30
    assert gpu_fit_problem(16 * gib, 79 * gib, dtype="torch.bfloat16") is None  # an 8B on an H100
    assert gpu_fit_problem(140 * gib, 79 * gib, dtype="torch.bfloat16") == (
        "needs 140.0 GiB for its weights in bfloat16, more than 90% of the GPU's 79.0 GiB free: in-process a target "
        'runs on one GPU; use backend = "server" with server.tensor_parallel to spread it over GPUs, or a smaller target')
    model = tiny_llama()
    model.save_pretrained(tmp_path / "m")
    assert parameter_count(str(tmp_path / "m")) == sum(p.numel() for p in model.state_dict().values())


def test_a_points_gpu_window_gives_its_peak_memory_and_energy_per_output_token():
    import pandas as pd

    from specbench.core import summary
    from test_analytic import BASELINE, NGRAM, rows, trace

    point = rows(NGRAM, [trace([(4, 4)] * 5, draft_ms=1.0, verify_ms=12.0, ttft_ms=50.0)] * 2)
    baseline = rows(BASELINE, [trace([(0, 0)] * 24, draft_ms=0.0, verify_ms=10.0, ttft_ms=40.0, gamma=1)] * 2)
    window = gpus.GpuWindow(1, 20480.0, "processes", 87.5, 120.0, 3.0, 13, 0).as_columns()
    context = {BASELINE.point_id: {}, NGRAM.point_id: {**window, "gpu_peak_reserved_mb": 18000.0,
                                                       "other_traffic_tokens": 0.0}}
    points = summary.summarize([BASELINE, NGRAM], pd.concat([baseline, point]), failures={},
                               context=context).set_index("point_id")
    ngram = points.loc[NGRAM.point_id]
    assert ngram["peak_memory_mb"] == 20480.0  # NVML's view of the processes, static caches and graph pools included
    assert ngram["energy_per_output_token_j"] == pytest.approx(120.0 / ngram["output_tokens"])
    assert (ngram["gpu_utilization_pct"], ngram["gpu_samples"], ngram["gpu_memory_source"]) == (87.5, 13, "processes")
    assert not ngram["unstable"]
    assert pd.isna(points.loc[BASELINE.point_id, "energy_per_output_token_j"])  # no GPU watched: nothing invented

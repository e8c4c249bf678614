"""The prepared GPU check (benches/gpu_check.py): its tiny CPU run end to end, and the judging it does on a GPU,
from reports and traces made up to break each check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benches import gpu_check, gpu_models
from benches.gpu_check import choice_deficit, figures, judge_equality
from benches.gpu_models import TINY
from benches.gpu_verdict import NOT_ON_GPU, Check, judge
from specbench.core.gpus import GpuWindow, Sample
from specbench.core.summary import NEAR_TIE_GAP
from specbench.core.trace import StepRecord, Trace
from specbench.decoding.decode import generate
from specbench.decoding.proposers import BaselineProposer

ROOT = Path(__file__).parents[1]
GPU_CHECKS = ("cuda graphs captured", "energy per token", "nothing left on the gpu", "unit tests on cuda")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path_factory.mktemp("gpu-check")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OUT": str(out)}
    done = subprocess.run([sys.executable, "-m", "benches.gpu_check", "--tiny", "--device", "cpu"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    return done, json.loads((out / gpu_check.REPORT_FILE).read_text())


def test_the_tiny_cpu_run_passes_and_writes_every_figure(tiny_run):
    done, report = tiny_run
    assert done.returncode == 0, done.stderr[-2000:]
    assert report["ok"] is True and report["device"] == "cpu" and report["compile"] is False
    assert report["settings"]["layers"] == TINY.layers and report["machine"]["torch"] == torch.__version__
    assert set(report["models"]) == {"target", "self-draft", "small draft", "eagle3"}
    assert report["models"]["eagle3"]["optimizer_steps"] == TINY.head_epochs  # one batch an epoch
    assert [(run["mode"], run["method"]) for run in report["runs"]] == [
        (mode, method) for mode in ("eager", "static") for method in gpu_check.METHODS]
    for run in report["runs"]:
        assert run["requests"] == TINY.prompts and run["output_tokens"] == TINY.prompts * TINY.max_new_tokens
        assert run["tokens_per_s"] > 0 and len(run["output_ids"]) == TINY.prompts
        assert run["greedy"] == {"compared": TINY.prompts, "identical": TINY.prompts, "near_ties": [], "broken": []}
        assert run["max_choice_deficit"] <= NEAR_TIE_GAP
        # a GPU figure on a CPU is None, with its reason, never a made-up value
        assert {key: run[key] for key in gpu_check.GPU_FIGURES} == dict.fromkeys(gpu_check.GPU_FIGURES)
        assert run["unmeasured"] == dict.fromkeys(gpu_check.GPU_FIGURES, NOT_ON_GPU)
    accepted = {run["method"]: run["acceptance_rate"] for run in report["runs"] if run["mode"] == "eager"}
    assert accepted["baseline"] is None and accepted["self-draft"] == 1.0
    assert 0 < accepted["small draft"] < 1 and accepted["eagle3"] > 0
    static = {run["method"]: run["output_ids"] for run in report["runs"] if run["mode"] == "static"}
    assert all(ids == report["runs"][0]["output_ids"] for ids in static.values())
    checks = {check["name"]: (check["status"], check["detail"]) for check in report["checks"]}
    assert checks["greedy equality"][0] == checks["greedy validity"][0] == "passed"
    assert {name: checks[name][0] for name in GPU_CHECKS} == dict.fromkeys(GPU_CHECKS, "skipped")
    assert all(checks[name][1].startswith(NOT_ON_GPU) for name in GPU_CHECKS)
    assert "leftover" in report and "unit_tests" not in report


def test_the_tiny_run_prints_one_row_per_run_and_every_check(tiny_run):
    done, report = tiny_run
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"gpu check on {report['machine']['device']}: float32")
    assert [line.split()[:2] for line in lines[2:10]] == [[mode, method.split()[0]] for mode in ("eager", "static")
                                                            for method in gpu_check.METHODS]
    assert "passed  greedy equality: 16 of 16 requests identical" in done.stdout
    assert "skipped unit tests on cuda: not on a GPU (make test runs them on the CPU)" in done.stdout


def trace(output_ids: tuple[int, ...], gaps: tuple[float, ...]) -> Trace:
    return Trace(prompt_tokens=3, output_ids=output_ids, ttft_s=0.1, token_times_s=(0.1,) * len(output_ids),
                 steps=(StepRecord(drafted=3, accepted=2, emitted=3),), gamma=3, top2_gap=gaps)


def test_a_divergence_is_a_near_tie_only_where_the_top_two_logits_nearly_tie():
    reference = [trace((5, 6, 7), (1.0, 1.0, 1.0)), trace((5, 6, 7), (1.0, 0.02, 1.0)), trace((5, 6, 7), (1.0,) * 3)]
    outputs = [trace((5, 6, 7), (1.0, 1.0, 1.0)), trace((5, 9, 9), (1.0, 0.05, 1.0)), trace((5, 6, 8), (1.0,) * 3)]
    judged = judge_equality(reference, outputs)
    assert judged == {"compared": 3, "identical": 1, "near_ties": [{"prompt": 1, "position": 1, "top2_gap": 0.02}],
                      "broken": [{"prompt": 2, "position": 2, "top2_gap": 1.0}]}


def test_greedy_validity_finds_a_token_the_target_would_not_choose():
    model = gpu_models.llama(TINY, 2, device=torch.device("cpu"), dtype=torch.float32)
    prompt = [5, 9, 13, 22, 5, 9]
    output = generate(model, BaselineProposer(torch.device("cpu")), prompt, gamma=1, temperature=0.0,
                      max_new_tokens=12).output_ids
    assert choice_deficit(model, prompt, output) < 1e-4
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + list(output[:5])])).logits[0, -1]
    worst = int(logits.argmin())  # the least likely token in place of output token 5
    planted = (*output[:5], worst, *output[6:])
    assert choice_deficit(model, prompt, planted) == pytest.approx(float(logits.max() - logits.min()), rel=1e-4)


def test_a_gpu_window_gives_energy_per_token_and_this_process_memory():
    pid = os.getpid()
    window = GpuWindow(gpus=1, peak_memory_mb=5000.0, memory_source="processes", utilization_pct=80.0, energy_j=24.0,
                       duration_s=2.0, samples=20, other_processes=0)
    monitor = SimpleNamespace(window=window, readings=[(0.0, [Sample("GPU-1", 80.0, 5100.0, 0.0, {pid: 5000.0})])])
    watch = SimpleNamespace(cuda=False, why="no NVML", device=torch.device("cpu"))
    run = figures([trace((5, 6, 7), ()), trace((5, 6, 7, 8, 9), ())], watch=watch, monitor=monitor)
    assert run["energy_j_per_token"] == 3.0 and run["nvml_peak_memory_mb"] == 5000.0 and run["gpu_window_s"] == 2.0
    assert run["tokens_per_s"] == 8 / 0.2 and run["mean_accepted_length"] == 3.0 and run["acceptance_rate"] == 2 / 3
    elsewhere = SimpleNamespace(window=window, readings=[(0.0, [Sample("GPU-1", 80.0, 5100.0, 0.0, {1: 5000.0})])])
    unseen = figures([trace((5, 6, 7), ())], watch=watch, monitor=elsewhere)  # NVML never listed this process
    assert unseen["nvml_peak_memory_mb"] is None
    assert unseen["unmeasured"]["nvml_peak_memory_mb"] == "NVML gave none for this GPU and process"
    assert figures([trace((5,), ())], watch=watch, monitor=None)["unmeasured"]["energy_j"] == "no NVML"


def cuda_report(**changes) -> dict:
    """A passing report of a CUDA run, with `changes` made to it."""
    run = {"mode": "compiled", "method": "eagle3", "tokens_per_s": 100.0, "mean_accepted_length": 2.0,
           "acceptance_rate": 0.4, "peak_memory_reserved_mb": 9000.0, "nvml_peak_memory_mb": 9500.0,
           "energy_j_per_token": 0.5, "unmeasured": {}, "max_choice_deficit": 0.03,
           "greedy": {"compared": 4, "identical": 3, "near_ties": [{"prompt": 0, "position": 9, "top2_gap": 0.01}],
                      "broken": []}}
    report = {"device": "cuda", "dtype": "bfloat16", "compile": True, "runs": [run],
              "static": {"cuda_graphs": {"captured": 5, "skipped": 0}},
              "leftover": {"allocated_bytes": 0, "reserved_bytes": 0, "nvml_process_mb": 600.0,
                           "nvml_context_mb": 520.0},
              "unit_tests": {"tests/test_decoding.py": {"status": "passed", "tests": 20, "skipped": 1}}}
    for key, value in changes.items():
        if key in run:
            run[key] = value
        elif isinstance(value, dict) and isinstance(report.get(key), dict):
            report[key] = {**report[key], **value}
        else:
            report[key] = value
    return report


def statuses(report: dict) -> dict[str, str]:
    return {check.name: check.status for check in judge(report)}


def test_a_passing_cuda_report_passes_every_check():
    checks = judge(cuda_report())
    assert all(check.status == "passed" for check in checks), checks
    assert Check("unit tests on cuda", "passed", "tests/test_decoding.py: 19 passed") in checks
    assert Check("greedy equality", "passed", "3 of 4 requests identical to the eager baseline's output, 1 first "
                 f"parted from it at a near-tie (top-2 gap <= {NEAR_TIE_GAP})") in checks


@pytest.mark.parametrize("changes, failed", [
    ({"greedy": {"compared": 4, "identical": 3, "near_ties": [], "broken": [{"prompt": 1, "position": 4,
                                                                          "top2_gap": 2.5}]}}, "greedy equality"),
    ({"max_choice_deficit": 1.5}, "greedy validity"),
    ({"static": {"cuda_graphs": {"captured": 0, "skipped": 0}}}, "cuda graphs captured"),
    ({"static": {"cuda_graphs": {"captured": 5, "skipped": 1}}}, "cuda graphs captured"),
    ({"static": {"cuda_graphs": {"captured": None, "skipped": 0}}}, "cuda graphs captured"),
    ({"leftover": {"allocated_bytes": 2**21}}, "nothing left on the gpu"),
    ({"leftover": {"nvml_process_mb": 2600.0}}, "nothing left on the gpu"),
    ({"unit_tests": {"tests/test_decoding.py": {"status": "failed"}}}, "unit tests on cuda"),
    ({"unit_tests": {"tests/test_decoding.py": {"status": "timed out"}}}, "unit tests on cuda"),
    ({"error": "RuntimeError: CUDA out of memory"}, "completed"),
])
def test_each_check_fails_on_what_it_guards(changes, failed):
    assert [name for name, status in statuses(cuda_report(**changes)).items() if status == "failed"] == [failed]


def test_what_a_gpu_run_could_not_measure_is_skipped_with_its_reason():
    missing = cuda_report(energy_j_per_token=None, unmeasured={"energy_j_per_token": "NVML gave none"},
                          leftover={"nvml_process_mb": None})
    checks = {check.name: check for check in judge(missing)}
    assert checks["energy per token"] == Check("energy per token", "skipped", "NVML gave none")
    assert checks["nothing left on the gpu"].status == "passed"
    assert checks["nothing left on the gpu"].detail.endswith("NVML: no figure for this process")
    killed = cuda_report(runs=[], leftover=None, unit_tests=None, static={"cuda_graphs": None})  # stopped early
    assert statuses(killed) == dict.fromkeys(
        ("greedy equality", "greedy validity", *GPU_CHECKS), "skipped")

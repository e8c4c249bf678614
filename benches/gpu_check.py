"""The prepared GPU check (`make gpu-check`): specbench's decoding at a realistic size on one GPU, in a few minutes
and with no network (docs/gpu.md says what it builds and verifies, and why).

Seeded random weights from configs: a ~1.1B Llama-shaped target in bf16 (hidden 2048, 16 layers, vocabulary 32000),
its copy as the self-draft, a small draft of its first 4 layers, and an EAGLE-3 head distilled on the device. Baseline,
EAGLE-3, small draft and self-draft decode fixed prompts greedily at gamma 3, eagerly and compiled (static caches,
torch.compile with CUDA graphs). Checked: greedy equality with the eager baseline (up to near-ties), greedy validity
of every token (teacher-forced), CUDA graphs captured, energy per token recorded, nothing left on the GPU, the
decoding unit tests on CUDA. Recorded per run: tokens/s, mean accepted length, acceptance, peak GPU memory, energy.
OUT/gpu-check.json is rewritten after every phase; the exit is 1, with one line naming each failed check, when one
fails. `--tiny --device cpu` runs the same code at toy sizes in seconds (static caches, not compiled), and every
figure or check that needs a GPU says "not on a GPU".

    python -m benches.gpu_check [--device cuda|cpu] [--tiny] [--compile] [--out DIR] [--time-limit-s 450]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from xml.etree import ElementTree

import torch
import transformers

from specbench.core import gpus
from specbench.core.errors import one_line
from specbench.core.summary import NEAR_TIE_GAP
from specbench.core.trace import Trace, first_divergence
from specbench.decoding.decode import generate
from specbench.decoding.devices import device_name, gpu_uuid, resolve_device, resolve_dtype, synchronize
from specbench.decoding.eagle3 import Eagle3Proposer
from specbench.decoding.proposers import BaselineProposer, DraftModelProposer
from specbench.decoding.static import BUCKETS, StaticModel, captured_cuda_graphs
from specbench.models.eagle3 import Eagle3Head

from benches.gpu_models import FULL, TINY, Settings, build_models, distil_head, prompt_ids
from benches.gpu_verdict import NOT_ON_GPU, judge, render

ROOT = Path(__file__).parents[1]
REPORT_FILE = "gpu-check.json"
METHODS = ("baseline", "eagle3", "small draft", "self-draft")  # the self-draft compiles longest: last
DRAFT_STEP_TOKENS = 2  # a draft model's step feeds the bonus token and the last accepted draft (as backends.native)
WARMUP_TOKENS = 8  # each run's untimed first request
GPU_FIGURES = ("peak_memory_reserved_mb", "peak_memory_allocated_mb", "nvml_peak_memory_mb", "energy_j",
               "energy_j_per_token", "gpu_utilization_pct", "gpu_window_s")
# on CUDA; the sampling tests that decode 4,000 seeds each take minutes there and stay with `make test` on the CPU
UNIT_TESTS = (("tests/test_decoding.py", ()),
              ("tests/test_sampling.py", ("-k", "not test_generate_matches_the_target_distribution and not "
                                                "test_a_broken_acceptance_rule_is_caught")))


# --- measuring ---------------------------------------------------------------------------------------------------

class Watch:
    """NVML beside the allocator on a CUDA device: this process's memory and the GPU's energy around each run."""

    def __init__(self, device: torch.device):
        self.device, self.cuda, self.uuid = device, device.type == "cuda", gpu_uuid(device)
        self.nvml = gpus.open_nvml() if self.cuda else None
        self.why = NOT_ON_GPU if not self.cuda else "NVML does not answer (no nvidia-ml-py, or no NVIDIA driver)"
        if self.nvml is not None:
            try:
                self.nvml.sample([self.uuid])
            except Exception as error:  # noqa: BLE001 - NVMLError and its kin: the NVML figures are then None
                self.nvml, self.why = None, f"NVML does not know GPU {self.uuid} ({one_line(error)})"

    def monitor(self) -> gpus.GpuMonitor | nullcontext:
        if self.nvml is None:
            return nullcontext()
        return gpus.GpuMonitor(self.nvml, [self.uuid], lambda: [os.getpid()], interval_s=0.1)

    def process_mb(self) -> float | None:
        """What NVML says this process holds on the GPU (None: not listed, or no NVML)."""
        return None if self.nvml is None else self.nvml.sample([self.uuid])[0].process_memory_mb.get(os.getpid())


def run_method(target, proposer, prompts: list[list[int]], settings: Settings,
               watch: Watch) -> tuple[list[Trace], dict]:
    """One untimed request, then every prompt greedily at gamma: the traces and the run's figures."""
    decode = {"gamma": settings.gamma, "temperature": 0.0}
    generate(target, proposer, prompts[0], max_new_tokens=WARMUP_TOKENS, **decode)
    if watch.cuda:
        synchronize(watch.device)
        torch.cuda.reset_peak_memory_stats(watch.device)
    with watch.monitor() as monitor:
        traces = [generate(target, proposer, ids, max_new_tokens=settings.max_new_tokens, **decode) for ids in prompts]
    return traces, figures(traces, watch=watch, monitor=monitor)


def figures(traces: list[Trace], *, watch: Watch, monitor: gpus.GpuMonitor | None) -> dict:
    """A run's figures; each GPU figure it could not take is None, and `unmeasured` says why."""
    tokens, seconds = sum(trace.output_tokens for trace in traces), sum(trace.e2e_s for trace in traces)
    steps = [step for trace in traces for step in trace.steps]
    drafted = sum(step.drafted or 0 for step in steps)
    gpu = dict.fromkeys(GPU_FIGURES)
    if watch.cuda:
        gpu.update(peak_memory_reserved_mb=torch.cuda.max_memory_reserved(watch.device) / 2**20,
                   peak_memory_allocated_mb=torch.cuda.max_memory_allocated(watch.device) / 2**20)
    window = monitor.window if monitor is not None else None
    if window is not None:
        seen = any(os.getpid() in sample.process_memory_mb for _, samples in monitor.readings for sample in samples)
        gpu.update(nvml_peak_memory_mb=window.peak_memory_mb if seen and window.memory_source == "processes" else None,
                   energy_j=window.energy_j, gpu_utilization_pct=window.utilization_pct, gpu_window_s=window.duration_s,
                   energy_j_per_token=window.energy_j / tokens if window.energy_j is not None else None)
    why = watch.why if window is None else "NVML gave none for this GPU and process"
    return {"requests": len(traces), "output_tokens": tokens, "decode_s": seconds, "tokens_per_s": tokens / seconds,
            "mean_accepted_length": sum(step.emitted for step in steps) / len(steps) if steps else None,
            "acceptance_rate": sum(step.accepted for step in steps) / drafted if drafted else None,
            **gpu, "unmeasured": {key: why for key, value in gpu.items() if value is None}}


def decode_runs(mode: str, target, draft: Callable[[str], object], head: Eagle3Head, aux, prompts,
                settings: Settings, watch: Watch, record: Callable[[dict], None]) -> None:
    """Every method on one decoding path, each run handed to `record` as it ends: `target` is a module (eager) or a
    StaticModel, `draft(name)` gives that draft's; `aux` is the target's StaticModel that keeps the head's states
    (None: the proposer hooks the module itself)."""
    module = target if isinstance(target, torch.nn.Module) else target.model
    vocab_size = module.get_output_embeddings().weight.shape[0]
    for method in METHODS:
        if method == "baseline":
            proposer = BaselineProposer(watch.device)
        elif method == "eagle3":
            proposer = Eagle3Proposer(head, module, device=watch.device, name=method, aux=aux)
        else:
            proposer = DraftModelProposer(draft(method), vocab_size=vocab_size, device=watch.device, name=method)
        traces, measured = run_method(target, proposer, prompts, settings, watch)
        if method == "eagle3" and aux is None:
            proposer.capture.close()  # its hooks off the target before anything compiles it
        record({"mode": mode, "method": method, "traces": traces, **measured})


# --- judging -----------------------------------------------------------------------------------------------------

def judge_equality(reference: list[Trace], traces: list[Trace]) -> dict:
    """Requests identical to the reference, those that first part from it at a near-tie of the target's logits,
    and those that part elsewhere (broken decoding)."""
    parted = [{"prompt": index, "position": found[0], "top2_gap": found[1]}
              for index, (ref, trace) in enumerate(zip(reference, traces, strict=True))
              if (found := first_divergence(trace.output_ids, ref.output_ids, gaps=trace.top2_gap,
                                            reference_gaps=ref.top2_gap))]
    near = [entry for entry in parted if entry["top2_gap"] is not None and entry["top2_gap"] <= NEAR_TIE_GAP]
    return {"compared": len(traces), "identical": len(traces) - len(parted), "near_ties": near,
            "broken": [entry for entry in parted if entry not in near]}


def choice_deficit(target: torch.nn.Module, prompt: list[int], output_ids: tuple[int, ...]) -> float:
    """How far the output's worst token falls below the target's top logit given its own prefix, in one
    teacher-forced forward over prompt + output (0.0: every token is the target's argmax)."""
    device = next(target.parameters()).device
    ids = torch.tensor([prompt + list(output_ids[:-1])], device=device)
    with torch.inference_mode():
        logits = target(input_ids=ids, use_cache=False, logits_to_keep=len(output_ids)).logits[0].float()  # [N, V]
    chosen = logits.gather(1, torch.tensor(output_ids, device=device).view(-1, 1)).squeeze(1)  # [N]
    return float((logits.amax(dim=-1) - chosen).max())


def leftover(watch: Watch, context_mb: float | None) -> dict:
    """What stays on the GPU once every model, cache and graph is gone (the caller dropped its references)."""
    gc.collect()
    torch._dynamo.reset()  # compiled code and inductor's CUDA graph trees, with their memory pools
    gc.collect()
    if not watch.cuda:
        return {}
    from torch._inductor import cudagraph_trees

    cudagraph_trees.reset_cudagraph_trees()  # what dynamo's reset does too, in the torch releases that do it
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:  # the allocator counts cuBLAS's workspaces as allocated
        clear()
    torch.cuda.empty_cache()
    return {"allocated_bytes": torch.cuda.memory_allocated(watch.device),
            "reserved_bytes": torch.cuda.memory_reserved(watch.device),
            "nvml_process_mb": watch.process_mb(), "nvml_context_mb": context_mb}


def unit_tests(deadline: float) -> dict:
    """The decoding unit tests on CUDA (SPECBENCH_TEST_DEVICE), one pytest per file, within the check's time."""
    results = {}
    env = {**os.environ, "SPECBENCH_TEST_DEVICE": "cuda", "SPECBENCH_TEST_BUDGET": "off"}
    for path, options in UNIT_TESTS:
        left = deadline - time.monotonic()
        if left < 30:
            results[path] = {"status": "not run", "reason": f"{max(left, 0):.0f} s left of --time-limit-s"}
            continue
        with tempfile.TemporaryDirectory() as scratch:
            junit = Path(scratch) / "junit.xml"
            command = [sys.executable, "-m", "pytest", path, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                       *options]
            try:
                done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=left)
            except subprocess.TimeoutExpired:
                results[path] = {"status": "timed out", "reason": f"still running after {left:.0f} s"}
                continue
            root = ElementTree.parse(junit).getroot() if junit.exists() else None
        suite = root.find("testsuite") if root is not None and root.tag == "testsuites" else root
        counts = {} if suite is None else {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors",
                                                                                    "skipped")}
        results[path] = {"status": "passed" if done.returncode == 0 else "failed", "exit_code": done.returncode,
                         "options": list(options), **counts, "output_tail": (done.stdout + done.stderr)[-3000:]}
    return results


# --- the check ---------------------------------------------------------------------------------------------------

def machine(device: torch.device) -> dict:
    return {"device": device_name(device), "host": platform.node(), "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "gpus": [asdict(gpu) for gpu in gpus.machine_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"))]}


def check(settings: Settings, *, device: torch.device, compile: bool, deadline: float, report: dict, save,
          progress) -> None:
    """Fill `report` phase by phase, calling `save()` after each: the decoding, what is left, the unit tests."""
    dtype, watch = resolve_dtype(settings.dtype, device), Watch(device)
    report.update(version=1, device=str(device), dtype=settings.dtype, compile=compile, settings=asdict(settings),
                  machine=machine(device), phases_s={})
    context_mb = None
    if watch.cuda:  # NVML's figure for this process once CUDA and cuBLAS are up and nothing is allocated
        square = torch.ones(256, 256, device=device, dtype=dtype)
        float((square @ square).sum())
        del square
        torch.cuda.empty_cache()
        context_mb = watch.process_mb()
    decoding(settings, dtype=dtype, compile=compile, watch=watch, report=report, save=save, progress=progress)
    started = time.perf_counter()
    report["leftover"] = leftover(watch, context_mb)
    report["phases_s"]["leftover"] = time.perf_counter() - started
    save()
    if watch.cuda:
        progress("the decoding unit tests on CUDA")
        started = time.perf_counter()
        report["unit_tests"] = unit_tests(deadline)
        report["phases_s"]["unit_tests"] = time.perf_counter() - started
        save()


def decoding(settings: Settings, *, dtype: torch.dtype, compile: bool, watch: Watch, report: dict, save,
             progress) -> None:
    """Build, distil, decode eagerly then on static caches (each model's steps compiled when its first run needs
    them, the costliest last), judging and saving each run as it ends; every model is gone when this returns."""
    clock, runs = [time.perf_counter()], []

    def done(phase: str) -> None:
        now = time.perf_counter()
        report["phases_s"][phase], clock[0] = now - clock[0], now
        report["runs"] = [{**{key: value for key, value in run.items() if key != "traces"},
                           "output_ids": [list(trace.output_ids) for trace in run["traces"]]} for run in runs]
        save()

    def record(run: dict) -> None:
        run["greedy"] = judge_equality((runs[0] if runs else run)["traces"], run["traces"])
        run["max_choice_deficit"] = max(choice_deficit(models["target"], ids, trace.output_ids)
                                        for ids, trace in zip(prompts, run["traces"]))
        runs.append(run)
        done(f"{run['mode']} {run['method']}")

    progress("building the models")
    models = build_models(settings, device=watch.device, dtype=dtype)
    report["models"] = {name: {"layers": model.config.num_hidden_layers,
                               "parameters": sum(p.numel() for p in model.parameters())}
                        for name, model in models.items()}
    done("models")
    progress("distilling the EAGLE-3 head")
    head, report["models"]["eagle3"] = distil_head(models["target"], settings)
    done("head")
    prompts = report["prompts"] = prompt_ids(settings, settings.prompts, seed=settings.seed + 1)
    progress("decoding eagerly")
    decode_runs("eager", models["target"], models.__getitem__, head, None, prompts, settings, watch, record)
    capacity, statics = settings.prompt_tokens + settings.max_new_tokens + BUCKETS[-1], {}
    report["static"] = {"compile_s": {}}

    def static(name: str) -> StaticModel:
        if name not in statics:
            progress(f"static cache for the {name}" + (", compiling its steps" if compile else ""))
            statics[name] = StaticModel(models[name], capacity=capacity, compile=compile, name=name,
                                        aux_layers=tuple(head.aux_layer_ids) if name == "target" else ())
            statics[name].warm_up(range(1, settings.gamma + 2 if name == "target" else DRAFT_STEP_TOKENS + 1))
            report["static"]["compile_s"][name] = sum(statics[name].compile_s.values())
        return statics[name]

    target = static("target")
    decode_runs("compiled" if compile else "static", target, static, head, target, prompts, settings, watch, record)
    if compile and watch.cuda:
        captured, skipped = captured_cuda_graphs(watch.device)
        report["static"]["cuda_graphs"] = {"captured": captured, "skipped": skipped}
    for built in statics.values():
        built.close()
    save()


def write_report(report: dict, out: Path) -> Path:
    """OUT/gpu-check.json, replaced whole."""
    out.mkdir(parents=True, exist_ok=True)
    path, partial = out / REPORT_FILE, out / f".{REPORT_FILE}.tmp"
    partial.write_text(json.dumps(report, indent=1) + "\n")
    partial.replace(path)
    return path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benches.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="cuda, cuda:N or cpu (default: cuda where there is one)")
    parser.add_argument("--tiny", action="store_true", help="toy sizes (seconds on a CPU) instead of a ~1B target")
    parser.add_argument("--compile", action="store_true", help="compile the static steps on a CPU too (on CUDA "
                        "they always are, with CUDA graphs; inductor takes minutes on a CPU)")
    parser.add_argument("--out", type=Path, default=None, help="where gpu-check.json goes (default: $OUT if set, "
                        "else ./gpu-check)")
    parser.add_argument("--time-limit-s", type=float, default=450.0, help="the unit tests run only within this "
                        "many seconds of the start (default 450)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        device = resolve_device(args.device)
    except ValueError as error:
        sys.exit(f"error: {error}")
    out = args.out or Path(os.environ.get("OUT") or "gpu-check")
    report: dict = {}
    try:
        check(TINY if args.tiny else FULL, device=device, compile=device.type == "cuda" or args.compile,
              deadline=time.monotonic() + args.time_limit_s, report=report, save=lambda: write_report(report, out),
              progress=lambda message: print(f"[gpu-check] {message}", file=sys.stderr, flush=True))
    except Exception as error:  # noqa: BLE001 - whatever the device raised is recorded; the checks then say so
        traceback.print_exc()
        report["error"] = f"{type(error).__name__}: {one_line(error)}"
    checks = judge(report)
    failed = [check for check in checks if check.status == "failed"]
    report.update(ok=not failed, checks=[asdict(check) for check in checks])
    path = write_report(report, out)
    print(render(report, checks))
    print(f"written: {path}")
    if failed:
        sys.exit("gpu check failed: " + "; ".join(f"{check.name} ({check.detail})" for check in failed))


if __name__ == "__main__":
    main()

"""Load the models once and run every request of the bench: each prompt through every (point, backend)
pair, the in-process backends rotating which goes first, every request recorded as a `results.request_row`;
then, where vLLM is installed, the same prompts on vLLM's CPU build (benches.vllm)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from specbench.core import results
from specbench.backends.hf import HfSession
from specbench.backends.inprocess import InProcessSession, LoadedModels, load_models
from specbench.backends.native import NativeSession
from benches import vllm
from specbench.decoding.devices import device_name, resolve_device, resolve_dtype
from specbench.core.errors import one_line
from specbench.profile import Profile, profile_from_dict, with_overrides
from specbench.core.results import PointSpec
from specbench.sweep.plan import plan_points

MODEL = "builtin:smollm2-135m-instruct"
PROMPTS = "builtin:mixed"
# in process, interleaved per prompt: native eager (run.compile off), native with static caches and compiled steps,
# HF generate; then vLLM's CPU build in a child process
BACKENDS = ("native", "compiled", "hf")
ENGINE = "vllm"
WARMUP_TOKENS = 8
HF_FAILURES = (ValueError, TypeError, AttributeError, RuntimeError, NotImplementedError)  # what HF may not support

Progress = Callable[[str], None] | None


@dataclass(frozen=True)
class BenchConfig:
    prompts: int = 6
    max_new_tokens: int = 64
    gamma: int = 3
    ngram_max: int = 3
    repeats: int = 2
    draft: bool = True  # also compare the draft method (int8 self-draft; on a GPU a same-dtype copy)
    compile: bool = True  # also the native backend compiled (static caches; compilation is not timed)
    vllm: Path | None = None  # vLLM's Python: also vLLM's CPU build (fp32 on a CPU only)
    model: str = MODEL
    device: str = "cpu"
    dtype: str = "float32"


@dataclass(frozen=True)
class Measurement:
    config: BenchConfig
    device: str  # the device's name
    threads: int
    specs: tuple[PointSpec, ...]  # the baseline, then ngram and draft at config.gamma, greedy
    prompt_tokens: tuple[int, ...]
    requests: pd.DataFrame  # one results.request_row per request, plus the `backend` that ran it
    skipped: dict[tuple[str, str], str]  # (backend, point_id) -> why it was not measured
    compile: dict | None = None  # the compiled backend's manifest entry: what compilation cost (None: not run)

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends that measured anything, in BACKENDS order, vLLM last."""
        present = set(self.requests["backend"]) if len(self.requests) else set()
        return tuple(backend for backend in (*BACKENDS, ENGINE) if backend in present)


def draft_quantize(device: torch.device, dtype: torch.dtype) -> str | None:
    """The self-draft is an int8 copy where dynamic quantisation works (float32 on a CPU), else a plain copy."""
    return "int8" if device.type == "cpu" and dtype == torch.float32 else None


def bench_profile(config: BenchConfig) -> Profile:
    """The bench as a profile: the target, prompt lookup and (optionally) the self-draft at one gamma, greedy;
    validated like any profile (a bad --model or --device is a ProfileError naming it)."""
    data = {
        "name": "bench", "backend": "native", "device": config.device, "dtype": config.dtype,
        "target": {"model": config.model},
        "drafts": [{"name": "ngram", "method": "ngram", "ngram_min": 1, "ngram_max": config.ngram_max}],
        "sweep": {"gamma": [config.gamma], "temperature": [0.0]},
        "workload": {"prompts": PROMPTS, "max_prompts": config.prompts, "max_new_tokens": config.max_new_tokens},
        "run": {"repeats": config.repeats, "warmup": 1, "seed": 0},
    }
    profile = profile_from_dict(data)
    if not config.draft:
        return profile
    device = resolve_device(profile.device)
    quantize = draft_quantize(device, resolve_dtype(profile.dtype, device))
    draft = {"name": f"self-{quantize or 'copy'}", "method": "draft", "model": config.model,
             **({"quantize": quantize} if quantize else {})}
    return profile_from_dict({**data, "drafts": [*data["drafts"], draft]})


def measure(config: BenchConfig, *, progress: Progress = None) -> Measurement:
    """Load the target and the self-draft once, warm every (point, backend) up, then run each prompt through
    every pair, rotating which backend goes first; then vLLM where config.vllm names its Python."""
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(threads)
    profile = bench_profile(config)
    specs = plan_points(profile)
    models = load_models(profile, observer=_Messages(progress))
    sessions, skipped = _sessions(models, specs, config, progress)
    skipped |= _warm_up(specs, sessions, skipped, progress)
    generate = {(backend, spec.point_id): session.generate_one(spec)
                for backend, session in sessions.items() for spec in specs if (backend, spec.point_id) not in skipped}
    backends = [backend for backend in BACKENDS if backend in sessions]

    rows = []
    for repeat in range(config.repeats):
        for index, (prompt, ids) in enumerate(zip(models.prompts, models.prompt_ids)):
            _report(progress, f"repeat {repeat + 1}/{config.repeats}, prompt {index + 1}/{len(models.prompts)}")
            first = (index + repeat) % len(backends)
            order = backends[first:] + backends[:first]
            seed = profile.run.seed + 1000 * index + repeat
            for spec in specs:
                for backend in order:
                    if (backend, spec.point_id) in generate:
                        trace = generate[backend, spec.point_id](ids, seed, config.max_new_tokens)
                        rows.append({"backend": backend, **results.request_row(
                            spec, point_key=f"bench-{backend}", prompt=prompt, repeat=repeat, seed=seed, trace=trace)})
    requests = pd.DataFrame(rows)
    if config.vllm is not None:
        engine_rows, engine_skipped = _vllm(config, specs, progress)
        requests = pd.concat([requests, engine_rows], ignore_index=True)
        skipped |= engine_skipped
    compiled = sessions.get("compiled")
    return Measurement(config, device_name(models.device), threads, tuple(specs),
                       tuple(len(ids) for ids in models.prompt_ids), requests, skipped,
                       compiled.describe()["compile"] if compiled is not None else None)


def _sessions(models: LoadedModels, specs: list[PointSpec], config: BenchConfig,
              progress: Progress) -> tuple[dict[str, InProcessSession], dict[tuple[str, str], str]]:
    """The in-process backends over the same loaded models. The compiled one compiles every model now (not
    timed); a draft that cannot compile (int8 dynamic quantisation) is skipped there with the reason, and the
    baseline and n-gram points run compiled without it."""
    def native(profile: Profile, compile: bool) -> NativeSession:
        return NativeSession(dataclasses.replace(models, profile=with_overrides(profile, compile=compile)))

    sessions: dict[str, InProcessSession] = {"native": native(models.profile, False), "hf": HfSession(models)}
    skipped: dict[tuple[str, str], str] = {}
    if config.compile:
        _report(progress, "compiling the native backend's steps (not timed)")
        compiled = native(models.profile, True)
        if compiled.fallback is not None:
            reason = compiled.fallback.removesuffix(": every point decodes eagerly")
            skipped = {("compiled", spec.point_id): reason for spec in specs if spec.method == "draft"}
            compiled = native(bench_profile(dataclasses.replace(config, draft=False)), True)
        sessions["compiled"] = compiled
    return sessions, skipped


def _warm_up(specs: list[PointSpec], sessions: dict[str, InProcessSession], skipped: dict[tuple[str, str], str],
             progress: Progress) -> dict[tuple[str, str], str]:
    """One short request per (point, backend) not already skipped; what HF cannot run is skipped with its reason,
    a native failure raises."""
    _report(progress, "warming up")
    failed: dict[tuple[str, str], str] = {}
    for spec in specs:
        for backend, session in sessions.items():
            if (backend, spec.point_id) in skipped:
                continue
            try:
                session.generate_one(spec)(session.models.prompt_ids[0], 0, WARMUP_TOKENS)
            except HF_FAILURES as error:
                if backend != "hf":
                    raise
                failed[backend, spec.point_id] = one_line(error)
    return failed


def _vllm(config: BenchConfig, specs: list[PointSpec],
          progress: Progress) -> tuple[pd.DataFrame, dict[tuple[str, str], str]]:
    """vLLM's request rows under the bench's point ids, and what it skipped: the draft method (it has no int8
    self-draft), or everything, with vLLM's error, when its run fails (the in-process figures stand)."""
    skipped = {(ENGINE, spec.point_id): "vLLM has no int8 dynamically quantised self-draft"
               for spec in specs if spec.method not in vllm.METHODS}
    try:
        rows = vllm.requests(config.vllm, model=config.model, prompts=PROMPTS, max_prompts=config.prompts,
                             max_new_tokens=config.max_new_tokens, gamma=config.gamma, ngram_max=config.ngram_max,
                             repeats=config.repeats, progress=progress or (lambda _: None))
    except (RuntimeError, OSError) as error:
        return pd.DataFrame(), skipped | {(ENGINE, spec.point_id): one_line(error) for spec in specs
                                          if spec.method in vllm.METHODS}
    point_ids = {spec.method: spec.point_id for spec in specs}
    return rows.assign(backend=ENGINE, point_id=rows["method"].map(point_ids)).drop(columns="method"), skipped


class _Messages:
    """The loader's observer: its messages go to `progress`."""

    def __init__(self, progress: Progress):
        self.progress = progress

    def message(self, text: str) -> None:
        _report(self.progress, text)


def _report(progress: Progress, message: str) -> None:
    if progress is not None:
        progress(message)

"""Load the models once and run every request of the bench: each prompt through every (point, backend)
pair, the backends alternating which goes first, every request recorded as a `results.request_row`."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch

from specbench import results
from specbench.backends.hf import HfSession
from specbench.backends.inprocess import InProcessSession, LoadedModels, load_models
from specbench.backends.native import NativeSession
from specbench.devices import device_name, resolve_device, resolve_dtype
from specbench.errors import one_line
from specbench.profile import Profile, profile_from_dict
from specbench.results import PointSpec
from specbench.sweep.plan import plan_points

MODEL = "builtin:smollm2-135m-instruct"
PROMPTS = "builtin:mixed"
BACKENDS = ("native", "hf")
WARMUP_TOKENS = 8
HF_FAILURES = (ValueError, TypeError, AttributeError, RuntimeError, NotImplementedError)  # what HF may not support

Progress = Callable[[str], None] | None


@dataclass(frozen=True)
class BenchConfig:
    prompts: int = 6
    max_new_tokens: int = 64
    gamma: int = 4
    ngram_max: int = 3
    repeats: int = 2
    draft: bool = True  # also compare the draft method (int8 self-draft; on a GPU a same-dtype copy)
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
    every pair, alternating which backend goes first."""
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(threads)
    profile = bench_profile(config)
    specs = plan_points(profile)
    models = load_models(profile, observer=_Messages(progress))
    sessions = _sessions(models)
    skipped = _warm_up(specs, sessions, progress)
    generate = {(backend, spec.point_id): session.generate_one(spec)
                for backend, session in sessions.items() for spec in specs if (backend, spec.point_id) not in skipped}

    rows = []
    for repeat in range(config.repeats):
        for index, (prompt, ids) in enumerate(zip(models.prompts, models.prompt_ids)):
            _report(progress, f"repeat {repeat + 1}/{config.repeats}, prompt {index + 1}/{len(models.prompts)}")
            order = BACKENDS if (index + repeat) % 2 == 0 else BACKENDS[::-1]
            seed = profile.run.seed + 1000 * index + repeat
            for spec in specs:
                for backend in order:
                    if (backend, spec.point_id) in generate:
                        trace = generate[backend, spec.point_id](ids, seed, config.max_new_tokens)
                        rows.append({"backend": backend, **results.request_row(
                            spec, point_key=f"bench-{backend}", prompt=prompt, repeat=repeat, seed=seed, trace=trace)})
    return Measurement(config, device_name(models.device), threads, tuple(specs),
                       tuple(len(ids) for ids in models.prompt_ids), pd.DataFrame(rows), skipped)


def _sessions(models: LoadedModels) -> dict[str, InProcessSession]:
    """Both backends over the same loaded models."""
    return {"native": NativeSession(models), "hf": HfSession(models)}


def _warm_up(specs: list[PointSpec], sessions: dict[str, InProcessSession],
             progress: Progress) -> dict[tuple[str, str], str]:
    """One short request per (point, backend); what HF cannot run is skipped with its reason, a native
    failure raises."""
    _report(progress, "warming up")
    skipped: dict[tuple[str, str], str] = {}
    for spec in specs:
        for backend, session in sessions.items():
            try:
                session.generate_one(spec)(session.models.prompt_ids[0], 0, WARMUP_TOKENS)
            except HF_FAILURES as error:
                if backend == "native":
                    raise
                skipped[backend, spec.point_id] = one_line(error)
    return skipped


class _Messages:
    """The loader's observer: its messages go to `progress`."""

    def __init__(self, progress: Progress):
        self.progress = progress

    def message(self, text: str) -> None:
        _report(self.progress, text)


def _report(progress: Progress, message: str) -> None:
    if progress is not None:
        progress(message)

"""What the in-process backends (native, hf) share: the target and every draft model loaded once into
this process, the prompts encoded with the target's tokenizer, and the loop that measures a point's
requests one at a time. A backend module only says how one request is generated."""

from __future__ import annotations

import platform
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers

import specbench
from specbench import devices, results
from specbench.backends.base import AfterPrompt, Observer, OnRequest
from specbench.engine import Trace
from specbench.errors import one_line
from specbench.models import LoadedModel, ModelError, check_same_vocabulary, load_model
from specbench.profile import Profile
from specbench.results import PointSpec
from specbench.workloads import Prompt, encode_prompt, load_prompts

GenerateOne = Callable[[list[int], int], Trace]  # (prompt ids, seed) -> one request's trace


@dataclass
class LoadedModels:
    """The target, the drafts and the encoded prompts of a profile, loaded once per process."""

    profile: Profile
    device: torch.device
    dtype: torch.dtype
    target: LoadedModel
    drafts: dict[str, LoadedModel | Exception]  # a draft's model, or why it could not be loaded
    prompts: list[Prompt]
    prompt_ids: list[list[int]]
    eos_token_ids: tuple[int, ...]

    def draft_model(self, spec: PointSpec) -> LoadedModel | None:
        """The point's draft model (None for baseline and n-gram points); raises why it could not be loaded."""
        draft = self.drafts.get(spec.draft)
        if isinstance(draft, Exception):
            raise draft.with_traceback(None)
        return draft


def load_models(profile: Profile, *, observer: Observer) -> LoadedModels:
    """Load the workload and every model once: the context any number of points are run with."""
    device = devices.resolve_device(profile.device)
    dtype = devices.resolve_dtype(profile.dtype, device)
    prompts = load_prompts(profile.workload.prompts, max_prompts=profile.workload.max_prompts,
                           categories=profile.workload.categories)
    observer.message(f"loading target {profile.target.model}")
    target = load_model(profile.target.model, device=device, dtype=dtype, quantize=profile.target.quantize)
    drafts = _load_drafts(profile, target, device=device, dtype=dtype, observer=observer)
    prompt_ids = [encode_prompt(target.tokenizer, prompt) for prompt in prompts]
    return LoadedModels(profile, device, dtype, target, drafts, prompts, prompt_ids, _eos_ids(target))


def _load_drafts(profile: Profile, target: LoadedModel, *, device, dtype, observer) -> dict[str, LoadedModel | Exception]:
    """Each draft model once (shared by drafts with the same model and quantize); a draft that cannot
    be loaded or does not share the target's vocabulary fails its own points only."""
    loaded: dict[tuple[str, str | None], LoadedModel | Exception] = {}
    drafts: dict[str, LoadedModel | Exception] = {}
    for draft in profile.drafts:
        if draft.method != "draft":
            continue
        key = (draft.model, draft.quantize)
        if key not in loaded:
            observer.message(f"loading draft {draft.name}: {draft.model}" + (f" ({draft.quantize})" if draft.quantize else ""))
            try:
                model = load_model(draft.model, device=device, dtype=dtype, quantize=draft.quantize)
                check_same_vocabulary(target.tokenizer, model.tokenizer, target_name=target.name, draft_name=draft.model)
                loaded[key] = model
            except (ModelError, OSError, ValueError, RuntimeError) as error:
                loaded[key] = error
        drafts[draft.name] = loaded[key]
    return drafts


def _eos_ids(target: LoadedModel) -> tuple[int, ...]:
    ids = {target.tokenizer.eos_token_id}
    configured = getattr(target.model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return tuple(sorted(i for i in ids if i is not None))


class InProcessSession:
    """A session over models loaded in this process; subclasses give `generate_one`."""

    backend = "in-process"

    def __init__(self, models: LoadedModels):
        self.models = models
        self.prompts = models.prompts
        self.prompt_tokens = [len(ids) for ids in models.prompt_ids]

    def generate_one(self, spec: PointSpec) -> GenerateOne:
        raise NotImplementedError

    @property
    def identity(self) -> dict[str, Any]:
        m = self.models
        return {"target": [m.target.identity, m.profile.target.quantize], "backend": self.backend,
                "device": m.device.type, "dtype": str(m.dtype)}

    def draft_identity(self, spec: PointSpec) -> str | None:
        draft = self.models.drafts.get(spec.draft)
        return draft.identity if isinstance(draft, LoadedModel) else None

    def point_context(self, spec: PointSpec) -> dict[str, Any]:
        draft = self.models.drafts.get(spec.draft)
        weight = self.models.target.weight_bytes + (draft.weight_bytes if isinstance(draft, LoadedModel) else 0)
        return {"backend": self.backend, "target_model": self.models.profile.target.model, "weight_mb": weight / 2**20}

    def run_point(self, spec: PointSpec, *, point_key: str, on_request: OnRequest,
                  after_prompt: AfterPrompt | None) -> list[dict[str, Any]]:
        """Warm-up requests (not recorded), then every prompt x repeat with the same seeds at every point."""
        run = self.models.profile.run
        try:
            generate_one = self.generate_one(spec)
            for i in range(run.warmup):
                generate_one(self.models.prompt_ids[i % len(self.models.prompt_ids)], run.seed)
            rows = []
            for index, (prompt, ids) in enumerate(zip(self.models.prompts, self.models.prompt_ids)):
                for repeat in range(run.repeats):
                    seed = run.seed + 1000 * index + repeat
                    trace = generate_one(ids, seed)
                    rows.append(results.request_row(spec, point_key=point_key, prompt_id=prompt.prompt_id,
                                                    category=prompt.category, repeat=repeat, seed=seed, trace=trace))
                    on_request()
                if after_prompt is not None:
                    after_prompt(rows)
            return rows
        except Exception:
            if self.models.device.type == "cuda":
                torch.cuda.empty_cache()  # a failed point (out of memory) must not starve the next one
            raise

    def verify_costs(self, max_tokens: int) -> tuple[float, ...]:
        return ()

    def describe(self) -> dict[str, Any]:
        m = self.models
        drafts = {name: ({"model": d.name, "identity": d.identity, "quantize": d.quantize, "weight_mb": d.weight_bytes / 2**20}
                         if isinstance(d, LoadedModel) else {"error": one_line(d)}) for name, d in m.drafts.items()}
        return {
            "models": {"target": {"model": m.target.name, "identity": m.target.identity,
                                  "quantize": m.target.quantize, "weight_mb": m.target.weight_bytes / 2**20},
                       "drafts": drafts},
            "environment": environment(m.device),
        }

    def close(self) -> None:
        pass


def environment(device: torch.device) -> dict[str, Any]:
    return {
        "specbench": specbench.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "platform": platform.platform(),
        "device": str(device), "device_name": devices.device_name(device),
        "accelerator": "gpu" if device.type == "cuda" else "cpu",
        "cuda": torch.version.cuda, "cpu_count": torch.get_num_threads(), "git_commit": _git_commit(),
    }


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def same_launch(spec: PointSpec) -> tuple:
    """In-process points never restart anything: one launch key for all."""
    return ()

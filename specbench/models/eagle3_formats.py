"""EAGLE-3 heads as they are published, read for specbench.models.eagle3: a config.json in vLLM's own EAGLE-3
format or in the vLLM `speculators` format, weights as safetensors or as PyTorch's `pytorch_model.bin`, in a folder
or downloaded from the Hugging Face hub.

The speculators format (vllm-project/speculators, as vLLM 0.32 reads it in `transformers_utils/configs/speculators/`):
`speculators_model_type` "eagle3"; the layer's Llama config nested in `transformer_layer_config` (hidden_size,
vocab_size, heads: what vLLM's own format has at the top); the EAGLE-3 keys at the top (`draft_vocab_size`,
`target_hidden_size`, `eagle_aux_hidden_state_layer_ids`, `norm_before_residual`: true where absent, as vLLM reads
the format, where vLLM's own format means false); and `speculators_config`: the proposal
(`proposal_methods[0].speculative_tokens`) and the verifier the head was trained for (`verifier.name_or_path`). Its
tensors call the layer `layers.0.` where vLLM's own format says `midlayer.` (vLLM maps one onto the other); both are
read under the `midlayer.` names.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import torch

from specbench.models.errors import HeadError

ARCHITECTURE = "LlamaForCausalLMEagle3"
ARCHITECTURES = (ARCHITECTURE, "Eagle3LlamaForCausalLM")  # both map to vLLM's Eagle3LlamaForCausalLM
WEIGHTS_FILE = "model.safetensors"
SPECULATORS = "speculators"  # a config's `source_format` when it was read from the speculators format
# the EAGLE-3 keys a speculators config keeps at its top, beside transformer_layer_config
EAGLE3_KEYS = ("draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids", "norm_before_residual",
               "norm_before_fc", "fc_norm", "norm_output")
TRAINING_STATE = ("training_args.bin", "optimizer.bin", "scheduler.bin", "scaler.bin")  # .bin files that hold no head
LAYER_PREFIX, SPECULATORS_LAYER_PREFIX = "midlayer.", "layers.0."


# --- config.json ------------------------------------------------------------------------------------------


def is_speculators(data: dict[str, Any]) -> bool:
    return "speculators_config" in data or "speculators_model_type" in data


def from_speculators(data: dict[str, Any], *, path: Path) -> dict[str, Any]:
    """A speculators-format config as vLLM's own format: the layer's config with the EAGLE-3 keys on top, the
    proposal's length and the verifier kept beside them; HeadError naming the key where it is no EAGLE-3 head."""
    kind = data.get("speculators_model_type")
    if kind != "eagle3":
        raise HeadError(f'{path}: speculators_model_type: {json.dumps(kind)} is not an EAGLE-3 head; use a speculator '
                        'saved as "eagle3"')
    layer = data.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise HeadError(f"{path}: transformer_layer_config: missing or not an object; a speculators-format head "
                        "keeps its layer's Llama config there")
    speculators = data.get("speculators_config")
    if not isinstance(speculators, dict):
        raise HeadError(f"{path}: speculators_config: missing or not an object; vLLM reads the speculators format "
                        "by it (the proposal and the verifier)")
    methods = speculators.get("proposal_methods") or [{}]
    verifier = speculators.get("verifier") or {}
    out = {**layer, "architectures": [ARCHITECTURE], "source_format": SPECULATORS,
           "layer_model_type": layer.get("model_type", "llama"),  # vLLM picks the head's class by it
           "speculative_tokens": methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None,
           "verifier": verifier.get("name_or_path") if isinstance(verifier, dict) else None}
    out.update({key: data[key] for key in EAGLE3_KEYS if data.get(key) is not None})
    out["norm_before_residual"] = bool(data.get("norm_before_residual", True))  # as vLLM reads the format
    return out


def key_name(config: Any, key: str) -> str:
    """Where `key` is written in the head's config.json (`config`: as read, a dict or a LlamaConfig): inside
    transformer_layer_config for a speculators head's layer keys, at the top otherwise."""
    source = config.get("source_format") if isinstance(config, dict) else getattr(config, "source_format", None)
    if source == SPECULATORS and key not in EAGLE3_KEYS:
        return f"transformer_layer_config.{key}"
    return key


def trained_for(config: Any) -> str:
    """' (it was trained for VERIFIER)' where a speculators head names its verifier, else ''."""
    verifier = getattr(config, "verifier", None)
    return f" (it was trained for {verifier})" if verifier else ""


# --- weights ----------------------------------------------------------------------------------------------


def weight_files(folder: Path) -> list[Path]:
    """The head's weight files: its .safetensors, else its PyTorch .bin files (not a trainer's state); [] if none."""
    safetensors = sorted(folder.glob("*.safetensors"))
    if safetensors:
        return safetensors
    return sorted(path for path in folder.glob("*.bin") if path.name not in TRAINING_STATE)


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the head's weight files, on the CPU in its own dtype, under vLLM's own names."""
    files = weight_files(folder)
    if not files:
        raise HeadError(f"{folder}: no .safetensors or .bin weights; save the head with its tensors")
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        tensors.update(_read_safetensors(path) if path.suffix == ".safetensors" else _read_bin(path))
    return {_own_name(name): tensor for name, tensor in tensors.items()}


def _own_name(name: str) -> str:
    return LAYER_PREFIX + name.removeprefix(SPECULATORS_LAYER_PREFIX) if name.startswith(SPECULATORS_LAYER_PREFIX) \
        else name


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (OSError, SafetensorError) as error:
        raise HeadError(f"{path}: unreadable safetensors ({error}); write the head again") from None


def _read_bin(path: Path) -> dict[str, torch.Tensor]:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise HeadError(f"{path}: holds more than tensors (torch.load with weights_only=True refused it); save the "
                        "head's state dict alone, or as safetensors") from None
    except (OSError, RuntimeError, EOFError, KeyError, ValueError) as error:
        first = (str(error).strip().splitlines() or [""])[0].split(". ")[0][:160]  # its first sentence
        raise HeadError(f"{path}: unreadable PyTorch weights ({type(error).__name__}: {first}); write the head "
                        "again") from None
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise HeadError(f"{path}: not a state dict (a mapping of tensor names to tensors); save the head's "
                        "state_dict()")
    return data


# --- the hub ----------------------------------------------------------------------------------------------


def download(ref: str) -> Path:
    """A hub id's head, downloaded once into huggingface_hub's cache: its JSON files and its safetensors weights,
    or its .bin weights where it has no safetensors."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(ref, allow_patterns=hub_patterns(ref)))
    except (OSError, ValueError) as error:  # offline, unknown repo, no access, not a repo id
        raise HeadError(f"cannot download the EAGLE-3 head {ref!r} from the Hugging Face hub "
                        f"({type(error).__name__}); use a local head folder") from None


def hub_patterns(ref: str) -> list[str]:
    """The files to fetch: safetensors where the repo has them, else .bin; both where the repo cannot be listed
    (offline: the cache holds whichever was fetched). One request: the repo's info lists its files, where
    list_repo_files retries with backoff (23 s on a machine without the hub before the error)."""
    from huggingface_hub import HfApi

    from specbench.models.load import HUB_TIMEOUT_S

    try:
        files = [sibling.rfilename for sibling in HfApi().model_info(ref, timeout=HUB_TIMEOUT_S).siblings or ()]
    except Exception:  # noqa: BLE001 - offline, no such repo, no access: snapshot_download then says which
        return ["*.json", "*.safetensors", "*.bin"]
    return ["*.json", "*.safetensors" if any(name.endswith(".safetensors") for name in files) else "*.bin"]

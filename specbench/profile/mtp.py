"""`method = "mtp"` against the profile's target, checked where the profile enters: the target must carry MTP layers
(or `target.mtp` make one), as its own files say: a local folder's config.json (`num_nextn_predict_layers`), a GGUF
file's header (llama.cpp's `{arch}.nextn_predict_layers`). A hub id is not read (offline it cannot be): the engine
says. Refused in one line, before anything is written or launched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specbench.models.registry import builtin_gguf_path, builtin_name, is_builtin

LAYERS_KEY = "num_nextn_predict_layers"
# what llama.cpp's converter (11434, conversion/*.py: supports_mtp_export) exports MTP layers for
LLAMA_CPP_MTP = "DeepSeek-V3.2/V4, GLM-4.5 to 5, Qwen3-MoE, Qwen4, MiMo-V2, Nemotron-H, Step-3.5, ..."
KNOWN_MTP = "MiMo, DeepSeek-V3, GLM-4.5, Qwen3-Next, ..."


def target_mtp_layers(reference: str) -> int | None:
    """The MTP layers the target declares; None where its files cannot be read here (a hub id)."""
    if is_builtin(reference):
        path = builtin_gguf_path(builtin_name(reference))
        return gguf_mtp_layers(path) if path is not None else None
    path = Path(reference)
    if path.suffix == ".gguf" and path.is_file():
        return gguf_mtp_layers(path)
    if (path / "config.json").is_file():
        try:
            data = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            return None
        value = data.get(LAYERS_KEY, (data.get("text_config") or {}).get(LAYERS_KEY))
        return value if isinstance(value, int) and value > 0 else 0
    return None


def gguf_mtp_layers(path: Path) -> int | None:
    from gguf import GGUFReader

    try:
        fields = GGUFReader(str(path)).fields
        field = fields.get("general.architecture")
        architecture = bytes(field.parts[field.data[0]]).decode()
        layers = fields.get(f"{architecture}.nextn_predict_layers")
        return int(layers.parts[layers.data[0]][0]) if layers is not None else 0
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def mtp_problem(profile: Any) -> tuple[str, tuple] | None:
    """(message, key) for the first MTP draft the target cannot run, else None."""
    target, engine = profile.target, (profile.server.engine if profile.server is not None else None)
    for index, draft in enumerate(profile.drafts):
        if draft.method != "mtp" or draft.url is not None:
            continue
        on_llama = profile.backend == "server" and engine == "llama.cpp"
        if target.mtp is not None:
            if on_llama:
                return (f"llama.cpp's draft-mtp runs the MTP layers of GGUF targets whose architecture has them "
                        f"({LLAMA_CPP_MTP}), and the MTP model made here is a MiMoForCausalLM, which its converter "
                        'does not export: run it with engine = "vllm" or backend = "native"', ("target", "mtp"))
            continue
        layers = target_mtp_layers(target.model)
        if layers == 0:
            where = "its GGUF header has no nextn_predict_layers" if on_llama or target.model.endswith(".gguf") \
                else f"config.json has no {LAYERS_KEY}"
            return (f'"mtp" drafts with the target\'s own MTP layers, and {target.model} has none ({where}): set '
                    f'target.mtp = "trained:quick" to distil one here, or use a target with MTP layers ({KNOWN_MTP})',
                    ("drafts", index, "method"))
        if layers and engine == "vllm" and profile.backend == "server":
            for gamma in profile.gammas(draft):
                if gamma > layers and gamma % layers:
                    return (f"vLLM chains a target's {layers} MTP layers, so its num_speculative_tokens must be at "
                            f"most {layers} or a multiple of {layers} (vllm/config/speculative.py; got gamma {gamma})",
                            ("drafts", index, "gamma") if draft.gamma else ("sweep", "gamma"))
    return None

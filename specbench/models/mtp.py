"""A model's own MTP (multi-token prediction) layers, in MiMo's format: the layer, reading it from a model folder,
and turning a Llama or Qwen2 target into that architecture with layers of its own.

The format (vLLM 0.32, `model_executor/models/mimo.py` and `mimo_mtp.py`): the target's config declared
`"architectures": ["MiMoForCausalLM"]` with `num_nextn_predict_layers`, its `model_type` kept (vLLM picks the classes
by the architecture, whose layers are Qwen2's; transformers picks the config, the model class and the tokenizer by the
model type, so the folder loads there as the target did); the target's tensors as Qwen2 names them (q/k/v biases:
zeros where a Llama target has none, unread by transformers' Llama; its own `lm_head.weight`: MiMoMTP reads the
lm_head from the checkpoint, never tied); MTP layer i as `model.mtp_layers.{i}.{token_layernorm, hidden_layernorm,
input_proj, final_layernorm}.weight` around one Qwen2 decoder layer `model.mtp_layers.{i}.{self_attn.{q,k,v,o}_proj,
mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm}`, left unread by transformers.

The layer at position p reads the embedding of token p + 1 (zeroed at position 0, as vLLM masks it) and a hidden
state: at positions the target verified, the target's last hidden state before its final norm (what MiMoModel
returns), at drafted positions the layer's own output one position earlier. Its output is already normed
(final_layernorm); the target's lm_head on it proposes token p + 2. vLLM 0.32 drafts every speculative token with the
first MTP layer, chained (MiMoMTP runs spec_step_idx 0 only): more tokens than layers chain that one layer, as
DeepSeek-V3 chains its one. The native proposer does the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2MLP, Qwen2RMSNorm, Qwen2RotaryEmbedding, apply_rotary_pos_emb

from specbench.models.eagle3 import Attend
from specbench.models.eagle3_formats import WEIGHTS_FILE
from specbench.models.errors import HeadError

ARCHITECTURE = "MiMoForCausalLM"
LAYERS_KEY = "num_nextn_predict_layers"
PREFIX = "model.mtp_layers."
# a target whose layers are Qwen2's up to biases: Llama's (no biases: zeros) and Qwen2's own
CONVERTIBLE = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}

class MtpAttention(nn.Module):
    def __init__(self, config: Qwen2Config):
        super().__init__()
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(config.hidden_size, heads * head_dim, bias=True)
        self.k_proj = nn.Linear(config.hidden_size, kv_heads * head_dim, bias=True)
        self.v_proj = nn.Linear(config.hidden_size, kv_heads * head_dim, bias=True)
        self.o_proj = nn.Linear(heads * head_dim, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        """x [B, T, H] -> [B, T, H]; `attend` keeps the keys and values and attends over them."""
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        out = attend(q, k, v)  # [B, h, T, d]
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class MtpLayer(nn.Module):
    """One MTP layer; its state dict carries the format's names below `model.mtp_layers.{i}.`. Drafts like an
    EAGLE-3 head (`first_hidden`, `step`, `draft_logits`), so the same proposer and trainer run both."""

    embed_tokens = None  # the target's embeddings and lm_head: the format shares them
    lm_head = None

    def __init__(self, config: Qwen2Config):
        super().__init__()
        self.config = config
        self.aux_layer_ids = (config.num_hidden_layers,)  # the input of the target's final norm
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.token_layernorm = Qwen2RMSNorm(hidden, eps=eps)
        self.hidden_layernorm = Qwen2RMSNorm(hidden, eps=eps)
        self.input_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.self_attn = MtpAttention(config)
        self.mlp = Qwen2MLP(config)
        self.input_layernorm = Qwen2RMSNorm(hidden, eps=eps)
        self.post_attention_layernorm = Qwen2RMSNorm(hidden, eps=eps)
        self.final_layernorm = Qwen2RMSNorm(hidden, eps=eps)
        self.rotary = Qwen2RotaryEmbedding(config=config)  # inv_freq is not persistent: not in the state dict

    @property
    def attention(self) -> MtpAttention:
        return self.self_attn

    def first_hidden(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's states [.., H] as the layer reads them at verified positions: as they are."""
        return aux

    def step(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """embeds, hidden [B, T, H], positions [B, T] -> the layer's normed output [B, T, H] (the next position's
        hidden state, and what the lm_head reads)."""
        embeds = torch.where(positions.unsqueeze(-1) == 0, 0, embeds)  # vLLM masks position 0's token
        x = self.input_proj(torch.cat([self.hidden_layernorm(hidden), self.token_layernorm(embeds)], dim=-1))
        cos, sin = self.rotary(embeds, positions)
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attend)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return self.final_layernorm(x)

    def draft_logits(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., V] (the output is normed already)."""
        return nn.functional.linear(hidden, lm_head_weight)

    def to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        return logits  # the target's own lm_head: its vocabulary


def mtp_config(target_config: Any) -> Qwen2Config:
    """The target's config as Qwen2's (what the MTP layers are shaped by)."""
    data = target_config.to_dict() if hasattr(target_config, "to_dict") else dict(target_config)
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
            "rope_parameters", "bos_token_id", "eos_token_id", "pad_token_id")
    config = Qwen2Config(**{key: data[key] for key in keys if data.get(key) is not None})
    config.head_dim = data.get("head_dim") or config.hidden_size // config.num_attention_heads
    config.tie_word_embeddings = False
    return config


def new_layer(target: nn.Module) -> MtpLayer:
    """A float32 MTP layer for `target`, started as DeepSeek-V3 starts its MTP module from the model: the decoder
    block a copy of the target's last layer, the final norm the target's; input_proj random (seeded by the caller)."""
    config = mtp_config(target.config)
    layer = MtpLayer(config).float()
    last = target.get_decoder().layers[-1]
    names = {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
             "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight",
             "post_attention_layernorm.weight"}
    source = last.state_dict()
    with torch.no_grad():
        for name, tensor in layer.named_parameters():
            if name in names:
                tensor.copy_(source[name].float().cpu())
            elif name.endswith("_proj.bias"):
                bias = source.get(name)
                tensor.copy_(bias.float().cpu()) if bias is not None else tensor.zero_()
        layer.final_layernorm.weight.copy_(target.get_decoder().norm.weight.float().cpu())
    return layer


# --- reading an MTP model -------------------------------------------------------------------------------------


def mtp_layer_count(config: Any) -> int:
    """The MTP layers a model config declares (num_nextn_predict_layers), 0 for none."""
    value = getattr(config, LAYERS_KEY, None) if not isinstance(config, dict) else config.get(LAYERS_KEY)
    return value if isinstance(value, int) and value > 0 else 0


def read_folder_config(folder: Path) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise HeadError(f"{folder}: no config.json; point to a model folder") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise HeadError(f"{path}: not readable JSON ({error})") from None


def load_mtp_layers(folder: Path, target_config: Any, *, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float32) -> list[MtpLayer]:
    """The MTP layers of a MiMo-format model folder, in eval mode; HeadError naming the key or tensor for a folder
    that has none, another architecture, or tensors that do not fit."""
    from safetensors import safe_open

    folder = Path(folder)
    data = read_folder_config(folder)
    where = folder / "config.json"
    count = mtp_layer_count(data)
    if not count:
        raise HeadError(f"{where}: {LAYERS_KEY}: the model has no MTP layers; use a model with them, or one "
                        "`specbench heads train --kind mtp` made (target.mtp = \"trained:quick\")")
    if ARCHITECTURE not in (data.get("architectures") or []):
        raise HeadError(f"{where}: architectures: {json.dumps(data.get('architectures'))}: specbench runs the MTP "
                        f"layers of {ARCHITECTURE} (MiMo's format) natively; run this model on backend = \"server\"")
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as file:
            for name in file.keys():
                if name.startswith(PREFIX):
                    tensors[name] = file.get_tensor(name)
    config = mtp_config(target_config)
    layers = []
    for index in range(count):
        layer = MtpLayer(config)
        expected = layer.state_dict()
        prefix = f"{PREFIX}{index}."
        own = {name.removeprefix(prefix): t for name, t in tensors.items() if name.startswith(prefix)}
        for name in sorted(set(expected) | set(own)):
            if name not in own:
                raise HeadError(f"{folder}: tensor {prefix}{name} is missing ({LAYERS_KEY} = {count})")
            if name not in expected:
                raise HeadError(f"{folder}: tensor {prefix}{name} is not part of a MiMo MTP layer")
            if tuple(own[name].shape) != tuple(expected[name].shape):
                raise HeadError(f"{folder}: tensor {prefix}{name} has shape {list(own[name].shape)}, the target "
                                f"needs {list(expected[name].shape)}")
        layer.load_state_dict({name: t.to(expected[name].dtype) for name, t in own.items()}, strict=True)
        layers.append(layer.to(device=device, dtype=dtype).eval())
    return layers


# --- writing: a target made a MiMo model with MTP layers --------------------------------------------------------


def check_convertible(target_folder: Path) -> dict[str, Any]:
    """The target folder's config, where MiMo's format can hold its layers; HeadError naming model_type otherwise."""
    data = read_folder_config(target_folder)
    model_type = data.get("model_type")
    if model_type not in CONVERTIBLE:
        raise HeadError(f"{Path(target_folder) / 'config.json'}: model_type: {json.dumps(model_type)}: specbench makes "
                        f"MTP models of {' and '.join(CONVERTIBLE.values())} targets (their layers are Qwen2's, which "
                        "MiMo's format holds); use a target of those families")
    return data


def write_mtp_model(target_folder: Path, layers: list[MtpLayer], out: Path, *, extra: dict[str, Any] | None = None
                    ) -> Path:
    """The target's folder (Llama or Qwen2) written to `out` as a MiMoForCausalLM with `layers`: its tensors under
    Qwen2's names (zero q/k/v biases where it has none, its lm_head written out), its tokenizer files copied."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import save_file

    target_folder, out = Path(target_folder), Path(out)
    data = check_convertible(target_folder)
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(target_folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as file:
            tensors.update({name: file.get_tensor(name) for name in file.keys()})
    if not tensors:
        raise HeadError(f"{target_folder}: no .safetensors weights to convert")
    config = mtp_config(data)
    dtype = tensors["model.embed_tokens.weight"].dtype
    if "lm_head.weight" not in tensors:  # tied: MiMoMTP loads an lm_head of its own from the checkpoint
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    for index in range(config.num_hidden_layers):
        for proj, size in (("q_proj", config.num_attention_heads), ("k_proj", config.num_key_value_heads),
                           ("v_proj", config.num_key_value_heads)):
            name = f"model.layers.{index}.self_attn.{proj}.bias"
            tensors.setdefault(name, torch.zeros(size * config.head_dim, dtype=dtype))
    for index, layer in enumerate(layers):
        for name, tensor in layer.state_dict().items():
            tensors[f"{PREFIX}{index}.{name}"] = tensor.detach().to("cpu", dtype).clone()
    out.mkdir(parents=True, exist_ok=True)
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    written = {**data, "architectures": [ARCHITECTURE], "tie_word_embeddings": False, LAYERS_KEY: len(layers),
               "head_dim": config.head_dim, "dtype": str(dtype).removeprefix("torch."), **(extra or {})}
    (out / "config.json").write_text(json.dumps(written, indent=2) + "\n")
    for path in target_folder.iterdir():
        if path.is_file() and path.name != "config.json" and not path.name.endswith((".safetensors", ".index.json")):
            shutil.copy2(path, out / path.name)
    return out


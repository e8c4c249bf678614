"""EAGLE-3 draft heads in vLLM's format: the one-layer network, its config.json, load, save and the checks
against a target.

The format (vLLM 0.32, `model_executor/models/llama_eagle3.py`): a Llama config with
`"architectures": ["LlamaForCausalLMEagle3"]`, `num_hidden_layers = 1`, `target_hidden_size`,
`draft_vocab_size`, `eagle_aux_hidden_state_layer_ids` and `norm_before_residual`; tensors `fc.weight`
[H, 3·Ht], `midlayer.self_attn.{q,k,v,o}_proj.weight` (q, k and v read embedding ⊕ hidden: 2·H inputs),
`midlayer.mlp.{gate,up,down}_proj.weight`, `midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight`,
`norm.weight`; optionally `lm_head.weight` [D, H] with `d2t` (int64 [D], target id = i + d2t[i]) and `t2d`
(bool [V]), and `embed_tokens.weight`. What the head lacks it takes from the target (embeddings, lm_head).

Aux layer L is the input of the target's decoder layer L (vLLM adds the residual stream back in: the same
tensor as transformers' `hidden_states[L]`); L = n is the last layer's output before the final norm.

Heads are also read in the vLLM `speculators` format and with `pytorch_model.bin` weights (specbench.models.
eagle3_formats), into the same head; `convert_head` writes any of them in vLLM's own format.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from specbench.models.eagle3_formats import (
    ARCHITECTURE,
    ARCHITECTURES,
    WEIGHTS_FILE,
    download,
    from_speculators,
    is_speculators,
    key_name,
    read_tensors,
    trained_for,
)
from specbench.models.errors import HeadError
from specbench.models.load import LoadedModel, folder_identity, weight_bytes
# config keys of head variants vLLM has and this implementation does not run
UNSUPPORTED_TRUE = ("norm_before_fc", "fc_norm", "norm_output", "parallel_drafting")

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # q, k, v -> attention output


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """vLLM's default auxiliary layers for a target with `num_layers` decoder layers."""
    return (2, num_layers // 2, num_layers - 3)


class Eagle3Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        bias = bool(getattr(config, "attention_bias", False))
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(2 * config.hidden_size, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(2 * config.hidden_size, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(2 * config.hidden_size, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, config.hidden_size, bias=bias)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, T, 2H] -> q [B, h, T, d], k and v [B, kv, T, d], q and k rotated."""
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v


class Eagle3Layer(nn.Module):
    """vLLM's first (and only) EAGLE-3 decoder layer: attention over norm(embedding) ⊕ norm(hidden)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.norm_before_residual = bool(config.norm_before_residual)
        self.self_attn = Eagle3Attention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, *, cos: torch.Tensor, sin: torch.Tensor,
                attend: Attend) -> torch.Tensor:
        """embeds, hidden [B, T, H] -> the pre-norm output [B, T, H] (vLLM's `hidden_prenorm`: the next step's
        hidden state; `norm` of it gives the logits)."""
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        q, k, v = self.self_attn.project(torch.cat([self.input_layernorm(embeds), normed], dim=-1), cos, sin)
        out = attend(q, k, v)  # [B, h, T, d]
        batch, _, length, _ = out.shape
        residual = self.self_attn.o_proj(out.transpose(1, 2).reshape(batch, length, -1)) + residual
        return self.mlp(self.post_attention_layernorm(residual)) + residual


class Eagle3Head(nn.Module):
    """The head's parameters carry the format's tensor names (its state dict is the saved file)."""

    def __init__(self, config: LlamaConfig, *, own_lm_head: bool, own_embeddings: bool = False):
        super().__init__()
        self.config = config
        self.aux_layer_ids = tuple(config.eagle_aux_hidden_state_layer_ids)
        self.fc = nn.Linear(len(self.aux_layer_ids) * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary = LlamaRotaryEmbedding(config=config)  # inv_freq is not persistent: not in the state dict
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False) if own_lm_head else None
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size) if own_embeddings else None
        if config.draft_vocab_size != config.vocab_size:
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        else:
            self.d2t = self.t2d = None

    @property
    def draft_to_target(self) -> torch.Tensor | None:
        """[D] the target id of each draft id; None when the draft vocabulary is the target's."""
        if self.d2t is None:
            return None
        return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t

    @property
    def attention(self) -> Eagle3Attention:
        return self.midlayer.self_attn

    def first_hidden(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's aux states [.., A·Ht] as the layer reads them at verified positions: fc of them [.., H]."""
        return self.fc(aux)

    def rotation(self, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] -> cos, sin [B, T, d]."""
        return self.rotary(like, positions)

    def step(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """One pass of the layer: embeds, hidden [B, T, H], positions [B, T] -> pre-norm output [B, T, H]."""
        cos, sin = self.rotation(positions, embeds)
        return self.midlayer(embeds, hidden, cos=cos, sin=sin, attend=attend)

    def draft_logits(self, prenorm: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., D] logits over the draft vocabulary (lm_head_weight: the head's or the target's)."""
        return nn.functional.linear(self.norm(prenorm), lm_head_weight)

    def to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., D] -> [..., V]: ids outside the draft vocabulary get -inf."""
        mapping = self.draft_to_target
        if mapping is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        full[..., mapping] = logits
        return full


# --- config.json ------------------------------------------------------------------------------------------


def head_config(target_config: Any, *, draft_vocab_size: int, aux_layer_ids: tuple[int, ...],
                norm_before_residual: bool = False) -> LlamaConfig:
    """A head shaped like one decoder layer of the target (as EAGLE-3 heads are)."""
    hidden = target_config.hidden_size
    heads = target_config.num_attention_heads
    data = {
        "architectures": [ARCHITECTURE], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": hidden, "intermediate_size": target_config.intermediate_size,
        "num_attention_heads": heads, "num_key_value_heads": target_config.num_key_value_heads,
        "head_dim": getattr(target_config, "head_dim", None) or hidden // heads,
        "hidden_act": getattr(target_config, "hidden_act", "silu"), "rms_norm_eps": target_config.rms_norm_eps,
        "max_position_embeddings": target_config.max_position_embeddings,
        "rope_parameters": dict(target_config.rope_parameters), "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": False, "vocab_size": target_config.vocab_size, "draft_vocab_size": draft_vocab_size,
        "target_hidden_size": hidden, "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
        "norm_before_residual": norm_before_residual,
        "bos_token_id": target_config.bos_token_id, "eos_token_id": target_config.eos_token_id,
    }
    return LlamaConfig.from_dict(data)


CONFIG_KEYS = (  # what config.json holds: the Llama keys vLLM reads, then the EAGLE-3 keys, all set explicitly
    "model_type", "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "max_position_embeddings", "rope_parameters",
    "attention_bias", "mlp_bias", "tie_word_embeddings", "vocab_size", "bos_token_id", "eos_token_id",
    "draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids", "norm_before_residual",
)


def config_json(config: LlamaConfig) -> dict[str, Any]:
    data = config.to_dict()
    return {"architectures": [ARCHITECTURE], **{key: data.get(key, getattr(config, key, None)) for key in CONFIG_KEYS},
            "dtype": "float32"}


def read_config(folder: Path, *, native: bool = True) -> LlamaConfig:
    """The head's config.json (vLLM's own EAGLE-3 format or the speculators format), checked to be a one-layer
    EAGLE-3 Llama head (HeadError otherwise); `native`: also one this module runs (not a variant only the engines
    have)."""
    path = folder / "config.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise HeadError(f"{folder}: no config.json; point to an EAGLE-3 head folder (config.json + "
                        f"{WEIGHTS_FILE})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise HeadError(f"{path}: not readable JSON ({error}); write the head again") from None
    if is_speculators(data):
        data = from_speculators(data, path=path)
    architectures = data.get("architectures") or []
    if not any(name in ARCHITECTURES for name in architectures):
        raise HeadError(f'{path}: architectures: {json.dumps(architectures)} is not an EAGLE-3 head; use a head '
                        f'saved as "{ARCHITECTURE}" (vLLM\'s EAGLE-3 format) or in the speculators format')
    if data.get("num_hidden_layers") != 1:
        raise HeadError(f"{path}: {key_name(data, 'num_hidden_layers')}: specbench runs one-layer EAGLE-3 heads "
                        f"(got {data.get('num_hidden_layers')})")
    if native and (what := variant(data)):
        raise HeadError(f"{path}: {what}: this head variant is not supported by the native backend (run it "
                        'on backend = "server")')
    data["eagle_aux_hidden_state_layer_ids"] = data.get("eagle_aux_hidden_state_layer_ids") or (
        data.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")  # None: the target's default
    config = LlamaConfig.from_dict(data)
    if getattr(config, "draft_vocab_size", None) is None:  # absent: the target's vocabulary, as vLLM reads it
        config.draft_vocab_size = config.vocab_size
    if getattr(config, "target_hidden_size", None) is None:
        config.target_hidden_size = config.hidden_size
    config.norm_before_residual = bool(getattr(config, "norm_before_residual", False))
    return config


def variant(data: dict[str, Any]) -> str | None:
    """The key (and value) of a head variant vLLM has and this module does not run, None for a head it runs."""
    if data.get("layer_model_type", "llama") != "llama":  # a speculators head for Qwen3: vLLM's Eagle3Qwen3 class
        return f"transformer_layer_config.model_type: {json.dumps(data['layer_model_type'])}"
    return next((key for key in UNSUPPORTED_TRUE if data.get(key) or (data.get("eagle_config") or {}).get(key)), None)


def fit_to_target(config: LlamaConfig, target_config: Any, *, where: str) -> LlamaConfig:
    """Check the head against the target (HeadError naming the key as its config.json writes it) and resolve
    default aux layers."""
    depth = target_config.num_hidden_layers
    if config.eagle_aux_hidden_state_layer_ids is None:
        config.eagle_aux_hidden_state_layer_ids = list(default_aux_layers(depth))
    layers = list(config.eagle_aux_hidden_state_layer_ids)
    fix = f"use a head trained for this target{trained_for(config)}"
    if not layers or any(not isinstance(i, int) or not 0 <= i <= depth for i in layers):
        raise HeadError(f"{where}: eagle_aux_hidden_state_layer_ids: {layers} must be layers 0..{depth} of the "
                        f"target ({depth} decoder layers); train the head for this target")
    if config.hidden_size != target_config.hidden_size:
        raise HeadError(f"{where}: {key_name(config, 'hidden_size')}: {config.hidden_size} does not match the "
                        f"target's hidden_size {target_config.hidden_size} (the head reads the target's embeddings); "
                        f"{fix}")
    if config.target_hidden_size != target_config.hidden_size:
        raise HeadError(f"{where}: target_hidden_size: {config.target_hidden_size} does not match the target's "
                        f"hidden_size {target_config.hidden_size}; {fix}")
    if config.vocab_size != target_config.vocab_size:
        raise HeadError(f"{where}: {key_name(config, 'vocab_size')}: {config.vocab_size} does not match the "
                        f"target's vocab_size {target_config.vocab_size}; {fix}")
    return config


# --- load and save ----------------------------------------------------------------------------------------


def load_head(folder: Path, *, target_config: Any, device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> Eagle3Head:
    """Read a head folder (vLLM's EAGLE-3 format or the speculators format; safetensors or .bin weights), checked
    against the target; eval mode on `device`."""
    folder = Path(folder)
    config = fit_to_target(read_config(folder), target_config, where=str(folder / "config.json"))
    return head_from_tensors(config, read_tensors(folder), where=str(folder)).to(device=device, dtype=dtype).eval()


def check_tensors(config: LlamaConfig, tensors: dict[str, torch.Tensor], *, where: str) -> dict[str, torch.Tensor]:
    """The tensors a head of `config` loads (t2d derived from d2t where it lacks it, dropped where the head needs
    none); HeadError naming the first tensor that is missing, extra or of another shape."""
    own_lm_head = "lm_head.weight" in tensors
    if not own_lm_head and config.draft_vocab_size != config.vocab_size:
        raise HeadError(f"{where}: draft_vocab_size: {config.draft_vocab_size} needs the head's own lm_head.weight "
                        f"and d2t (without them the target's lm_head covers all {config.vocab_size} ids)")
    shaped = config
    if config.eagle_aux_hidden_state_layer_ids is None:  # the target's default: three layers, as vLLM assumes
        shaped = LlamaConfig.from_dict({**config.to_dict(), "eagle_aux_hidden_state_layer_ids": [0, 0, 0]})
    with torch.device("meta"):  # shapes only: nothing allocated
        expected = Eagle3Head(shaped, own_lm_head=own_lm_head,
                              own_embeddings="embed_tokens.weight" in tensors).state_dict()
    tensors = dict(tensors)
    if "t2d" not in expected:
        tensors.pop("t2d", None)  # a full-vocabulary head needs no mapping
    elif "t2d" not in tensors and "d2t" in tensors:  # t2d is optional: vLLM skips it
        tensors["t2d"] = _t2d_from_d2t(tensors["d2t"], config.vocab_size)
    for name in sorted(set(expected) | set(tensors)):
        if name not in tensors:
            raise HeadError(f"{where}: tensor {name} is missing; save every tensor of the EAGLE-3 format")
        if name not in expected:
            raise HeadError(f"{where}: tensor {name} is not part of a one-layer EAGLE-3 head; remove it")
        if tuple(tensors[name].shape) != tuple(expected[name].shape):
            raise HeadError(f"{where}: tensor {name} has shape {list(tensors[name].shape)}, the config needs "
                            f"{list(expected[name].shape)}; config.json and the weights disagree")
    return tensors


def head_from_tensors(config: LlamaConfig, tensors: dict[str, torch.Tensor], *, where: str) -> Eagle3Head:
    tensors = check_tensors(config, tensors, where=where)
    head = Eagle3Head(config, own_lm_head="lm_head.weight" in tensors, own_embeddings="embed_tokens.weight" in tensors)
    expected = head.state_dict()
    head.load_state_dict({name: tensor.to(expected[name].dtype) for name, tensor in tensors.items()}, strict=True)
    return head


def _t2d_from_d2t(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[torch.arange(d2t.shape[0]) + d2t] = True
    return t2d


def save_head(head: Eagle3Head, folder: Path, *, extra: dict[str, Any] | None = None) -> Path:
    """config.json + model.safetensors (float32 weights, int64 d2t, bool t2d) in `folder`."""
    tensors = {name: tensor.detach().to("cpu") for name, tensor in head.state_dict().items()}
    tensors = {name: (t.float() if t.is_floating_point() else t) for name, t in tensors.items()}
    return _write(head.config, tensors, Path(folder), extra=extra)


def convert_head(folder: Path, out: Path) -> Path:
    """A head folder in any format `load_head` reads, written to `out` in vLLM's own format (config.json +
    model.safetensors, each tensor in its own dtype, every key explicit): for an engine or converter that reads
    only that format. Aux layers the source leaves to the target's default stay so."""
    config = read_config(Path(folder))
    tensors = check_tensors(config, read_tensors(Path(folder)), where=str(folder))
    floating = {t.dtype for t in tensors.values() if t.is_floating_point()}
    source = {"folder": str(folder), "format": getattr(config, "source_format", "eagle3"),
              "speculative_tokens": getattr(config, "speculative_tokens", None),
              "verifier": getattr(config, "verifier", None)}
    return _write(config, tensors, Path(out), dtype=floating.pop() if len(floating) == 1 else torch.float32,
                  extra={"specbench_converted_from": source})


def _write(config: LlamaConfig, tensors: dict[str, torch.Tensor], folder: Path, *, dtype: torch.dtype = torch.float32,
           extra: dict[str, Any] | None = None) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    data = {**config_json(config), "dtype": str(dtype).removeprefix("torch."), **(extra or {})}
    (folder / "config.json").write_text(json.dumps(data, indent=2) + "\n")
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(folder / WEIGHTS_FILE),
              metadata={"format": "pt"})
    return folder


def head_folder(ref: str) -> Path:
    """A local head folder as is; a hub id downloaded (once, by huggingface_hub's cache)."""
    path = Path(ref)
    if path.is_dir():
        return path
    if path.is_absolute() or ref.startswith((".", "~")):
        raise HeadError(f"{ref}: no such folder; point to an EAGLE-3 head folder (config.json + {WEIGHTS_FILE})")
    return download(ref)


def load_head_model(ref: str, target: LoadedModel, *, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """The head `ref` for a loaded target, as a LoadedModel (its identity: the folder's content hash)."""
    folder = head_folder(ref)
    head = load_head(folder, target_config=target.model.config, device=device, dtype=dtype)
    return LoadedModel(ref, head, target.tokenizer, folder_identity(folder), weight_bytes(head), None)

"""The GPU check's models (benches/gpu_check.py): seeded Llama-shaped configs at a realistic size (FULL) or a toy one
(TINY), the target built so that its first layer decides (random weights otherwise accept nothing from a draft), a
small draft of its first layers, and an EAGLE-3 head distilled on the device from the target's own continuations."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specbench.heads.data import capture_examples, greedy_continuations, split_held_out
from specbench.heads.train import TrainSettings, agreement, fit, make_batches
from specbench.models.eagle3 import Eagle3Head, default_aux_layers, head_config


EMBEDDING_SCALE = 0.01  # the target's token embeddings reach its residual stream through attention alone


@dataclass(frozen=True)
class Settings:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    kv_heads: int
    draft_layers: int  # the small draft: the target's first layers, with its embeddings, final norm and lm_head
    dtype: str
    prompts: int
    prompt_tokens: int
    max_new_tokens: int
    head_prompts: int  # the EAGLE-3 head is distilled from the target's continuations of this many other prompts
    head_epochs: int
    head_learning_rate: float = 1e-4  # small: the head starts as the target's first layer (warm_start)
    upper_scale: float = 0.02  # the target's layers after its first write into the residual stream at this scale
    init_std: float = 0.02  # the weights' initial spread: logits spread about init_std * sqrt(hidden_size)
    gamma: int = 3
    seed: int = 0


FULL = Settings(vocab_size=32000, hidden_size=2048, intermediate_size=8192, layers=16, heads=32, kv_heads=8,
                draft_layers=4, dtype="bfloat16", prompts=4, prompt_tokens=32, max_new_tokens=128, head_prompts=128,
                head_epochs=10)
TINY = Settings(vocab_size=256, hidden_size=64, intermediate_size=128, layers=4, heads=4, kv_heads=2, draft_layers=1,
                dtype="float32", prompts=2, prompt_tokens=12, max_new_tokens=24, head_prompts=8, head_epochs=5,
                init_std=0.1)  # logits as spread as FULL's


# --- models ------------------------------------------------------------------------------------------------------

def llama(settings: Settings, layers: int, *, device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=settings.vocab_size, hidden_size=settings.hidden_size,
                         intermediate_size=settings.intermediate_size, num_hidden_layers=layers,
                         num_attention_heads=settings.heads, num_key_value_heads=settings.kv_heads,
                         max_position_embeddings=2048, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0, initializer_range=settings.init_std)
    with torch.device(device):
        return LlamaForCausalLM(config).to(dtype).eval()


def build_models(settings: Settings, *, device: torch.device, dtype: torch.dtype) -> dict[str, LlamaForCausalLM]:
    """The target, its copy (the self-draft) and the small draft cut from it. Random weights agree with nothing, so
    the target's first layer decides most of its choices (the later ones scaled down, its embeddings too): a draft
    of its first layers, and a head started from its first layer, then agree with it often."""
    torch.manual_seed(settings.seed)
    target = llama(settings, settings.layers, device=device, dtype=dtype)
    with torch.no_grad():
        target.model.embed_tokens.weight.mul_(EMBEDDING_SCALE)
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(settings.upper_scale)
            layer.mlp.down_proj.weight.mul_(settings.upper_scale)
    small = llama(settings, settings.draft_layers, device=device, dtype=dtype)
    keys = small.state_dict().keys()
    small.load_state_dict({name: tensor for name, tensor in target.state_dict().items() if name in keys})
    return {"target": target, "self-draft": copy.deepcopy(target), "small draft": small}


def prompt_ids(settings: Settings, count: int, *, seed: int) -> list[list[int]]:
    """`count` prompts of random ids (none of the special ids 0-2)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, settings.vocab_size, (count, settings.prompt_tokens), generator=generator).tolist()


def warm_start(head: Eagle3Head, target: LlamaForCausalLM) -> None:
    """The head as the target's first decoder layer reading the next token's embedding: the embedding half of its
    q, k and v that layer's, the hidden half zero, and hidden_norm zero (its hidden input adds nothing yet)."""
    layer, hidden, attention = target.model.layers[0], target.config.hidden_size, head.midlayer.self_attn
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj"):
            weight = getattr(attention, name).weight  # [out, 2H]: embedding ⊕ hidden
            weight.zero_()
            weight[:, :hidden] = getattr(layer.self_attn, name).weight
        attention.o_proj.weight.copy_(layer.self_attn.o_proj.weight)
        head.midlayer.mlp.load_state_dict(layer.mlp.state_dict())
        head.midlayer.input_layernorm.weight.copy_(layer.input_layernorm.weight)
        head.midlayer.post_attention_layernorm.weight.copy_(layer.post_attention_layernorm.weight)
        head.midlayer.hidden_norm.weight.zero_()
        head.norm.weight.copy_(target.model.norm.weight)


def distil_head(target: LlamaForCausalLM, settings: Settings) -> tuple[Eagle3Head, dict]:
    """An EAGLE-3 head over the target's whole vocabulary, distilled (float32, on the target's device) with
    specbench's trainer from the target's greedy continuations of other prompts; returned in the target's dtype."""
    started = time.perf_counter()
    device, config = target.device, target.config
    layers = default_aux_layers(config.num_hidden_layers)
    prompts = prompt_ids(settings, settings.head_prompts, seed=settings.seed + 2)
    continuations = greedy_continuations(target, prompts, max_new_tokens=settings.max_new_tokens, eos_token_ids=(),
                                         pad_token_id=0, batch_size=32)
    examples = capture_examples(target, prompts, continuations, layer_ids=layers)
    train_ids, held_ids = split_held_out(len(examples), held_out=0.15, seed=settings.seed)
    head = Eagle3Head(head_config(config, draft_vocab_size=config.vocab_size, aux_layer_ids=layers,
                                  norm_before_residual=True), own_lm_head=False).float().to(device)
    warm_start(head, target)
    embedding = target.get_input_embeddings().weight.detach()
    frozen = {"embed": lambda ids: torch.nn.functional.embedding(ids, embedding).float(),
              "lm_head_weight": target.get_output_embeddings().weight.detach().float()}
    batching = {"batch_tokens": 2048, "steps": 3, "to_draft": None, "device": device}
    train = make_batches([examples[i] for i in train_ids], **batching)
    held = make_batches([examples[i] for i in held_ids], **batching)
    untrained = agreement(head, held, steps=3, **frozen)
    losses = fit(head, train, settings=TrainSettings(epochs=settings.head_epochs, batch_tokens=2048, ttt_steps=3,
                                                     learning_rate=settings.head_learning_rate, seed=settings.seed),
                 **frozen)
    report = {"aux_layers": list(layers), "train_prompts": len(train_ids), "held_out_prompts": len(held_ids),
              "optimizer_steps": len(losses), "losses": [losses[0], losses[-1]],
              "agreement_untrained": list(untrained), "agreement": list(agreement(head, held, steps=3, **frozen)),
              "seconds": time.perf_counter() - started}
    return head.to(target.dtype).eval(), report



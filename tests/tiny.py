"""Tiny random Llama-style models built from a config: fast, offline, deterministic."""

from __future__ import annotations

import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(
    *, vocab_size: int = 64, layers: int = 2, hidden: int = 64, seed: int = 0, init_std: float = 0.02
) -> LlamaForCausalLM:
    """A larger init_std gives peaked next-token distributions (random models are otherwise near uniform)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=init_std,
    )
    return LlamaForCausalLM(config).eval()


def perturbed(model: LlamaForCausalLM, *, scale: float, seed: int = 1) -> LlamaForCausalLM:
    """A draft that agrees with `model` often but not always: its weights plus Gaussian noise."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))
    return draft


def resized_vocab(model: LlamaForCausalLM, vocab_size: int) -> LlamaForCausalLM:
    """The same network with a larger or smaller embedding matrix (padded rows are very unlikely tokens)."""
    draft = copy.deepcopy(model)
    old = draft.get_output_embeddings().weight.shape[0]
    draft.resize_token_embeddings(vocab_size, mean_resizing=False)
    if vocab_size > old:
        with torch.no_grad():
            draft.get_output_embeddings().weight[old:] = 0.0
            draft.get_output_embeddings().weight[old:, 0] = -100.0
    return draft.eval()

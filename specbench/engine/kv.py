"""A causal LM with a KV cache: forward only the new tokens, roll the cache back after a rejection."""

from __future__ import annotations

import functools
import inspect

import torch
from transformers import DynamicCache


@functools.cache
def _cache_keyword(model_class: type) -> str:
    """transformers 5.x names the cache argument `cache`; earlier releases `past_key_values`."""
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def new_cache(model: torch.nn.Module) -> DynamicCache:
    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older transformers
        return DynamicCache()


def forward(model: torch.nn.Module, input_ids: torch.Tensor, cache: DynamicCache, *, last: int | None = None) -> torch.Tensor:
    """input_ids [1, T] appended after the cached tokens -> logits [T', V] for the last `last` positions
    (all T when None). The cache grows by T."""
    kwargs = {_cache_keyword(type(model)): cache, "use_cache": True}
    if last is not None:
        kwargs["logits_to_keep"] = last
    return model(input_ids=input_ids, **kwargs).logits[0]


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def crop(cache: DynamicCache, length: int) -> None:
    """Drop cached positions beyond `length` (a negative crop: the form every transformers release takes)."""
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)


def check_croppable(cache: DynamicCache, model_name: str) -> None:
    if not getattr(cache, "is_croppable", True):
        raise ValueError(
            f"model '{model_name}' uses a cache that cannot be rolled back after a rejected draft "
            "(sliding-window or linear attention); speculative decoding needs a full-attention model"
        )

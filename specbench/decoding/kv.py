"""A causal LM with a KV cache: forward only the new tokens, roll the cache back after a rejection.

`CachedModel` is what the decoder and the draft proposer hold: `DynamicModel` here (a DynamicCache per request,
any model), or `static.StaticModel` (one preallocated cache, compiled steps; full-attention models)."""

from __future__ import annotations

import functools
import inspect
from typing import Protocol

import torch
from transformers import DynamicCache

try:
    from transformers.cache_utils import DynamicLayer
except ImportError:  # transformers without per-layer cache objects: keep the plain DynamicCache
    DynamicLayer = None

CHUNK_TOKENS = 64  # a growing layer's buffer grows by this many positions at a time


@functools.cache
def cache_keyword(model_class: type) -> str:
    """transformers 5.x names the cache argument `cache`; earlier releases `past_key_values`."""
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


class CachedModel(Protocol):
    """A model and the KV cache of the request it is decoding."""

    model: torch.nn.Module

    def begin(self, max_length: int, *, rolls_back: bool) -> None:
        """Start a request of up to max_length tokens with an empty cache; raises a ValueError when the cache
        cannot hold it (or, with rolls_back, cannot roll back a rejection in it)."""

    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [1, P] (the prompt) -> the last position's logits [V]."""

    def forward(self, input_ids: torch.Tensor, *, last: int | None = None) -> torch.Tensor:
        """input_ids [1, T] after the cached tokens -> logits [T', V] of the last `last` positions (all T when None)."""

    def crop(self, length: int) -> None:
        """Forget the cached positions from `length` on."""

    @property
    def length(self) -> int:
        """Cached positions."""


class DynamicModel:
    """A model with a DynamicCache per request: any cache layout transformers builds (sliding windows, linear
    attention), eager forward passes."""

    def __init__(self, model: torch.nn.Module, *, name: str | None = None):
        self.model, self.name = model, name or model_name(model)
        self.cache = new_cache(model)

    def begin(self, max_length: int, *, rolls_back: bool) -> None:
        self.cache = new_cache(self.model)
        if rolls_back:
            check_window(self.cache, self.name, max_length=max_length)

    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        logits = forward(self.model, input_ids, self.cache, last=1)[-1]
        check_croppable(self.cache, self.name)
        return logits

    def forward(self, input_ids: torch.Tensor, *, last: int | None = None) -> torch.Tensor:
        return forward(self.model, input_ids, self.cache, last=last)

    def crop(self, length: int) -> None:
        crop(self.cache, length)

    @property
    def length(self) -> int:
        return cache_length(self.cache)


def as_cached(model: "torch.nn.Module | CachedModel", *, name: str | None = None) -> CachedModel:
    """A plain module decodes on a DynamicCache; a CachedModel (a StaticModel) is used as it is."""
    return DynamicModel(model, name=name) if isinstance(model, torch.nn.Module) else model


def new_cache(model: torch.nn.Module) -> DynamicCache:
    """A DynamicCache whose full-attention layers append in place (`GrowingLayer`); other layer kinds
    (sliding window, linear attention) are kept as transformers builds them."""
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # older transformers
        return DynamicCache()
    layers = getattr(cache, "layers", None)
    if DynamicLayer is not None and layers and all(type(layer) is DynamicLayer for layer in layers):
        cache.layers = [GrowingLayer() for _ in layers]
    return cache


if DynamicLayer is not None:

    class GrowingLayer(DynamicLayer):
        """DynamicLayer's keys and values as views of a preallocated [B, H, capacity, D] buffer: appending T
        positions writes T positions instead of copying the whole cache (DynamicLayer's torch.cat, O(length)
        per layer per step), and a crop (inherited) only shortens the views. The buffer grows by
        CHUNK_TOKENS positions when full, so at most that many positions are allocated unused."""

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            start = self.get_seq_length()
            end = start + key_states.shape[-2]
            buffer = getattr(self, "_key_buffer", None)
            if buffer is None or end > buffer.shape[-2] or (start and self.keys.data_ptr() != buffer.data_ptr()):
                self._grow(key_states, value_states, start, capacity=end + CHUNK_TOKENS)
            self._key_buffer[..., start:end, :] = key_states
            self._value_buffer[..., start:end, :] = value_states
            self.keys = self._key_buffer[..., :end, :]
            self.values = self._value_buffer[..., :end, :]
            return self.keys, self.values

        def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int, *, capacity: int) -> None:
            """New buffers holding the first `length` cached positions (the current views)."""
            batch, heads, _, key_dim = key_states.shape
            keys = key_states.new_empty((batch, heads, capacity, key_dim))
            values = value_states.new_empty((batch, heads, capacity, value_states.shape[-1]))
            if length:
                keys[..., :length, :] = self.keys
                values[..., :length, :] = self.values
            self._key_buffer, self._value_buffer = keys, values


def forward(model: torch.nn.Module, input_ids: torch.Tensor, cache: DynamicCache, *, last: int | None = None) -> torch.Tensor:
    """input_ids [1, T] appended after the cached tokens -> logits [T', V] for the last `last` positions
    (all T when None). The cache grows by T."""
    kwargs = {cache_keyword(type(model)): cache, "use_cache": True}
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


def model_name(model: torch.nn.Module) -> str:
    """The folder or hub id a model was loaded from, else its class name."""
    return getattr(model.config, "name_or_path", "") or type(model).__name__


def sliding_window(cache: DynamicCache) -> int | None:
    """The smallest window of the cache's sliding-window layers; None when no layer slides. Read from the
    layers transformers builds for the config, so a config that sets sliding_window without using it
    (Qwen2 with use_sliding_window = false) gives None."""
    windows = [getattr(layer, "sliding_window", None) for layer in getattr(cache, "layers", ())]
    return min((window for window in windows if window is not None), default=None)


def check_window(cache: DynamicCache, model_name: str, *, max_length: int) -> None:
    """A sliding-window layer keeps only the last sliding_window - 1 positions, so a rejected draft cannot be
    rolled back once it holds more. A request of up to max_length tokens (prompt + max_new_tokens) caches all
    but the newest, so with max_length <= sliding_window the cache never slides."""
    window = sliding_window(cache)
    if window is not None and max_length > window:
        raise ValueError(
            f"model '{model_name}' uses a sliding-window attention cache (sliding_window={window}) that speculative "
            f"decoding cannot roll back once prompt + max_new_tokens ({max_length}) exceeds it; use a model without "
            "sliding_window, set \"sliding_window\": null in its config.json, or keep prompt + max_new_tokens within "
            "the window"
        )


def check_croppable(cache: DynamicCache, model_name: str) -> None:
    if not getattr(cache, "is_croppable", True):
        raise ValueError(
            f"model '{model_name}' uses a cache that cannot be rolled back after a rejected draft "
            "(sliding-window or linear attention); speculative decoding needs a full-attention model"
        )

"""Proposers: where drafted tokens come from (the `method` of a point)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from specbench.decoding import kv
from specbench.decoding.sampling import Sampler


@dataclass(frozen=True)
class Proposal:
    tokens: torch.Tensor  # [k] long, on the target's device
    probs: torch.Tensor | None  # [k, V] the draft's q for each token; None for a deterministic proposer


class Proposer(Protocol):
    method: str

    def prefill(self, prompt_ids: list[int], *, max_length: int) -> None:
        """Start a request (called once, before the target's prefill); max_length = prompt + max_new_tokens."""

    def propose(self, sequence: list[int], k: int, sampler: Sampler) -> Proposal:
        """Up to k tokens to follow `sequence` (prompt + output so far)."""

    def rollback(self, length: int) -> None:
        """The first `length` tokens of the sequence are final; forget anything cached beyond them."""


class BaselineProposer:
    """Proposes nothing: the decoder then decodes one token per target step (autoregressive)."""

    method = "baseline"

    def __init__(self, device: torch.device):
        self._empty = Proposal(torch.empty(0, dtype=torch.long, device=device), None)

    def prefill(self, prompt_ids: list[int], *, max_length: int) -> None:
        pass

    def propose(self, sequence: list[int], k: int, sampler: Sampler) -> Proposal:
        return self._empty

    def rollback(self, length: int) -> None:
        pass


def draw(logits: torch.Tensor, sampler: Sampler, probs: list[torch.Tensor]) -> torch.Tensor:
    """A drafted token from [V] logits: the argmax when greedy, else a sample from the sampler's distribution,
    which is appended to `probs` (verification needs the draft's q)."""
    if sampler.greedy:
        return logits.argmax(dim=-1)
    q = sampler.probs(logits)
    probs.append(q)
    return sampler.sample(q)


class DraftModelProposer:
    """A separate causal LM drafts k tokens autoregressively with its own KV cache.

    The draft's logits are aligned to the target's vocabulary size `vocab_size`: extra rows of a larger
    embedding matrix are never proposed, and ids the draft lacks get q = 0. An id the draft cannot embed
    (one of the target's padding rows) is fed to the draft as its pad token: that only affects what the
    draft guesses, never the output, which the target verifies.
    """

    method = "draft"

    def __init__(self, model: torch.nn.Module | kv.CachedModel, *, vocab_size: int, device: torch.device,
                 name: str | None = None):
        self.cached = kv.as_cached(model, name=name)  # a plain module drafts on a DynamicCache
        self.model = self.cached.model
        self.vocab_size = vocab_size
        self.device = device
        self.name = name or kv.model_name(self.model)
        self.input_vocab_size = self.model.get_input_embeddings().weight.shape[0]
        self.pad_id = self.model.config.pad_token_id if self.model.config.pad_token_id is not None else 0

    @property
    def cache(self):
        return self.cached.cache

    def prefill(self, prompt_ids: list[int], *, max_length: int) -> None:
        self.cached.begin(max_length, rolls_back=True)
        self.cached.prefill(self._input(prompt_ids))

    def propose(self, sequence: list[int], k: int, sampler: Sampler) -> Proposal:
        step_input = self._input(sequence[self.cached.length:])  # [1, T>=1]: the tokens not yet cached
        tokens, probs = [], []
        for _ in range(k):
            logits = self._align(self.cached.forward(step_input, last=1)[-1])  # [V]
            token = draw(logits, sampler, probs)
            tokens.append(token)
            step_input = token.view(1, 1)
        return Proposal(torch.stack(tokens), torch.stack(probs) if probs else None)

    def rollback(self, length: int) -> None:
        self.cached.crop(length)

    def _input(self, ids: list[int]) -> torch.Tensor:
        if max(ids) >= self.input_vocab_size:
            ids = [i if i < self.input_vocab_size else self.pad_id for i in ids]
        return torch.tensor([ids], device=self.device)

    def _align(self, logits: torch.Tensor) -> torch.Tensor:
        """[Vd] -> [V] on the target's vocabulary."""
        size = logits.shape[-1]
        if size == self.vocab_size:
            return logits
        if size > self.vocab_size:
            return logits[: self.vocab_size]
        padding = logits.new_full((self.vocab_size - size,), float("-inf"))
        return torch.cat([logits, padding])


class NgramProposer:
    """Prompt-lookup decoding: find the last n tokens (n from ngram_max down to ngram_min) earlier in
    the prompt or output, at their earliest occurrence, and propose the up-to-k tokens that followed."""

    method = "ngram"

    def __init__(self, *, ngram_min: int = 1, ngram_max: int = 3, device: torch.device):
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max (got {ngram_min}, {ngram_max})")
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.device = device

    def prefill(self, prompt_ids: list[int], *, max_length: int) -> None:
        pass

    def propose(self, sequence: list[int], k: int, sampler: Sampler) -> Proposal:
        tokens = lookup(np.asarray(sequence), k=k, ngram_min=self.ngram_min, ngram_max=self.ngram_max)
        return Proposal(torch.tensor(tokens, dtype=torch.long, device=self.device), None)

    def rollback(self, length: int) -> None:
        pass


def lookup(sequence: np.ndarray, *, k: int, ngram_min: int, ngram_max: int) -> list[int]:
    """The tokens following the earliest earlier occurrence of the sequence's last n tokens."""
    length = len(sequence)
    # Every occurrence ends where the last token occurs earlier: one pass over the sequence finds the
    # candidate ends, then each longer n-gram only filters those candidates.
    ends = np.flatnonzero(sequence[: length - 1] == sequence[length - 1])  # ascending, all < length - 1
    for n in range(min(ngram_max, length - 1), ngram_min - 1, -1):
        matches = ends[ends >= n - 1]
        for back in range(1, n):
            matches = matches[sequence[matches - back] == sequence[length - 1 - back]]
        if matches.size:
            start = matches[0] + 1  # the earliest occurrence; < length, as it ends before the last token
            return sequence[start : start + k].tolist()
    return []

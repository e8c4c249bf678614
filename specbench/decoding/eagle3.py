"""The EAGLE-3 proposer: a one-layer head drafts from the target's auxiliary hidden states and its own.

As vLLM drafts (`v1/spec_decode/llm_base_proposer.py`): the head's position p reads the embedding of token
p + 1 and a hidden state; at positions the target has verified that is fc(target aux states at p), at drafted
positions the head's own pre-norm output one position earlier. The head's output at p proposes token p + 2.
After each verification the head's cache is rewritten from the target's states at the positions it verified
(its drafted entries are dropped), so verification stays the decoder's lossless rule.

An MTP layer drafts the same way (`MtpProposer`): it reads the target's last hidden state before the final norm
instead of fc(three layers' states), and its output, already normed, is both the next hidden state and the logits'
input (specbench.models.mtp).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn

from specbench.decoding.proposers import Proposal, draw
from specbench.decoding.sampling import Sampler
from specbench.models.eagle3 import Attend, Eagle3Head
from specbench.models.mtp import MtpLayer


class AuxSource(Protocol):
    """What the proposer reads the target's auxiliary states from."""

    aux_layers: Sequence[int]

    def latest(self) -> torch.Tensor:
        """[T, A·H]: the auxiliary states of the target's latest forward's T positions, in layer order."""


class AuxCapture:
    """Forward pre-hooks on the target that keep the auxiliary states of its latest forward: the input of
    decoder layer L (vLLM's aux layer L), or of the final norm for L = number of layers."""

    def __init__(self, target: nn.Module, layer_ids: Sequence[int]):
        decoder = target.get_decoder()
        modules = [*decoder.layers, decoder.norm]  # index L: the module whose input is aux state L
        self.aux_layers = tuple(layer_ids)
        self.states: list[torch.Tensor | None] = [None] * len(layer_ids)
        self.handles = [modules[layer].register_forward_pre_hook(self._keeper(slot), with_kwargs=True)
                        for slot, layer in enumerate(layer_ids)]

    def _keeper(self, slot: int):
        def keep(module, args, kwargs):
            self.states[slot] = args[0] if args else kwargs["hidden_states"]
        return keep

    def latest(self) -> torch.Tensor:
        """[T, A·H]: the aux states of the latest forward's T positions, concatenated in layer order."""
        if any(state is None for state in self.states):
            raise RuntimeError("the target has not run a forward pass since the EAGLE-3 head was attached")
        return torch.cat(self.states, dim=-1)[0]

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


class HeadCache:
    """The head's keys and values by position, [1, kv, capacity, d]; writing at a position makes it the last."""

    def __init__(self, capacity: int, *, kv_heads: int, head_dim: int, device: torch.device, dtype: torch.dtype):
        self.keys = torch.zeros(1, kv_heads, capacity, head_dim, device=device, dtype=dtype)
        self.values = torch.zeros_like(self.keys)

    def attend_at(self, start: int) -> Attend:
        """Attention for T new positions start..start+T-1, each over every position up to itself."""
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            end = start + q.shape[2]
            self.keys[:, :, start:end], self.values[:, :, start:end] = k, v
            mask = None
            if q.shape[2] > 1:  # causal within the new positions: query i sees keys up to start + i
                mask = torch.ones(q.shape[2], end, dtype=torch.bool, device=q.device).tril(diagonal=start)
            return nn.functional.scaled_dot_product_attention(
                q, self.keys[:, :, :end], self.values[:, :, :end], attn_mask=mask, enable_gqa=True)
        return attend


class Eagle3Proposer:
    """Drafts k tokens per step with an EAGLE-3 head attached to the target (hooks read its aux states)."""

    method = "eagle3"
    drafter = "EAGLE-3 head"

    def __init__(self, head: "Eagle3Head | MtpLayer", target: nn.Module, *, device: torch.device, name: str | None = None,
                 aux: "AuxSource | None" = None):
        """`aux`: where the target's auxiliary states come from when its forward is compiled (a
        `static.StaticModel` built with the head's aux layers); by default the proposer hooks the target itself."""
        self.head, self.device, self.name = head, device, name or self.method
        if aux is not None:
            if tuple(aux.aux_layers) != tuple(head.aux_layer_ids):
                raise ValueError(f"the target keeps auxiliary states of layers {list(aux.aux_layers)}, the "
                                 f"{self.drafter} '{self.name}' reads layers {list(head.aux_layer_ids)}")
            self.capture = aux
        else:
            self.capture = AuxCapture(target, head.aux_layer_ids)
            weakref.finalize(self, self.capture.close)  # the hooks go with the proposer
        self.embed = head.embed_tokens if head.embed_tokens is not None else target.get_input_embeddings()
        self.lm_head_weight = (head.lm_head if head.lm_head is not None else target.get_output_embeddings()).weight
        self.vocab_size = target.get_output_embeddings().weight.shape[0]
        self.cache: HeadCache | None = None
        self.committed = 0  # positions whose target states are in the head's cache

    def prefill(self, prompt_ids: list[int], *, max_length: int) -> None:
        attention, weight = self.head.attention, next(self.head.parameters())
        self.cache = HeadCache(max_length, kv_heads=attention.kv_heads, head_dim=attention.head_dim,
                               device=weight.device, dtype=weight.dtype)
        self.committed = 0

    def propose(self, sequence: list[int], k: int, sampler: Sampler) -> Proposal:
        # The target has verified positions < end (the newest token is fed at the next step); its latest
        # forward covered positions from self.committed on.
        end = len(sequence) - 1
        aux = self.capture.latest()[: end - self.committed]  # [n, A·Ht]
        ids = torch.tensor([sequence[self.committed + 1 :]], device=self.device)  # [1, n]: token p + 1 at p
        prenorm = self._step(ids, self.head.first_hidden(aux.unsqueeze(0)), start=self.committed)[:, -1:]  # [1, 1, H]
        self.committed = end
        tokens, probs = [], []
        for i in range(k):
            logits = self._logits(prenorm[0, -1])  # [V]
            token = draw(logits, sampler, probs)
            tokens.append(token)
            if i + 1 < k:  # position end + i reads the drafted token and the head's own state
                prenorm = self._step(token.view(1, 1), prenorm, start=end + i)
        if not tokens:
            return Proposal(torch.empty(0, dtype=torch.long, device=self.device), None)
        return Proposal(torch.stack(tokens), torch.stack(probs) if probs else None)

    def rollback(self, length: int) -> None:
        pass  # the next propose rewrites the head's cache from the positions the target verified

    def _step(self, ids: torch.Tensor, hidden: torch.Tensor, *, start: int) -> torch.Tensor:
        positions = torch.arange(start, start + ids.shape[1], device=self.device).unsqueeze(0)
        return self.head.step(self.embed(ids), hidden, positions, self.cache.attend_at(start))

    def _logits(self, prenorm: torch.Tensor) -> torch.Tensor:
        """[H] -> [V] on the target's vocabulary."""
        logits = self.head.to_target_vocab(self.head.draft_logits(prenorm, self.lm_head_weight))
        if logits.shape[-1] < self.vocab_size:  # the target's padding rows are never proposed
            logits = torch.cat([logits, logits.new_full((self.vocab_size - logits.shape[-1],), float("-inf"))])
        return logits[: self.vocab_size]


class MtpProposer(Eagle3Proposer):
    """Drafts k tokens per step with the target's first MTP layer, chained, as vLLM 0.32 drafts a MiMo model's
    (specbench.models.mtp): the EAGLE-3 proposer's cache and steps, the layer reading the target's last hidden state
    before its final norm (its aux "layer" num_hidden_layers) where EAGLE-3 reads fc of three layers' states."""

    method = "mtp"
    drafter = "MTP layer"

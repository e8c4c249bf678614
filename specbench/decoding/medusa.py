"""The Medusa proposer: heads on the target's final hidden state draft a chain, each head's top-1 (as vLLM drafts).

The target's last norm is hooked: after each target forward the proposer keeps its output. The row that chose the
newest token of the sequence (position end - 1, where end is that token's position) is what every head reads; head h
proposes the token at end + 1 + h. Drafts are a deterministic guess (q a point mass), verified losslessly by the
decoder like an n-gram lookup's.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from specbench.decoding.proposers import Proposal
from specbench.decoding.sampling import Sampler
from specbench.models.medusa import MedusaHeads


class FinalHidden:
    """A forward hook on the target's last norm keeping its output of the latest forward: [T, H]."""

    def __init__(self, target: nn.Module):
        self.latest: torch.Tensor | None = None
        self.handle = target.get_decoder().norm.register_forward_hook(self._keep)

    def _keep(self, module, args, output) -> None:
        self.latest = output[0]

    def close(self) -> None:
        self.handle.remove()


class MedusaProposer:
    method = "medusa"

    def __init__(self, heads: MedusaHeads, target: nn.Module, *, device: torch.device, name: str | None = None):
        self.heads, self.device, self.name = heads, device, name or "medusa"
        self.capture = FinalHidden(target)
        weakref.finalize(self, self.capture.close)  # the hook goes with the proposer
        self.vocab_size = target.get_output_embeddings().weight.shape[0]
        self.start = 0  # the position of the first row of the target's latest forward

    def prefill(self, prompt_ids: list[int], *, max_length: int) -> None:
        self.start = 0

    def propose(self, sequence: list[int], k: int, sampler: Sampler) -> Proposal:
        end = len(sequence) - 1  # the newest token, fed at the next target step
        if self.capture.latest is None:
            raise RuntimeError("the target has not run a forward pass since the Medusa heads were attached")
        hidden = self.capture.latest[end - 1 - self.start]  # [H]: the row that chose sequence[end]
        self.start = end  # the next forward starts at the newest token
        if k <= 0:
            return Proposal(torch.empty(0, dtype=torch.long, device=self.device), None)
        logits = self.heads(hidden.to(self.heads.lm_heads[0].weight.dtype), heads=k)  # [k', V]
        return Proposal(logits[:, : self.vocab_size].argmax(dim=-1).to(self.device), None)

    def rollback(self, length: int) -> None:
        pass  # the next propose reads the row the target verified last

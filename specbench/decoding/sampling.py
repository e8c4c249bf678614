"""Sampling and lossless verification: pure tensor functions.

Shapes: V = target vocabulary size, k = number of drafted tokens in a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampler:
    """How tokens are drawn. temperature == 0 means greedy; top_p shapes p and q identically."""

    temperature: float
    top_p: float
    generator: torch.Generator | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits_to_probs(logits, temperature=self.temperature, top_p=self.top_p)

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        return sample(probs, generator=self.generator)


def logits_to_probs(logits: torch.Tensor, *, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """softmax(logits / T), then keep the smallest set of most probable tokens whose mass reaches
    top_p (a token is kept when the mass strictly above it is < top_p) and renormalise. [..., V]."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_above >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum(dim=-1, keepdim=True)


def sample(probs: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of probs [..., V] -> [...], via the exponential race argmax(p / E), E ~ Exp(1):
    exact, and free of the host sync that torch.multinomial needs."""
    race = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / race).argmax(dim=-1)


def leading_accepts(accept: torch.Tensor) -> torch.Tensor:
    """Number of leading True values of a [k] bool tensor (0-dim long tensor)."""
    return accept.long().cumprod(dim=0).sum()


def top2_gap(logits: torch.Tensor) -> torch.Tensor:
    """logits [..., V] -> [...] float32: the largest logit minus the second largest (0 at an exact tie)."""
    top2 = logits.topk(2, dim=-1).values.float()  # [..., 2]
    return top2[..., 0] - top2[..., 1]


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[int, int]:
    """target_logits [k+1, V], draft_tokens [k] -> (accepted, next token).
    Accept drafted tokens while they equal the target's argmax; the next token is the target's argmax
    after the last accepted one (a correction, or the bonus token when all k are accepted)."""
    k = draft_tokens.shape[0]
    ids = torch.cat([target_logits.argmax(dim=-1), draft_tokens]).tolist()  # [k+1 choices, k drafts]: one host sync
    choice, drafted = ids[: k + 1], ids[k + 1 :]
    accepted = 0
    while accepted < k and drafted[accepted] == choice[accepted]:
        accepted += 1
    return accepted, choice[accepted]


def verify_sampling(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    *,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    target_probs p [k+1, V]; draft_tokens d [k]; draft_probs q [k, V], or None for a deterministic
    proposer (q is then a point mass on d). Accept d_i with probability min(1, p(d_i) / q(d_i)); at the
    first rejection sample from norm(max(0, p - q)); when all k are accepted sample the bonus from p_k.
    """
    k = draft_tokens.shape[0]
    rows = torch.arange(k, device=draft_tokens.device)
    p_d = target_probs[rows, draft_tokens]  # [k]
    q_d = draft_probs[rows, draft_tokens] if draft_probs is not None else torch.ones_like(p_d)
    u = torch.rand(k, device=p_d.device, generator=generator)
    n = int(leading_accepts(u * q_d < p_d))  # u < p/q, without dividing by q
    if n == k:
        return n, int(sample(target_probs[k], generator=generator))
    p = target_probs[n]
    if draft_probs is not None:
        residual = (p - draft_probs[n]).clamp_(min=0.0)
    else:
        residual = p.clone()
        residual[draft_tokens[n]] = 0.0
    total = residual.sum()
    # A rejection implies p(d) < q(d), so the residual has mass; guard against float round-off only.
    residual = residual / total if total > 0 else p
    return n, int(sample(residual, generator=generator))


def conditional_rates(unconditional: tuple[float, ...]) -> tuple[float, ...]:
    """Per-position unconditional acceptance (P(positions 0..i all accepted), non-increasing) as the chance of
    accepting position i once 0..i-1 were: r_i / r_{i-1} (0 after a position that is never reached)."""
    return tuple(r / q if q > 0 else 0.0 for r, q in zip(unconditional, (1.0, *unconditional[:-1])))


def verify_imposed(target_probs_or_logits: torch.Tensor, draft_tokens: torch.Tensor,
                   conditional: tuple[float, ...], *, greedy: bool,
                   generator: torch.Generator | None = None) -> tuple[int, int]:
    """An acceptance what-if, not verification: drafted token i is kept with probability `conditional[i]` once the
    ones before it were, whatever the target says (vLLM's synthetic rejection sampler does the same), so a step
    accepts per imposed rates while its passes cost what they cost. The next token is the target's own choice after
    the kept ones (its argmax, or a draw from its distribution). Not lossless: the output is not the target's."""
    k = draft_tokens.shape[0]
    u = torch.rand(k, generator=generator, device=draft_tokens.device).tolist() if k else []
    n = 0
    while n < k and u[n] < conditional[n]:
        n += 1
    row = target_probs_or_logits[n]
    return n, int(row.argmax() if greedy else sample(row, generator=generator))

"""Training an EAGLE-3 head with the target frozen, and its top-1 agreement with the target per draft position.

Training-time test (EAGLE-3): for every anchor a of a sequence at once, step 0 reads token a + 1 with fc(the
target's aux states at a) and proposes token a + 2; step j reads token a + 1 + j with the head's own pre-norm
output of step j - 1 and proposes token a + 2 + j. Step j attends to step 0's keys at positions <= a (what the
target verified) and to the keys of steps 1..j at the same anchor (what the head drafted): exactly the cache
`Eagle3Proposer` holds after drafting j tokens from a. The label of each step is the target's greedy choice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from specbench.heads.data import IGNORE, Example
from specbench.models.eagle3 import Attend, Eagle3Head


@dataclass(frozen=True)
class TrainSettings:
    epochs: int
    batch_tokens: int  # padded tokens per optimizer step
    learning_rate: float
    ttt_steps: int  # draft positions unrolled and trained (and evaluated)
    seed: int


@dataclass(frozen=True)
class Batch:
    """Right-padded sequences; tokens and labels carry ttt_steps more padding columns than aux."""

    tokens: torch.Tensor  # [B, L + S] long (0 past the end)
    aux: torch.Tensor  # [B, L, A·Ht] float32
    labels: torch.Tensor  # [B, L + S] draft ids of the target's choice after each position (IGNORE: none)
    target_labels: torch.Tensor  # [B, L + S] the same choice as target ids (IGNORE past the end)
    generated: torch.Tensor  # [B, L + S] bool: the choice predicts a generated token (counts in the agreement)


def make_batches(examples: Sequence[Example], *, batch_tokens: int, steps: int, to_draft: torch.Tensor | None,
                 device: torch.device) -> list[Batch]:
    """Examples in length order, grouped while B x max length <= batch_tokens (one example at least);
    to_draft [V] maps a target id to its draft id (IGNORE outside the draft vocabulary), None for the identity."""
    order = sorted(range(len(examples)), key=lambda i: (examples[i].length, i))
    groups: list[list[Example]] = [[]]
    for i in order:
        if groups[-1] and (len(groups[-1]) + 1) * examples[i].length > batch_tokens:
            groups.append([])
        groups[-1].append(examples[i])
    return [_batch(group, steps=steps, to_draft=to_draft, device=device) for group in groups if group]


def _batch(group: list[Example], *, steps: int, to_draft: torch.Tensor | None, device: torch.device) -> Batch:
    width = max(example.length for example in group) + steps
    tokens = torch.zeros(len(group), width, dtype=torch.long)
    target_labels = torch.full((len(group), width), IGNORE, dtype=torch.long)
    generated = torch.zeros(len(group), width, dtype=torch.bool)
    aux = torch.zeros(len(group), width - steps, group[0].aux.shape[1])
    for row, example in enumerate(group):
        tokens[row, : example.length] = example.tokens
        target_labels[row, : example.length] = example.labels
        generated[row, example.prompt_tokens : example.length] = True
        aux[row, : example.length] = example.aux
    labels = target_labels.clone()
    if to_draft is not None:
        known = target_labels != IGNORE
        labels[known] = to_draft[target_labels[known]]
    return Batch(tokens.to(device), aux.to(device), labels.to(device), target_labels.to(device), generated.to(device))


def unroll(head: Eagle3Head, batch: Batch, *, embed: nn.Module, lm_head_weight: torch.Tensor,
           steps: int) -> list[torch.Tensor]:
    """Draft logits [B, T, D] of each step for every anchor a = 0..T-1 (T = L - 1)."""
    anchors = batch.aux.shape[1] - 1
    hidden = head.first_hidden(batch.aux[:, :anchors])  # [B, T, H]
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    logits = []
    for step in range(steps):
        with torch.no_grad():  # the target's embeddings stay frozen
            embeds = embed(batch.tokens[:, 1 + step : 1 + step + anchors])  # token a + 1 + step at anchor a
        positions = (torch.arange(anchors, device=embeds.device) + step).expand(embeds.shape[0], anchors)
        hidden = head.step(embeds, hidden, positions, _ttt_attention(keys, values))
        logits.append(head.draft_logits(hidden, lm_head_weight))
    return logits


def _ttt_attention(keys: list[torch.Tensor], values: list[torch.Tensor]) -> Attend:
    """Step j's attention: step 0's keys causally, the later steps' keys at the query's own anchor."""
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        keys.append(k)
        values.append(v)
        group = q.shape[1] // k.shape[1]
        ks = [key.repeat_interleave(group, dim=1) for key in keys]  # [B, h, T, d] each
        vs = [value.repeat_interleave(group, dim=1) for value in values]
        scale, anchors = q.shape[-1] ** -0.5, q.shape[2]
        causal = torch.ones(anchors, anchors, dtype=torch.bool, device=q.device).tril()
        scores = [(q @ ks[0].transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]  # [B, h, T, T]
        scores += [(q * key).sum(dim=-1, keepdim=True) * scale for key in ks[1:]]  # [B, h, T, 1] each
        weights = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(q.dtype)
        out = weights[..., :anchors] @ vs[0]
        for i, value in enumerate(vs[1:]):
            out = out + weights[..., anchors + i : anchors + i + 1] * value
        return out
    return attend


def step_labels(labels: torch.Tensor, step: int, anchors: int) -> torch.Tensor:
    """[B, L + S] -> [B, T]: the label of anchor a at `step` is the choice after position a + 1 + step."""
    return labels[:, 1 + step : 1 + step + anchors]


def batch_loss(head: Eagle3Head, batch: Batch, *, embed: nn.Module, lm_head_weight: torch.Tensor,
               steps: int) -> torch.Tensor:
    """Mean over steps of the cross-entropy against the target's greedy choice."""
    logits = unroll(head, batch, embed=embed, lm_head_weight=lm_head_weight, steps=steps)
    anchors = logits[0].shape[1]
    losses = [nn.functional.cross_entropy(step_logits.flatten(0, 1).float(),
                                          step_labels(batch.labels, step, anchors).flatten(), ignore_index=IGNORE)
              for step, step_logits in enumerate(logits)]
    return torch.stack(losses).mean()


def agreement(head: Eagle3Head, batches: Sequence[Batch], *, embed: nn.Module, lm_head_weight: torch.Tensor,
              steps: int) -> tuple[float, ...]:
    """Top-1 agreement with the target at each draft position 1..steps, over the anchors whose label predicts a
    generated token, given the earlier positions right (teacher-forced): what greedy acceptance at that
    position needs. A choice outside the draft vocabulary counts as a miss."""
    hits, counts = [0] * steps, [0] * steps
    was_training = head.training
    head.eval()
    with torch.no_grad():
        for batch in batches:
            logits = unroll(head, batch, embed=embed, lm_head_weight=lm_head_weight, steps=steps)
            anchors = logits[0].shape[1]
            for step, step_logits in enumerate(logits):
                choice = head.to_target_vocab(step_logits).argmax(dim=-1)  # [B, T] target ids
                labels = step_labels(batch.target_labels, step, anchors)
                counted = step_labels(batch.generated, step, anchors) & (labels != IGNORE)
                hits[step] += int(((choice == labels) & counted).sum())
                counts[step] += int(counted.sum())
    head.train(was_training)
    return tuple(hit / count if count else float("nan") for hit, count in zip(hits, counts))


def fit(head: Eagle3Head, batches: Sequence[Batch], *, settings: TrainSettings, embed: nn.Module,
        lm_head_weight: torch.Tensor, on_step: Callable[[float], None] = lambda loss: None) -> list[float]:
    """AdamW over the head's parameters, warm-up then cosine decay to a tenth; batches shuffled each epoch
    (seeded). Returns the loss of every optimizer step."""
    parameters = [parameter for parameter in head.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=settings.learning_rate, betas=(0.9, 0.95), weight_decay=0.0)
    total = settings.epochs * len(batches)
    warmup = max(1, total // 20)

    def scale(step: int) -> float:
        return min(1.0, (step + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(step, total) / total)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, scale)
    generator = torch.Generator().manual_seed(settings.seed)
    losses = []
    head.train()
    for _ in range(settings.epochs):
        for index in torch.randperm(len(batches), generator=generator).tolist():
            loss = batch_loss(head, batches[index], embed=embed, lm_head_weight=lm_head_weight,
                              steps=settings.ttt_steps)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(parameters, 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(float(loss.detach()))
            on_step(losses[-1])
    head.eval()
    return losses

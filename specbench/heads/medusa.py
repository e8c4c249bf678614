"""Medusa heads distilled for a target from its own greedy continuations, as the EAGLE-3 trainer distils its head
(the same prompts, continuations, held-out split, settings and cache; `HeadSettings.ttt_steps` is the number of
heads): the target frozen, each head h trained to predict, from the target's last-norm output at position p, the
target's greedy token at p + 2 + h. Heads start as Medusa starts them (the target's LM head, zero blocks). Saved in
vLLM's format (specbench.models.medusa); the report gives each head's held-out top-1 agreement."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict

import torch

from specbench.decoding import devices
from specbench.heads.data import IGNORE, Example, split_held_out
from specbench.heads.distill import (REPORT_FILE, Observer, cache_entry, read_report, store_files,
                                     target_examples)
from specbench.heads.settings import HeadReport, HeadSettings
from specbench.models.load import load_model
from specbench.models.medusa import MedusaHeads, save_medusa

KIND = "medusa"


def train_medusa(target: str, *, settings: HeadSettings, observer: Observer, device: str = "auto",
                 fresh: bool = False) -> HeadReport:
    """Medusa heads for `target` under `settings`: from the cache, or distilled now and cached."""
    folder, torch_device, dtype = cache_entry(target, settings, kind=KIND, device=device)
    if not fresh and (folder / REPORT_FILE).is_file():
        return read_report(folder)
    started = time.perf_counter()
    observer.message(f"loading target {target}")
    loaded = load_model(target, device=torch_device, dtype=dtype)
    model, config = loaded.model, loaded.model.config
    # the input of the last norm, normed below
    continuations, examples, seconds = target_examples(loaded, settings=settings, observer=observer,
                                                       torch_device=torch_device, layer_ids=[config.num_hidden_layers])
    train_ids, held_ids = split_held_out(len(examples), held_out=settings.held_out, seed=settings.seed)
    norm = model.get_decoder().norm
    heads_count = settings.ttt_steps
    train_set = positions([examples[i] for i in train_ids], norm, heads=heads_count, device=torch_device)
    held_set = positions([examples[i] for i in held_ids], norm, heads=heads_count, device=torch_device)
    clock = time.perf_counter()
    torch.manual_seed(settings.seed)
    heads = MedusaHeads.from_target(model, num_heads=heads_count)
    untrained = agreement(heads, held_set)
    observer.phase("training", settings.epochs * max(1, -(-len(train_set[0]) // settings.batch_tokens)))
    losses = fit(heads, train_set, settings=settings, on_step=lambda loss: observer.advance(note=f"loss {loss:.3f}"))
    devices.synchronize(torch_device)
    seconds["train"] = time.perf_counter() - clock
    seconds["total"] = time.perf_counter() - started
    report = HeadReport(
        folder=str(folder), target=target, target_identity=loaded.identity, settings={**asdict(settings), "kind": KIND},
        device=str(torch_device), agreement=agreement(heads, held_set), agreement_untrained=untrained,
        train_agreement=agreement(heads, train_set), draft_vocab_coverage=1.0, losses=(losses[0], losses[-1]),
        examples={"train_prompts": len(train_ids), "held_out_prompts": len(held_ids),
                  "train_tokens": int(len(train_set[0])), "held_out_tokens": int(len(held_set[0])),
                  "generated_tokens": sum(len(c) for c in continuations)},
        seconds=seconds,
    )
    store_files(lambda tmp: save_medusa(heads, tmp), report, folder)
    return report


def positions(examples: Sequence[Example], norm: torch.nn.Module, *, heads: int,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden [N, H], labels [heads, N]): the last-norm output at every position p whose next token the target
    generated, and for head h the target's greedy token at p + 2 + h (IGNORE past the end)."""
    hidden, labels = [], []
    with torch.no_grad():
        for example in examples:
            first, length = example.prompt_tokens - 1, example.length
            if length - first < 2:
                continue
            normed = norm(example.aux[first:length].to(device=device, dtype=norm.weight.dtype)).float()
            hidden.append(normed)
            rows = torch.full((heads, length - first), IGNORE, dtype=torch.long)
            for h in range(heads):
                later = example.tokens[first + 2 + h:]
                rows[h, : later.shape[0]] = later
            labels.append(rows)
    if not hidden:
        return torch.empty(0, norm.weight.shape[0], device=device), torch.empty(heads, 0, dtype=torch.long)
    return torch.cat(hidden), torch.cat(labels, dim=1).to(device)


def fit(heads: MedusaHeads, data: tuple[torch.Tensor, torch.Tensor], *, settings: HeadSettings,
        on_step=lambda loss: None) -> list[float]:
    """AdamW on the mean cross-entropy over heads and positions, in shuffled batches of `batch_tokens` positions."""
    hidden, labels = data
    optimizer = torch.optim.AdamW(heads.parameters(), lr=settings.learning_rate, weight_decay=0.0)
    generator = torch.Generator().manual_seed(settings.seed)
    losses = []
    heads.train()
    for _ in range(settings.epochs):
        order = torch.randperm(hidden.shape[0], generator=generator)
        for start in range(0, hidden.shape[0], settings.batch_tokens):
            batch = order[start : start + settings.batch_tokens].to(hidden.device)
            logits = heads(hidden[batch])  # [heads, B, V]
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels[:, batch].flatten(),
                                                     ignore_index=IGNORE)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            on_step(losses[-1])
    heads.eval()
    return losses or [float("nan")]


def agreement(heads: MedusaHeads, data: tuple[torch.Tensor, torch.Tensor]) -> tuple[float, ...]:
    """Per head, the share of positions where its top-1 is the target's greedy token."""
    hidden, labels = data
    with torch.no_grad():
        choices = heads(hidden).argmax(dim=-1) if hidden.shape[0] else labels
    shares = []
    for h in range(heads.num_heads):
        counted = labels[h] != IGNORE
        shares.append(float((choices[h][counted] == labels[h][counted]).float().mean()) if counted.any()
                      else float("nan"))
    return tuple(shares)

"""Training data for an EAGLE-3 head, distilled from the target: its own greedy continuations of a workload's
prompts, its auxiliary states at every position and its greedy choice after every position."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationConfig

from specbench.decoding.eagle3 import AuxCapture
from specbench.models.eagle3 import HeadError

IGNORE = -100  # a label that counts in no loss and no agreement


@dataclass(frozen=True)
class Example:
    """One sequence: prompt + the target's greedy continuation, as the head trains and is evaluated on it."""

    tokens: torch.Tensor  # [L] long
    aux: torch.Tensor  # [L, A·Ht] float32, on the CPU: the target's aux states at each position
    labels: torch.Tensor  # [L] long: the target's greedy choice after position p (IGNORE at the last position)
    prompt_tokens: int

    @property
    def length(self) -> int:
        return int(self.tokens.shape[0])


def greedy_continuations(target: nn.Module, prompts: Sequence[list[int]], *, max_new_tokens: int,
                         eos_token_ids: Sequence[int], pad_token_id: int, batch_size: int,
                         on_batch: Callable[[int], None] = lambda done: None) -> list[list[int]]:
    """The target's greedy output after each prompt (to its first end-of-sequence token, kept, or the budget),
    generated in left-padded batches of prompts of similar length."""
    device = next(target.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad_token_id,
                              eos_token_id=list(eos_token_ids) or None)
    outputs: dict[int, list[int]] = {}
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            width = max(len(prompts[i]) for i in chunk)
            ids = torch.tensor([[pad_token_id] * (width - len(prompts[i])) + prompts[i] for i in chunk], device=device)
            mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in chunk], device=device)
            generated = target.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, width:]
            for row, index in enumerate(chunk):
                outputs[index] = _until_eos(generated[row].tolist(), set(eos_token_ids))
            on_batch(len(chunk))
    return [outputs[i] for i in range(len(prompts))]


def _until_eos(tokens: list[int], stop: set[int]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in stop:
            return tokens[: i + 1]
    return tokens


def capture_examples(target: nn.Module, prompts: Sequence[list[int]], continuations: Sequence[list[int]], *,
                     layer_ids: Sequence[int], on_example: Callable[[int], None] = lambda done: None) -> list[Example]:
    """One teacher-forced target forward per sequence: its aux states (hooks, as the proposer reads them) and
    its argmax after every position."""
    device = next(target.parameters()).device
    capture = AuxCapture(target, layer_ids)
    examples = []
    try:
        with torch.no_grad():  # not inference mode: the tensors are training inputs
            for prompt, continuation in zip(prompts, continuations):
                tokens = torch.tensor(prompt + continuation, device=device)
                logits = target(input_ids=tokens.unsqueeze(0), use_cache=False).logits[0]  # [L, V]
                labels = logits.argmax(dim=-1)
                labels[-1] = IGNORE
                examples.append(Example(tokens.cpu(), capture.latest().float().cpu(), labels.cpu(), len(prompt)))
                on_example(1)
    finally:
        capture.close()
    return examples


def split_held_out(count: int, *, held_out: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, held-out) indices: a seeded shuffle, at least one of each."""
    if count < 2:
        raise HeadError(f"--max-prompts: the workload gave {count} prompt(s); at least 2 are needed to hold some out")
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed)).tolist()
    cut = min(count - 1, max(1, round(count * held_out)))
    return sorted(order[cut:]), sorted(order[:cut])


def draft_vocabulary(examples: Sequence[Example], *, size: int, vocab_size: int) -> torch.Tensor:
    """The `size` target ids the target chooses most often in `examples` (ties: the smaller id), ascending:
    the head's draft vocabulary (its lm_head rows; d2t maps them back)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for example in examples:
        labels = example.labels[example.labels != IGNORE]
        counts += torch.bincount(labels, minlength=vocab_size)
    most = torch.argsort(counts, descending=True, stable=True)[:size]  # stable: ties go to the smaller id
    return most.sort().values

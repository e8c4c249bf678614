"""What one target forward pass costs by the number of tokens it verifies at once.

The analytic model needs the cost of verifying k = gamma + 1 tokens for every gamma, and it is not
linear in k: on a 2-core CPU, SmolLM2-135M took 2.09x a one-token step for 3 tokens but 1.46x for 5
(the matrix kernels change with the row count); on a GPU it is nearly flat until the batch fills the
chip. So it is measured, not interpolated.
"""

from __future__ import annotations

import statistics

import torch

from specbench.decoding.devices import Clock
from specbench.decoding import kv
from specbench.decoding.static import StaticModel, bucket


def verify_costs_ms(model: torch.nn.Module | kv.CachedModel, *, max_tokens: int, context_tokens: int,
                    repeats: int = 5, seed: int = 0) -> tuple[float, ...]:
    """Median milliseconds of one forward pass of k new tokens after `context_tokens` cached ones, for
    k = 1..max_tokens (index k - 1), on the path the model decodes on (a StaticModel: its compiled steps, where
    every k of one bucket runs the same padded graph: each graph is timed once per k it serves, as often as the
    eager path times each k, and its median is every such k's). The widths are interleaved within each repeat, so
    drift on a shared machine hits all of them alike; one untimed pass per width warms up first. Logits are
    computed for all k positions, as verification needs them."""
    if max_tokens < 1 or context_tokens < 1 or repeats < 1:
        raise ValueError("max_tokens, context_tokens and repeats must be >= 1")
    cached = kv.as_cached(model)
    device = next(cached.model.parameters()).device
    vocab = cached.model.get_input_embeddings().weight.shape[0]  # the output one may be int8-packed (a method)
    widths = range(1, max_tokens + 1)
    graph = {k: bucket(k) if isinstance(cached, StaticModel) else k for k in widths}
    timed = {graph[k]: k for k in widths}  # each graph at the widest k it serves
    serves = {key: sum(graph[k] == key for k in widths) for key in timed}
    times: dict[int, list[float]] = {key: [] for key in timed}
    with torch.inference_mode():  # inference tensors, as the decoder feeds a compiled step
        generator = torch.Generator().manual_seed(seed)
        context = torch.randint(0, vocab, (1, context_tokens), generator=generator).to(device)
        new = torch.randint(0, vocab, (1, max_tokens), generator=generator).to(device)
        # the cache holds up to context_tokens + max_tokens positions: a sequence one longer, less its newest token
        cached.begin(context_tokens + max_tokens + 1, rolls_back=True)
        cached.prefill(context)
        for round_ in range(-1, repeats * max(serves.values())):
            for key, k in timed.items():
                if round_ >= repeats * serves[key]:
                    continue
                clock = Clock(device)
                cached.forward(new[:, :k])
                elapsed = clock.now()
                cached.crop(context_tokens)
                if round_ >= 0:  # round -1 warms up
                    times[key].append(elapsed)
    return tuple(1000.0 * statistics.median(times[graph[k]]) for k in widths)

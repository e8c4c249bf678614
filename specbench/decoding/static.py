"""A causal LM on a static KV cache, its decode and verify steps compiled (gpt-fast's recipe).

One preallocated cache of `capacity` positions per model serves every request: a request starts at position 0
and a rollback after a rejected draft only moves the write position back (the stale keys and values beyond it
are masked out, then overwritten). A step of T new tokens is padded to a bucket of token counts (BUCKETS), so
that gamma 1..8 and the draft's 1- or 2-token steps reuse five compiled graphs instead of one per T; the padding
positions are written past the sequence's end, where the causal mask hides them until a later step overwrites
them. The prompt's prefill runs eagerly (its length varies). Compiled with inductor on a CPU, with CUDA graphs
(mode "reduce-overhead") on a GPU.

For an EAGLE-3 head, `aux_layers` attaches the hooks that keep the target's auxiliary states before compiling, so
they are traced into the step's graph (hooks attached later would make every step recompile): the step returns
them beside the logits, and `latest()` gives the head the states of the latest forward.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from specbench.decoding.devices import Clock, resident_bytes
from specbench.decoding import kv
from specbench.decoding.eagle3 import AuxCapture

BUCKETS = (1, 2, 4, 6, 9, 12, 16)  # verify k + 1 tokens: gamma 1..8 pad to 2, 4, 6 or 9; more tokens to a multiple of 8
RECOMPILE_LIMIT = 64  # graphs per compiled function: buckets x models (torch's default, 8, would fall back to eager)
# On a CPU, steps of FREEZE_TOKENS or more tokens compile with inductor's freezing: the weights become prepacked
# constants of the graph. Measured on the embedded model (2 cores, ms for 1, 2, 4, 6, 9 tokens): unfrozen 27.6, 27.3,
# 41.0, 44.3, 52.5 (MKL streams the weights as fast for 2 rows as for 1, then takes a slower path); frozen 30.0, 30.2,
# 33.3, 36.2, 41.4. So 1- and 2-token steps (the baseline, a draft model's steps) stay unfrozen, verifies freeze.
FREEZE_TOKENS = 3
FREEZE_SHARE = 0.5  # frozen CPU graphs (a prepacked copy of the weights per bucket) may take this share of free memory


def bucket(tokens: int) -> int:
    """The padded length of a step of `tokens` new tokens."""
    return next((size for size in BUCKETS if size >= tokens), -(-tokens // 8) * 8)


def buckets_to_freeze(tokens: Iterable[int]) -> list[int]:
    """The buckets of steps of `tokens` new tokens (or of buckets) that a CPU compiles frozen."""
    return sorted({bucket(t) for t in tokens if t >= FREEZE_TOKENS})


def freeze_refusal(weights: list[tuple[int, int]], available: int | None) -> str | None:
    """Why the CPU graphs must not be frozen, or None: each frozen bucket keeps its own prepacked copy of its
    model's weights, so `weights` [(weight bytes, frozen buckets)] must fit in FREEZE_SHARE of the `available`
    memory (unknown: frozen)."""
    needed = sum(size * buckets for size, buckets in weights)
    if available is None or needed <= FREEZE_SHARE * available:
        return None
    return (f"frozen graphs would hold {_size(needed)} (a copy of the weights per step bucket), more than "
            f"{FREEZE_SHARE:.0%} of the {_size(available)} available: compiled without freezing")


def _size(size: int) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def unsupported(model: torch.nn.Module) -> str | None:
    """Why the static cache cannot serve `model`, or None when it can: every layer must be full attention
    (a sliding window or linear attention needs the dynamic cache's own bookkeeping)."""
    try:
        layers = StaticCache(config=model.config, max_cache_len=1).layers  # allocates nothing until first used
    except (TypeError, ValueError, KeyError, AttributeError) as error:
        return f"transformers builds no static cache for {type(model).__name__} ({error})"
    kinds = sorted({type(layer).__name__ for layer in layers if type(layer) is not StaticLayer})
    if kinds:
        return f"cache layers {', '.join(kinds)} (sliding window or linear attention)"
    if not getattr(model, "_can_compile_fullgraph", False):
        return f"{type(model).__name__} does not declare a compilable forward"
    return None


class StaticModel:
    """A model, its static cache and its compiled step; one per model, reused by every request (`kv.CachedModel`)."""

    def __init__(self, model: torch.nn.Module, *, capacity: int, compile: bool = True, name: str | None = None,
                 aux_layers: tuple[int, ...] = (), freeze: bool = True):
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"model '{name or kv.model_name(model)}' cannot use a static KV cache: {reason}")
        self.model, self.capacity, self.name = model, capacity, name or kv.model_name(model)
        self.aux_layers = tuple(aux_layers)
        self.capture = AuxCapture(model, self.aux_layers) if self.aux_layers else None  # before compiling
        self._aux: torch.Tensor | None = None
        self.device = next(model.parameters()).device
        self.cache = StaticCache(config=model.config, max_cache_len=capacity)
        self._cache_argument = {kv.cache_keyword(type(model)): self.cache}  # resolved here, not while compiling
        self.graphs = compile and self.device.type == "cuda"  # CUDA graphs replay into the same output buffers
        self.frozen = compile and freeze and not self.graphs  # inductor's freezing: CPU graphs of verifies only
        self.step = _compiled(self._step, graphs=self.graphs, freeze=self.frozen) if compile else self._step
        self.compile_s: dict[int, float] = {}  # bucket -> seconds of its warm-up (compilation, graph capture)
        self.compile_mb: dict[int, float | None] = {}  # bucket -> memory its graph holds afterwards (MiB)
        self._length = 0

    def begin(self, max_length: int, *, rolls_back: bool) -> None:
        if max_length + BUCKETS[-1] > self.capacity:  # room for any step's padding
            raise ValueError(f"a request of {max_length} tokens does not fit the static KV cache of model "
                             f"'{self.name}' ({self.capacity} positions); build it with capacity >= "
                             f"{max_length + BUCKETS[-1]}")
        self._length = 0

    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Eager: the prompt [1, P] from position 0 -> the last position's logits [V]."""
        self._seek(0)
        logits = self.model(input_ids=input_ids, use_cache=True, logits_to_keep=1, **self._cache_argument).logits[0, -1]
        self._length = input_ids.shape[1]
        if self.capture is not None:
            self._aux = self.capture.latest()
        return logits

    def forward(self, input_ids: torch.Tensor, *, last: int | None = None) -> torch.Tensor:
        """Compiled: input_ids [1, T] at the cached length -> logits [T', V] (T' = last, or T)."""
        tokens = input_ids.shape[1]
        padded = bucket(tokens)
        if self._length + padded > self.capacity:
            raise ValueError(f"the static KV cache of model '{self.name}' ({self.capacity} positions) is full at "
                             f"{self._length} cached + {padded} new positions; build it with a larger capacity")
        if padded > tokens:  # any id will do: the padding positions' outputs are dropped and their keys masked
            input_ids = torch.cat([input_ids, input_ids.new_zeros((1, padded - tokens))], dim=1)
        elif not input_ids.is_inference() or input_ids.stride() != (tokens, 1):
            # the graphs were compiled for fresh inference tensors (warm_up, the decoder); a normal tensor or a
            # column slice of a wider one fails their guards and compiles the bucket again (~30 s, its own copy)
            input_ids = input_ids.clone(memory_format=torch.contiguous_format)
        self._seek(self._length)
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()
        logits, aux = self.step(input_ids)  # [padded, V], [padded, A·H] (or None)
        self._length += tokens
        if aux is not None:
            self._aux = aux[:tokens].clone() if self.graphs else aux[:tokens]
        rows = logits[tokens - (last or tokens) : tokens]
        return rows.clone() if self.graphs else rows  # the next replay overwrites the graph's output

    def crop(self, length: int) -> None:
        self._length = min(self._length, length)  # an index move: the positions beyond are masked, then overwritten

    @property
    def length(self) -> int:
        return self._length

    def close(self) -> None:
        """Take the aux-state hooks off the model (the model then runs as it did before)."""
        if self.capture is not None:
            self.capture.close()

    def latest(self) -> torch.Tensor:
        """[T, A·H]: the auxiliary states (`aux_layers`) of the latest forward's T positions (prefill or step)."""
        if self._aux is None:
            raise RuntimeError(f"model '{self.name}' keeps no auxiliary states yet (built without aux_layers, or "
                               "no forward pass since)")
        return self._aux

    @property
    def frozen_buckets(self) -> list[int]:
        """The compiled buckets whose graphs are frozen (CPU steps of FREEZE_TOKENS or more)."""
        return buckets_to_freeze(self.compile_s) if self.frozen else []

    def warm_up(self, tokens: range) -> None:
        """Compile (and on a GPU capture) the step of every bucket that `tokens` new tokens pad to, outside any
        timed region; each bucket's seconds go to compile_s, the memory it holds afterwards to compile_mb (on a CPU
        each frozen graph (FREEZE_TOKENS) keeps its own prepacked weights: ~550 MiB a bucket for SmolLM2-135M's
        513 MiB, against ~30 MiB unfrozen). Raises what compilation raises."""
        with torch.inference_mode():
            for size in sorted({bucket(t) for t in tokens} - set(self.compile_s)):
                before = resident_bytes(self.device)
                self.begin(size + 1, rolls_back=True)
                self.prefill(torch.zeros((1, 1), dtype=torch.long, device=self.device))
                clock = Clock(self.device)
                for _ in range(3 if self.graphs else 1):  # CUDA graph trees record on the second call, replay from the third
                    self.forward(torch.zeros((1, size), dtype=torch.long, device=self.device))
                    self.crop(1)
                self.compile_s[size] = clock.now()
                after = resident_bytes(self.device)
                self.compile_mb[size] = None if before is None or after is None else max(after - before, 0) / 2**20

    def _step(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = self.model(input_ids=input_ids, use_cache=True, **self._cache_argument).logits[0]
        return logits, (self.capture.latest() if self.capture is not None else None)

    def _seek(self, length: int) -> None:
        """Write the next positions from `length` on (each layer keeps its own write position)."""
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(length)


def captured_cuda_graphs(device: torch.device) -> tuple[int | None, int]:
    """(CUDA graphs inductor's graph trees recorded on `device`, the times inductor skipped CUDA graphs for a graph it
    compiled): what says that "reduce-overhead" replays graphs rather than running kernels one by one. The count is
    None where this torch does not expose its graph trees."""
    from torch._dynamo.utils import counters

    skipped = int(counters["inductor"]["cudagraph_skips"])
    try:
        from torch._inductor import cudagraph_trees

        manager = cudagraph_trees.get_manager(device.index or 0, create_if_none_exists=False)
        if manager is None:
            return 0, skipped
        count, todo = 0, list(manager.get_roots())
        while todo:
            node = todo.pop()
            count += 1
            todo += [child for children in node.children.values() for child in children]
        return count, skipped
    except Exception:  # noqa: BLE001 - private API: its shape may change between torch releases
        return None, skipped


def _compiled(step, *, graphs: bool, freeze: bool = True):
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    torch._dynamo.config.fail_on_recompile_limit_hit = True  # never fall back to eager silently
    if graphs:
        return torch.compile(step, mode="reduce-overhead", dynamic=False, fullgraph=True)
    compiled = torch.compile(step, dynamic=False, fullgraph=True)
    if not freeze:
        return compiled

    def frozen(input_ids: torch.Tensor):
        # On a CPU, freezing folds the weights into the graph as constants and prepacks them for the linear kernels:
        # a verify of 4 tokens then costs 1.1x a 1-token step instead of 1.5x, while 1- and 2-token steps run ~8 %
        # faster unfrozen (FREEZE_TOKENS). Set while a graph compiles (inductor reads it then; torch.compile's
        # `options` did not apply it). A frozen graph is guarded on its model's weights (the others take them as
        # inputs, so models of one architecture share them) and holds its own prepacked copy (compile_mb).
        with torch._inductor.config.patch(freezing=input_ids.shape[-1] >= FREEZE_TOKENS):
            return compiled(input_ids)

    return frozen

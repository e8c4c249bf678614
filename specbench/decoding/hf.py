"""The Hugging Face reference backend: the same request through transformers' `generate()`.

`baseline` is plain `generate`; `draft` is assisted generation with `assistant_model` and a constant
`num_assistant_tokens = gamma`; `ngram` is prompt-lookup decoding with `prompt_lookup_num_tokens = gamma`.
HF does not expose per-step drafts, so steps carry emitted tokens and times only (drafted = None), and a
step cut at an end-of-sequence token counts that token as the bonus even when it was an accepted draft;
each step is one target forward pass (counted with a forward hook). HF folds the prefill into the first
step, so its first step is the prefill. Traces carry no top2_gap: `output_logits` would keep a float32
[V] row per output token on the device, which the peak memory measured here would include.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager, nullcontext

import torch
from transformers import GenerationConfig

from specbench.decoding.devices import Clock, PeakMemory
from specbench.core.trace import StepRecord, Trace


class _TimingStreamer:
    """Receives the prompt, then the tokens of each target step, and stamps each put."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.chunks: list[tuple[float, list[int]]] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.chunks.append((self.clock.now(), value.reshape(-1).tolist()))

    def end(self) -> None:
        pass


@contextmanager
def _count_forwards(model: torch.nn.Module) -> Iterator[list[int]]:
    calls = [0]
    handle = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        yield calls
    finally:
        handle.remove()


@contextmanager
def _overridden(config: GenerationConfig, **values: object) -> Iterator[None]:
    """Temporarily set attributes of a model's own generation config, which `generate` merges in."""
    saved = {key: getattr(config, key, None) for key in values}
    for key, value in values.items():
        setattr(config, key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(config, key, value)


def hf_generate(
    target: torch.nn.Module,
    prompt_ids: list[int],
    *,
    method: str,
    gamma: int,
    temperature: float,
    top_p: float = 1.0,
    max_new_tokens: int,
    seed: int = 0,
    eos_token_ids: Collection[int] = (),
    draft: torch.nn.Module | None = None,
    ngram_max: int = 3,
    tokenizer=None,
    assistant_tokenizer=None,
) -> Trace:
    """One request through `generate`; with `tokenizer` and `assistant_tokenizer` (a draft of another tokenizer),
    transformers' assisted generation across vocabularies."""
    if method == "draft" and draft is None:
        raise ValueError("method 'draft' needs a draft model")
    device = next(target.parameters()).device
    eos = list(eos_token_ids)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else None,
        top_p=top_p if temperature > 0 else None,
        top_k=0 if temperature > 0 else None,
        eos_token_id=eos or None,
        pad_token_id=eos[0] if eos else 0,
    )
    kwargs: dict = {}
    if method == "draft":
        kwargs["assistant_model"] = draft
        if assistant_tokenizer is not None:
            kwargs.update(tokenizer=tokenizer, assistant_tokenizer=assistant_tokenizer)
    elif method == "ngram":
        config.prompt_lookup_num_tokens = gamma
        config.max_matching_ngram_size = ngram_max
    elif method != "baseline":
        raise ValueError(f"unknown method '{method}' (expected baseline, draft or ngram)")

    input_ids = torch.tensor([prompt_ids], device=device)
    torch.manual_seed(seed)
    # The model's own defaults (an EOS id, a draft-length schedule) must not leak into the request.
    assistant = (
        _overridden(draft.generation_config, num_assistant_tokens=gamma, num_assistant_tokens_schedule="constant",
                    assistant_confidence_threshold=0.0)
        if method == "draft" else nullcontext()
    )
    with torch.inference_mode(), _count_forwards(target) as calls, assistant, \
            _overridden(target.generation_config, eos_token_id=eos or None):
        memory = PeakMemory(device)
        memory.start()
        clock = Clock(device)
        streamer = _TimingStreamer(clock)
        output = target.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config,
            streamer=streamer, **kwargs,
        )
        clock.now()
    output_ids = output[0, len(prompt_ids):].tolist()
    streamed = [token for _, chunk in streamer.chunks for token in chunk]
    forwards = len(streamer.chunks) if draft is target else calls[0]  # a self-draft's calls hit the hook too
    if streamed != output_ids or forwards != len(streamer.chunks):
        raise RuntimeError(
            f"HF generate streamed {len(streamed)} tokens in {len(streamer.chunks)} steps but returned "
            f"{len(output_ids)} tokens after {forwards} target forward passes"
        )
    times = [stamp for stamp, chunk in streamer.chunks for _ in chunk]
    steps = tuple(StepRecord(drafted=None, accepted=len(chunk) - 1, emitted=len(chunk)) for _, chunk in streamer.chunks)
    return Trace(
        prompt_tokens=len(prompt_ids),
        output_ids=tuple(output_ids),
        ttft_s=times[0],
        token_times_s=tuple(times),
        steps=steps,
        gamma=gamma,
        peak_memory_growth_bytes=memory.growth_bytes(),
    )

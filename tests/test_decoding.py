"""The native engine: greedy equality with autoregressive decoding and HF, accounting, KV rollback (and the
sliding-window caches it cannot roll back)."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from specbench.decoding.proposers import BaselineProposer, DraftModelProposer, NgramProposer
from specbench.decoding.decode import StepState, generate
from specbench.core.trace import Trace
from specbench.decoding import kv
from specbench.decoding.hf import hf_generate
from specbench.decoding.proposers import lookup
from tiny import DEVICE, perturbed, resized_vocab, tiny_llama

PROMPT = [5, 9, 13, 22, 5, 9, 40, 41, 42, 5, 9, 13, 7]
MAX_NEW = 40


@pytest.fixture(scope="module")
def target():
    return tiny_llama()


@pytest.fixture(scope="module")
def baseline_ids(target) -> tuple[int, ...]:
    trace = generate(target, BaselineProposer(DEVICE), PROMPT, gamma=1, temperature=0.0, max_new_tokens=MAX_NEW)
    return trace.output_ids


def check_accounting(trace: Trace, *, gamma: int) -> None:
    assert 1 + sum(step.emitted for step in trace.steps) == trace.output_tokens
    assert all(step.emitted - step.accepted in (0, 1) for step in trace.steps)
    assert all(0 <= step.accepted <= step.drafted <= gamma for step in trace.steps)
    assert trace.accepted_tokens == sum(step.accepted for step in trace.steps)
    if trace.acceptance_rate is not None:
        assert 0.0 <= trace.acceptance_rate <= 1.0
    if trace.steps:
        assert 1.0 <= trace.mean_accepted_length <= gamma + 1
    else:
        assert trace.mean_accepted_length is None
    per_position = trace.accepted_per_position
    assert len(per_position) == gamma
    assert all(a >= b for a, b in zip(per_position, per_position[1:]))
    assert per_position[0] == sum(1 for step in trace.steps if step.accepted >= 1)
    assert sum(trace.accepted_length_histogram) == trace.target_steps
    assert len(trace.token_times_s) == trace.output_tokens
    assert list(trace.token_times_s) == sorted(trace.token_times_s)
    assert trace.ttft_s == trace.token_times_s[0]


def draft_proposers(target):
    """A close draft (partial acceptance), and drafts with a larger and a smaller embedding matrix."""
    vocab = target.config.vocab_size
    close = perturbed(target, scale=0.01)
    return {
        "close": DraftModelProposer(close, vocab_size=vocab, device=DEVICE),
        "larger-vocab": DraftModelProposer(resized_vocab(close, vocab + 16), vocab_size=vocab, device=DEVICE),
        "smaller-vocab": DraftModelProposer(resized_vocab(close, vocab - 8), vocab_size=vocab, device=DEVICE),
    }


@pytest.mark.parametrize("gamma", [1, 2, 3, 5])
def test_greedy_draft_equals_baseline(target, baseline_ids, gamma):
    for name, proposer in draft_proposers(target).items():
        trace = generate(target, proposer, PROMPT, gamma=gamma, temperature=0.0, max_new_tokens=MAX_NEW)
        assert trace.output_ids == baseline_ids, name
        check_accounting(trace, gamma=gamma)
        assert trace.accepted_tokens > 0, f"{name}: the test needs a draft that is sometimes right"
        assert trace.accepted_tokens < trace.drafted_tokens, f"{name}: and sometimes wrong"


@pytest.mark.parametrize("gamma", [1, 2, 3, 5])
def test_greedy_ngram_equals_baseline(target, baseline_ids, gamma):
    trace = generate(target, NgramProposer(device=DEVICE), PROMPT, gamma=gamma, temperature=0.0, max_new_tokens=MAX_NEW)
    assert trace.output_ids == baseline_ids
    check_accounting(trace, gamma=gamma)
    assert 0 < trace.accepted_tokens < trace.drafted_tokens


def test_baseline_accounting(target, baseline_ids):
    trace = generate(target, BaselineProposer(DEVICE), PROMPT, gamma=4, temperature=0.0, max_new_tokens=MAX_NEW)
    assert trace.output_tokens == MAX_NEW
    assert trace.mean_accepted_length == 1.0
    assert trace.acceptance_rate is None
    assert trace.target_steps == MAX_NEW - 1
    check_accounting(trace, gamma=4)


@pytest.mark.parametrize("method", ["baseline", "draft", "ngram"])
@pytest.mark.parametrize("gamma", [1, 3])
def test_hf_greedy_equals_native(target, baseline_ids, method, gamma):
    draft = perturbed(target, scale=0.01)
    trace = hf_generate(target, PROMPT, method=method, gamma=gamma, temperature=0.0, max_new_tokens=MAX_NEW, draft=draft)
    assert trace.output_ids == baseline_ids
    assert trace.drafted_tokens is None
    assert sum(step.emitted for step in trace.steps) == trace.output_tokens
    if method == "baseline":
        assert trace.mean_accepted_length == 1.0
    else:
        assert 1.0 < trace.mean_accepted_length <= gamma + 1


def test_temperature_sampling_is_seeded(target):
    def run(seed: int) -> tuple[int, ...]:
        proposer = DraftModelProposer(perturbed(target, scale=0.01), vocab_size=64, device=DEVICE)
        return generate(target, proposer, PROMPT, gamma=3, temperature=0.8, top_p=0.9, max_new_tokens=30,
                        seed=seed).output_ids

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_eos_ends_the_request_and_accounting_holds(target, baseline_ids):
    eos = baseline_ids[12]
    expected = baseline_ids[: baseline_ids.index(eos) + 1]
    for proposer in [*draft_proposers(target).values(), NgramProposer(device=DEVICE), BaselineProposer(DEVICE)]:
        trace = generate(target, proposer, PROMPT, gamma=4, temperature=0.0, max_new_tokens=MAX_NEW, eos_token_ids=[eos])
        assert trace.output_ids == expected
        check_accounting(trace, gamma=4)


@pytest.mark.parametrize("gamma", [2, 4])
def test_kv_caches_follow_the_sequence(target, gamma):
    proposer = DraftModelProposer(perturbed(target, scale=0.01), vocab_size=64, device=DEVICE)
    states: list[tuple[StepState, int]] = []
    generate(target, proposer, PROMPT, gamma=gamma, temperature=0.0, max_new_tokens=MAX_NEW,
             on_step=lambda state: states.append((state, kv.cache_length(proposer.cache))))
    assert states
    for state, draft_cache_length in states:
        # the target caches every token but the newest; the draft lacks at most the last accepted draft too
        assert state.target_cache_length == state.sequence_length - 1
        assert state.sequence_length - 2 <= draft_cache_length <= state.sequence_length - 1


def tiny_mistral(*, sliding_window: int, seed: int = 0):
    """A tiny Mistral whose DynamicCache keeps only the last sliding_window - 1 positions."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    config = MistralConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=sliding_window, max_position_embeddings=512, initializer_range=0.3,
    )
    return MistralForCausalLM(config).to(DEVICE).eval()


@contextmanager
def counted_forwards(model) -> Iterator[list[int]]:
    calls: list[int] = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        yield calls
    finally:
        handle.remove()


def window_error(name: str, max_length: int) -> str:
    return re.escape(
        f"model '{name}' uses a sliding-window attention cache (sliding_window=16) that speculative decoding cannot "
        f"roll back once prompt + max_new_tokens ({max_length}) exceeds it; use a model without sliding_window, set "
        "\"sliding_window\": null in its config.json, or keep prompt + max_new_tokens within the window")


def test_a_sliding_window_target_is_refused_before_generation():
    target = tiny_mistral(sliding_window=16)
    draft = DraftModelProposer(perturbed(target, scale=0.1), vocab_size=64, device=DEVICE)
    for proposer in (NgramProposer(device=DEVICE), draft):
        with counted_forwards(target) as forwards, \
                pytest.raises(ValueError, match=window_error("MistralForCausalLM", len(PROMPT) + MAX_NEW)):
            generate(target, proposer, PROMPT, gamma=3, temperature=0.0, max_new_tokens=MAX_NEW)
        assert not forwards


def test_a_sliding_window_draft_is_refused_before_generation(target):
    proposer = DraftModelProposer(tiny_mistral(sliding_window=16), vocab_size=64, device=DEVICE, name="mistral-draft")
    with counted_forwards(target) as forwards, \
            pytest.raises(ValueError, match=window_error("mistral-draft", len(PROMPT) + MAX_NEW)):
        generate(target, proposer, PROMPT, gamma=3, temperature=0.0, max_new_tokens=MAX_NEW)
    assert not forwards


def test_a_sliding_window_the_request_never_fills_is_fine():
    """prompt + max_new_tokens <= sliding_window: the cache never slides, so rollbacks are exact."""
    target = tiny_mistral(sliding_window=16)
    prompt, max_new = PROMPT[:5], 11
    expected = generate(target, BaselineProposer(DEVICE), prompt, gamma=1, temperature=0.0, max_new_tokens=max_new)
    draft = DraftModelProposer(perturbed(target, scale=0.1), vocab_size=64, device=DEVICE)
    for proposer in (NgramProposer(device=DEVICE), draft):
        trace = generate(target, proposer, prompt, gamma=3, temperature=0.0, max_new_tokens=max_new)
        assert trace.output_ids == expected.output_ids
        assert trace.accepted_tokens < trace.drafted_tokens, "the test needs rejections (cache rollbacks)"
    with pytest.raises(ValueError, match=window_error("MistralForCausalLM", 17)):
        generate(target, NgramProposer(device=DEVICE), prompt, gamma=3, temperature=0.0, max_new_tokens=max_new + 1)


def test_the_baseline_decodes_past_the_window():
    """The baseline never rolls back, so its sliding-window cache is fine: the same tokens as greedy decoding
    by full forward passes without a cache."""
    target = tiny_mistral(sliding_window=16)
    trace = generate(target, BaselineProposer(DEVICE), PROMPT, gamma=1, temperature=0.0, max_new_tokens=MAX_NEW)
    sequence = list(PROMPT)
    with torch.no_grad():
        for _ in range(MAX_NEW):
            sequence.append(int(target(torch.tensor([sequence], device=DEVICE)).logits[0, -1].argmax()))
    assert trace.output_ids == tuple(sequence[len(PROMPT):])


def test_verify_costs_refuse_a_window_they_would_outgrow():
    from specbench.decoding.costs import verify_costs_ms

    target = tiny_mistral(sliding_window=16)
    assert len(verify_costs_ms(target, max_tokens=5, context_tokens=10, repeats=1)) == 5  # caches up to 15
    with pytest.raises(ValueError, match=window_error("MistralForCausalLM", 17)):
        verify_costs_ms(target, max_tokens=5, context_tokens=11, repeats=1)


def test_prompt_is_prefilled_once(target):
    lengths: list[int] = []
    handle = target.register_forward_hook(lambda module, args, kwargs, out: lengths.append(kwargs["input_ids"].shape[1]),
                                          with_kwargs=True)
    try:
        trace = generate(target, NgramProposer(device=DEVICE), PROMPT, gamma=3, temperature=0.0, max_new_tokens=MAX_NEW)
    finally:
        handle.remove()
    assert lengths[0] == len(PROMPT)
    assert len(lengths) == 1 + trace.target_steps
    assert all(1 <= n <= 4 for n in lengths[1:])


def test_max_new_tokens_is_exact(target):
    for max_new in (1, 2, 5, 17):
        trace = generate(target, NgramProposer(device=DEVICE), PROMPT, gamma=6, temperature=0.0, max_new_tokens=max_new)
        assert trace.output_tokens == max_new
        check_accounting(trace, gamma=6)


def test_ngram_lookup_takes_the_longest_match_at_its_earliest_occurrence():
    import numpy as np

    sequence = np.array([1, 2, 3, 9, 9, 7, 2, 3, 8, 8, 1, 2, 3])
    # "1 2 3" first occurs at 0 and was followed by 9 9 7
    assert lookup(sequence, k=3, ngram_min=1, ngram_max=3) == [9, 9, 7]
    # with n <= 2, "2 3" first occurs at 1 as well
    assert lookup(sequence, k=2, ngram_min=1, ngram_max=2) == [9, 9]
    assert lookup(np.array([4, 5, 6]), k=3, ngram_min=1, ngram_max=3) == []
    assert lookup(np.array([4, 5, 4]), k=5, ngram_min=1, ngram_max=3) == [5, 4]


def test_verify_costs_time_every_token_count_and_leave_no_cache_behind(target):
    from specbench.decoding.costs import verify_costs_ms

    costs = verify_costs_ms(target, max_tokens=5, context_tokens=12, repeats=2)
    assert len(costs) == 5 and all(cost > 0 for cost in costs)
    # an int8 dynamically quantised model (the quickstart's self-draft): its lm_head's weight is a method
    from specbench.models.load import quantize_int8

    int8 = quantize_int8(copy.deepcopy(target))
    assert callable(int8.get_output_embeddings().weight)
    assert len(verify_costs_ms(int8, max_tokens=3, context_tokens=12, repeats=1)) == 3
    with pytest.raises(ValueError, match="must be >= 1"):
        verify_costs_ms(target, max_tokens=0, context_tokens=12)

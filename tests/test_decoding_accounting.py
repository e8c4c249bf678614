"""What a Trace records: acceptance counts however a request ends, and the greedy top-2 logit gaps."""

from __future__ import annotations

import copy

import pytest
import torch

from specbench.decoding.proposers import BaselineProposer, DraftModelProposer, NgramProposer
from specbench.decoding.decode import generate
from specbench.core.trace import first_divergence
from tiny import DEVICE, tiny_llama

PROMPT = [5, 9, 13, 22, 5, 9, 40, 41, 42, 5, 9, 13, 7]
EOS = 23  # this target's most frequent token when sampled at temperature 1 (19 of 400)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(init_std=0.3)  # peaked distributions: a few tokens come often


def test_a_self_draft_is_always_accepted_however_the_request_ends(target):
    """A draft identical to the target is accepted at every position: acceptance exactly 1, no rejected
    step, whether a step ends at an accepted drafted EOS, a bonus EOS or max_new_tokens."""
    proposer = DraftModelProposer(copy.deepcopy(target), vocab_size=64, device=DEVICE)
    ended_at_a_drafted_eos = cut_by_length = 0
    for temperature in (0.0, 0.7, 1.0):
        for seed in range(8 if temperature else 1):
            for gamma, max_new in ((4, 37), (3, 30)):
                trace = generate(target, proposer, PROMPT, gamma=gamma, temperature=temperature,
                                 max_new_tokens=max_new, seed=seed, eos_token_ids=[EOS])
                where = f"T={temperature} seed={seed} gamma={gamma}"
                assert trace.acceptance_rate == 1.0, where
                assert trace.rejected_steps == 0, where
                assert trace.accepted_per_position == trace.drafted_per_position, where
                assert all(step.drafted == step.accepted for step in trace.steps), where
                assert len(trace.top2_gap) == (0 if temperature else trace.output_tokens), where
                last = trace.steps[-1]
                ended_at_a_drafted_eos += trace.output_ids[-1] == EOS and last.emitted == last.accepted
                cut_by_length += trace.output_tokens == max_new and last.drafted < gamma
    assert ended_at_a_drafted_eos >= 3 and cut_by_length >= 3, "the test needs both kinds of ending"


def test_drafts_after_an_accepted_eos_are_not_counted():
    """Greedy self-draft whose first step drafts the EOS at position 2: drafted 2, accepted 2, emitted 2."""
    target = tiny_llama(init_std=0.3)
    expected = generate(target, BaselineProposer(DEVICE), PROMPT, gamma=1, temperature=0.0, max_new_tokens=6).output_ids
    eos = expected[2]  # the first step drafts expected[1:5]
    assert eos not in expected[:2]
    proposer = DraftModelProposer(copy.deepcopy(target), vocab_size=64, device=DEVICE)
    trace = generate(target, proposer, PROMPT, gamma=4, temperature=0.0, max_new_tokens=20, eos_token_ids=[eos])
    assert trace.output_ids == expected[:3]
    assert [(s.drafted, s.accepted, s.emitted) for s in trace.steps] == [(2, 2, 2)]
    assert trace.drafted_per_position == (1, 1, 0, 0)


def test_greedy_traces_carry_one_top2_gap_per_output_token(target):
    for proposer in (BaselineProposer(DEVICE), NgramProposer(device=DEVICE),
                     DraftModelProposer(copy.deepcopy(target), vocab_size=64, device=DEVICE)):
        trace = generate(target, proposer, PROMPT, gamma=3, temperature=0.0, max_new_tokens=25)
        assert len(trace.top2_gap) == trace.output_tokens
        assert all(gap >= 0.0 for gap in trace.top2_gap)
    sampled = generate(target, NgramProposer(device=DEVICE), PROMPT, gamma=3, temperature=0.8, max_new_tokens=25)
    assert sampled.top2_gap == ()


def test_top2_gaps_are_the_targets_own():
    """Each gap is the top logit minus the second one in the full forward pass over the output so far."""
    target = tiny_llama(init_std=0.3)
    trace = generate(target, NgramProposer(device=DEVICE), PROMPT, gamma=3, temperature=0.0, max_new_tokens=20)
    with torch.no_grad():
        logits = target(torch.tensor([PROMPT + list(trace.output_ids)], device=DEVICE)).logits[0]  # [T, V]
    top2 = logits[len(PROMPT) - 1 : -1].topk(2, dim=-1).values  # [output_tokens, 2]
    assert torch.allclose(torch.tensor(trace.top2_gap), (top2[:, 0] - top2[:, 1]).cpu(), atol=1e-4)


def test_first_divergence_names_the_position_and_the_smaller_gap():
    assert first_divergence((1, 2, 3), (1, 2, 3), gaps=(0.5, 0.1, 0.2), reference_gaps=(0.5, 0.1, 0.2)) is None
    assert first_divergence((1, 2, 3, 9), (1, 2, 4, 5), gaps=(0.5, 0.1, 0.02, 1.0),
                            reference_gaps=(0.5, 0.1, 0.03, 2.0)) == (2, 0.02)
    assert first_divergence((7,), (8,), gaps=(0.3,), reference_gaps=(0.1,)) == (0, 0.1)
    # one output a prefix of the other (an EOS one run did not emit): only the longer run has a gap there
    assert first_divergence((1, 2), (1, 2, 3), gaps=(0.5, 0.1), reference_gaps=(0.5, 0.1, 0.7)) == (2, 0.7)
    # sampled runs record no gaps
    assert first_divergence((1, 2), (1, 3), gaps=(), reference_gaps=()) == (1, None)

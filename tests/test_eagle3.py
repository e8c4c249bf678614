"""EAGLE-3: the head's format (vLLM's names and shapes, round trip, refusals), the proposer (greedy equality,
per-position accounting, the target's exact distribution), and training and inference computing the same head."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from eagle3_tiny import AUX_LAYERS, embedding_of, tiny_examples, tiny_target, trained_head, untrained_head
from test_decoding import check_accounting
from test_sampling import P_MIN, broken_verify_sampling, empirical_joint, exact_joint, pair_p_values
from tiny import DEVICE

from specbench.decoding.proposers import BaselineProposer
from specbench.decoding.eagle3 import Eagle3Proposer
from specbench.decoding.sampling import Sampler
from specbench.decoding import decode
from specbench.decoding.decode import generate
from specbench.heads.data import capture_examples
from specbench.heads.train import agreement, make_batches, unroll
from specbench.models.eagle3 import HeadError, load_head, save_head

MAX_NEW = 40

# What vLLM 0.32's Eagle3LlamaForCausalLM.load_weights reads (llama_eagle3.py: "midlayer." -> "layers.0.",
# q/k/v -> qkv_proj, gate/up -> gate_up_proj, d2t -> draft_id_to_target_id, t2d skipped), for hidden H = 64,
# 4 heads and 2 KV heads of 16, intermediate 128, 3 aux layers, draft vocabulary D.
def vllm_tensors(*, draft_vocab: int | None) -> dict[str, list[int]]:
    tensors = {
        "fc.weight": [64, 3 * 64],
        "midlayer.self_attn.q_proj.weight": [64, 2 * 64], "midlayer.self_attn.k_proj.weight": [32, 2 * 64],
        "midlayer.self_attn.v_proj.weight": [32, 2 * 64], "midlayer.self_attn.o_proj.weight": [64, 64],
        "midlayer.mlp.gate_proj.weight": [128, 64], "midlayer.mlp.up_proj.weight": [128, 64],
        "midlayer.mlp.down_proj.weight": [64, 128],
        "midlayer.input_layernorm.weight": [64], "midlayer.hidden_norm.weight": [64],
        "midlayer.post_attention_layernorm.weight": [64], "norm.weight": [64],
    }
    if draft_vocab is not None:
        tensors.update({"lm_head.weight": [draft_vocab, 64], "d2t": [draft_vocab], "t2d": [64]})
    return tensors


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def examples(target):
    return tiny_examples(target)


@pytest.fixture(scope="module")
def head(target, examples):
    return trained_head(target, examples=examples)[0]


# --- the format ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("draft_vocab", [None, 24])
def test_saved_head_has_vllms_names_shapes_and_config_and_loads_back(target, tmp_path, draft_vocab):
    from safetensors.torch import load_file

    vocab = None if draft_vocab is None else torch.arange(0, 2 * draft_vocab, 2)
    head = untrained_head(target, draft_vocab=vocab)
    save_head(head, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert {name: list(t.shape) for name, t in tensors.items()} == vllm_tensors(draft_vocab=draft_vocab)
    if vocab is not None:
        assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
        assert torch.equal(torch.arange(draft_vocab) + tensors["d2t"], vocab)  # target id = i + d2t[i]
        assert torch.equal(tensors["t2d"].nonzero().flatten(), vocab)
    config = json.loads((tmp_path / "config.json").read_text())
    expected = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
                "hidden_size": 64, "target_hidden_size": 64, "vocab_size": 64,
                "draft_vocab_size": draft_vocab or 64, "eagle_aux_hidden_state_layer_ids": list(AUX_LAYERS),
                "norm_before_residual": False, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "intermediate_size": 128}
    assert {key: config.get(key) for key in expected} == expected
    loaded = load_head(tmp_path, target_config=target.config)
    assert loaded.state_dict().keys() == head.state_dict().keys()
    assert all(torch.equal(loaded.state_dict()[k].cpu(), v.cpu()) for k, v in head.state_dict().items())


def test_a_head_without_t2d_gets_it_from_d2t(target, tmp_path):
    from safetensors.torch import load_file, save_file

    vocab = torch.arange(5, 29)
    save_head(untrained_head(target, draft_vocab=vocab), tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors["t2d"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert torch.equal(load_head(tmp_path, target_config=target.config).t2d.nonzero().flatten(), vocab)


def edit_config(folder, **changes):
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return str(path)


@pytest.mark.parametrize("changes, message", [
    ({"architectures": ["LlamaForCausalLM"]},
     ('{path}: architectures: ["LlamaForCausalLM"] is not an EAGLE-3 head; use a head saved as '
      '"LlamaForCausalLMEagle3" (vLLM\'s EAGLE-3 format) or in the speculators format')),
    ({"num_hidden_layers": 2}, "{path}: num_hidden_layers: specbench runs one-layer EAGLE-3 heads (got 2)"),
    ({"eagle_aux_hidden_state_layer_ids": [1, 2, 9]},
     ("{path}: eagle_aux_hidden_state_layer_ids: [1, 2, 9] must be layers 0..5 of the target (5 decoder layers); "
      "train the head for this target")),
    ({"target_hidden_size": 96},
     "{path}: target_hidden_size: 96 does not match the target's hidden_size 64; use a head trained for this target"),
    ({"hidden_size": 96},
     ("{path}: hidden_size: 96 does not match the target's hidden_size 64 (the head reads the target's embeddings); "
      "use a head trained for this target")),
    ({"vocab_size": 128},
     "{path}: vocab_size: 128 does not match the target's vocab_size 64; use a head trained for this target"),
])
def test_a_head_that_does_not_fit_is_refused_in_one_line(target, tmp_path, changes, message):
    save_head(untrained_head(target), tmp_path)
    path = edit_config(tmp_path, **changes)
    with pytest.raises(HeadError, match=f"^{re.escape(message.format(path=path))}$"):
        load_head(tmp_path, target_config=target.config)


def test_weights_that_disagree_with_the_config_are_refused(target, tmp_path):
    from safetensors.torch import load_file, save_file

    save_head(untrained_head(target), tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["fc.weight"] = tensors["fc.weight"][:, :128].contiguous()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(HeadError, match=re.escape(f"{tmp_path}: tensor fc.weight has shape [64, 128], the config "
                                                  "needs [64, 192]; config.json and the weights disagree")):
        load_head(tmp_path, target_config=target.config)
    del tensors["fc.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(HeadError, match=re.escape(f"{tmp_path}: tensor fc.weight is missing")):
        load_head(tmp_path, target_config=target.config)


# --- training and inference compute the same head ----------------------------------------------------------


@pytest.mark.parametrize("draft_vocab", [None, torch.arange(0, 64, 2)])
def test_the_training_unroll_equals_what_the_proposer_drafts(target, draft_vocab):
    """Draft probabilities of the proposer (cache, positions, its own states fed back) equal the training-time
    test's logits at the same anchor, on a sequence continued by the proposer's own drafts."""
    head = untrained_head(target, seed=4, draft_vocab=draft_vocab)
    prefix = [5, 9, 13, 22, 5, 9, 40, 41, 42, 5, 9, 13, 7]
    proposer = Eagle3Proposer(head, target, device=DEVICE)
    proposer.prefill(prefix, max_length=64)
    with torch.no_grad():
        target(input_ids=torch.tensor([prefix[:-1]], device=DEVICE))  # what the target verified: all but the newest
        sampler = Sampler(temperature=1.0, top_p=1.0, generator=torch.Generator(device=DEVICE).manual_seed(0))
        proposal = proposer.propose(prefix, 3, sampler)
        sequence = prefix + proposal.tokens.tolist()[:2]
        [example] = capture_examples(target, [sequence], [[]], layer_ids=AUX_LAYERS)
        to_draft = None
        if draft_vocab is not None:
            to_draft = torch.full((64,), -100, dtype=torch.long)
            to_draft[draft_vocab] = torch.arange(len(draft_vocab))
        [batch] = make_batches([example], batch_tokens=1024, steps=3, to_draft=to_draft, device=DEVICE)
        lm_head_weight = (head.lm_head if head.lm_head is not None else target.get_output_embeddings()).weight
        logits = unroll(head, batch, embed=embedding_of(target), lm_head_weight=lm_head_weight, steps=3)
    anchor = len(prefix) - 2
    expected = torch.stack([torch.softmax(head.to_target_vocab(step[0, anchor]), dim=-1) for step in logits])
    torch.testing.assert_close(proposal.probs, expected, rtol=1e-4, atol=1e-6)


def test_training_lowers_the_loss_and_raises_agreement(target, examples):
    batches = make_batches(examples, batch_tokens=512, steps=3, to_draft=None, device=DEVICE)
    measure = {"embed": embedding_of(target), "lm_head_weight": target.get_output_embeddings().weight.detach(), "steps": 3}
    before = agreement(untrained_head(target), batches, **measure)
    head, losses = trained_head(target, examples=examples)
    after = agreement(head, batches, **measure)
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    assert all(a > b + 0.2 for a, b in zip(after, before)), (before, after)


def test_training_is_deterministic(target, examples):
    first, first_losses = trained_head(target, examples=examples, epochs=3)
    second, second_losses = trained_head(target, examples=examples, epochs=3)
    assert first_losses == second_losses
    assert all(torch.equal(first.state_dict()[k], v) for k, v in second.state_dict().items())
    third, _ = trained_head(target, examples=examples, epochs=3, seed=1)
    assert not torch.equal(first.fc.weight, third.fc.weight)


# --- the proposer in the native decoder ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def prompt(examples) -> list[int]:
    return examples[0].tokens[: examples[0].prompt_tokens].tolist()  # a prompt the head was trained on


@pytest.mark.parametrize("gamma", [1, 2, 3, 5])
def test_greedy_eagle3_equals_baseline(target, head, prompt, gamma):
    expected = generate(target, BaselineProposer(DEVICE), prompt, gamma=1, temperature=0.0, max_new_tokens=MAX_NEW)
    trace = generate(target, Eagle3Proposer(head, target, device=DEVICE), prompt, gamma=gamma, temperature=0.0,
                     max_new_tokens=MAX_NEW)
    assert trace.output_ids == expected.output_ids
    check_accounting(trace, gamma=gamma)
    assert 0 < trace.accepted_tokens < trace.drafted_tokens, "the test needs accepted and rejected drafts"
    if gamma > 1:
        assert trace.accepted_per_position[1] > 0, "and acceptance past the first position"


def test_greedy_eagle3_with_a_draft_vocabulary_equals_baseline(target, prompt):
    head = untrained_head(target, draft_vocab=torch.arange(0, 64, 2))
    expected = generate(target, BaselineProposer(DEVICE), prompt, gamma=1, temperature=0.0, max_new_tokens=MAX_NEW)
    trace = generate(target, Eagle3Proposer(head, target, device=DEVICE), prompt, gamma=3, temperature=0.0,
                     max_new_tokens=MAX_NEW)
    assert trace.output_ids == expected.output_ids
    check_accounting(trace, gamma=3)


def test_the_proposer_removes_its_hooks_when_dropped(target, head, prompt):
    proposer = Eagle3Proposer(head, target, device=DEVICE)
    hooked = [module for module in target.modules() if module._forward_pre_hooks]
    assert len(hooked) == len(set(AUX_LAYERS))
    del proposer
    assert not [module for module in target.modules() if module._forward_pre_hooks]


def test_eagle3_sampling_is_seeded(target, head, prompt):
    def run(seed: int) -> tuple[int, ...]:
        return generate(target, Eagle3Proposer(head, target, device=DEVICE), prompt, gamma=3, temperature=0.8,
                        top_p=0.9, max_new_tokens=30, seed=seed).output_ids

    assert run(7) == run(7)
    assert run(7) != run(8)


# --- the sampled distribution is the target's (as tests/test_sampling.py checks draft and n-gram) -------------


@pytest.fixture(scope="module")
def small():
    """A 16-token target with peaked distributions, a head trained on it, and a prompt it continues."""
    target = tiny_target(vocab_size=16, seed=3)
    head, _ = trained_head(target, examples=tiny_examples(target, count=16), epochs=10)
    start = [3, 7, 1, 12, 5]
    continuation = generate(target, BaselineProposer(DEVICE), start, gamma=1, temperature=0.0, max_new_tokens=14)
    return target, head, start + list(continuation.output_ids)


@pytest.mark.parametrize("temperature, top_p", [(0.7, 1.0), (1.0, 0.8)])
def test_eagle3_sampling_matches_the_target_distribution(small, temperature, top_p):
    target, head, prompt = small
    exact = exact_joint(target, prompt, temperature=temperature, top_p=top_p)
    counts, drafted, accepted = empirical_joint(target, lambda: Eagle3Proposer(head, target, device=DEVICE), prompt,
                                                temperature=temperature, top_p=top_p)
    assert 0.05 * drafted < accepted < 0.95 * drafted, "the test needs both accepted and rejected drafts"
    assert min(pair_p_values(counts, exact)) > P_MIN


def test_a_broken_acceptance_rule_is_caught_with_eagle3(small, monkeypatch):
    monkeypatch.setattr(decode, "verify_sampling", broken_verify_sampling)
    target, head, prompt = small
    exact = exact_joint(target, prompt, temperature=1.0, top_p=1.0)
    counts, _, _ = empirical_joint(target, lambda: Eagle3Proposer(head, target, device=DEVICE), prompt,
                                   temperature=1.0, top_p=1.0)
    assert min(pair_p_values(counts, exact)) < P_MIN


"""Drafts with another tokenizer (specbench.decoding.vocab), on tiny models whose word vocabularies differ: the target
over 16 words, the draft over 18 (14 of the target's, in another order, and 4 it lacks). Greedy outputs equal the
baseline's for both ways of drafting; sampling through the intersection is distributed exactly as the target's, and a
broken intersection (mass left on tokens the target cannot be offered) is caught."""

from __future__ import annotations

import pytest
import torch

from specbench.decoding import vocab
from specbench.decoding.decode import generate
from specbench.decoding.proposers import BaselineProposer
from specbench.decoding.sampling import Sampler
from specbench.decoding.vocab import CrossVocabularyProposer, same_vocabulary, vocabulary_map
from test_sampling import GAMMA, P_MIN, TOKENS, VOCAB, empirical_joint, exact_joint, pair_p_values
from tiny import DEVICE, WORDS, reindexed, tiny_llama, word_tokenizer

TARGET_WORDS = list(WORDS[:VOCAB])  # <unk> <eos> <pad> the a an of to in on and or is are was be
DRAFT_WORDS = [*WORDS[:3], "is", "the", "of", "a", "and", "to", "on", "an", "are", "be", "in",  # shared, reordered
               "cat", "dog", "mat", "sat"]  # the target has none of these


@pytest.fixture(scope="module")
def models():
    """A peaked target, two drafts over DRAFT_WORDS, and a prompt. `close` agrees with the target on shared words
    (greedy drafts accepted); `split` is noisier and its four words the target lacks copy the rows of the target's
    likeliest words after the prompt, so it puts much of its mass where the target cannot be offered it: what a
    broken intersection gets wrong, and the sampled tests' draft."""
    target = tiny_llama(vocab_size=VOCAB, layers=1, hidden=32, seed=3, init_std=0.3)
    start = [3, 7, 10, 12, 5]
    continuation = generate(target, BaselineProposer(DEVICE), start, gamma=1, temperature=0.0, max_new_tokens=14)
    likely = [TARGET_WORDS[i] for i in dict.fromkeys(continuation.output_ids) if TARGET_WORDS[i] in DRAFT_WORDS]
    drafts = {"close": reindexed(target, TARGET_WORDS, DRAFT_WORDS, scale=0.3),
              "split": reindexed(target, TARGET_WORDS, DRAFT_WORDS, scale=0.6, aliases=dict(zip(DRAFT_WORDS[-4:], likely)))}
    target_tokenizer, draft_tokenizer = word_tokenizer(TARGET_WORDS), word_tokenizer(DRAFT_WORDS)
    return target, drafts, target_tokenizer, draft_tokenizer, start + list(continuation.output_ids)


def proposer(models, mode: str, draft: str = "split"):
    target, drafts, target_tokenizer, draft_tokenizer, _ = models
    mapping = vocabulary_map(target_tokenizer, draft_tokenizer, target_size=VOCAB, draft_size=len(DRAFT_WORDS),
                             device=DEVICE)
    return lambda: CrossVocabularyProposer(drafts[draft], target_tokenizer=target_tokenizer, draft_tokenizer=draft_tokenizer,
                                           vocabulary=mapping, mode=mode, device=DEVICE)


def test_the_shared_vocabulary_maps_each_draft_token_to_the_target_token_with_its_string():
    mapping = vocabulary_map(word_tokenizer(TARGET_WORDS), word_tokenizer(DRAFT_WORDS), target_size=VOCAB,
                             draft_size=len(DRAFT_WORDS))
    assert mapping.shared == 14 and mapping.target_tokens == VOCAB
    for draft_id, word in enumerate(DRAFT_WORDS):
        expected = TARGET_WORDS.index(word) if word in TARGET_WORDS else -1
        assert int(mapping.draft_to_target[draft_id]) == expected
    assert not same_vocabulary(word_tokenizer(TARGET_WORDS), word_tokenizer(DRAFT_WORDS))


@pytest.mark.parametrize("mode", ["intersection", "text"])
def test_greedy_outputs_equal_the_baseline_and_the_draft_is_accepted(models, mode):
    target, _, _, _, prompt = models
    baseline = generate(target, BaselineProposer(DEVICE), prompt[:5], gamma=1, temperature=0.0, max_new_tokens=24)
    trace = generate(target, proposer(models, mode, "close")(), prompt[:5], gamma=3, temperature=0.0, max_new_tokens=24)
    assert trace.output_ids == baseline.output_ids
    assert 0 < trace.accepted_tokens < trace.drafted_tokens
    assert len(trace.shared_mass) == len(trace.steps) and all(0 < m <= 1 + 1e-6 for m in trace.shared_mass)


def test_intersection_proposals_carry_q_on_the_target_ids_summing_to_one(models):
    _, _, _, _, prompt = models
    made = proposer(models, "intersection", "close")()
    made.prefill(prompt, max_length=len(prompt) + 8)
    sampler = Sampler(temperature=1.0, top_p=1.0, generator=torch.Generator().manual_seed(0))
    proposal = made.propose(prompt, 3, sampler)
    assert proposal.probs.shape == (3, VOCAB)
    assert torch.allclose(proposal.probs.sum(-1), torch.ones(3))
    unshared = [TARGET_WORDS.index(w) for w in TARGET_WORDS if w not in DRAFT_WORDS]
    assert (proposal.probs[:, unshared] == 0).all()
    assert all(proposal.probs[i, int(token)] > 0 for i, token in enumerate(proposal.tokens))


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_sampling_through_the_intersection_matches_the_target_distribution(models, temperature, top_p):
    target, _, _, _, prompt = models
    exact = exact_joint(target, prompt, temperature=temperature, top_p=top_p)
    counts, drafted, accepted = empirical_joint(target, proposer(models, "intersection"), prompt,
                                                temperature=temperature, top_p=top_p)
    assert 0.05 * drafted < accepted < 0.95 * drafted, "the test needs both accepted and rejected drafts"
    for p_value in pair_p_values(counts, exact):
        assert p_value > P_MIN


def test_a_broken_intersection_is_caught(models, monkeypatch):
    """q not renormalised on the shared tokens: the mass the draft put on the words the target lacks is left out of
    q (proposals still come from the shared tokens), so every proposal is accepted too often."""
    monkeypatch.setattr(vocab, "restricted_probs", lambda logits, shared, sampler: sampler.probs(logits) * shared)
    target, _, _, _, prompt = models
    exact = exact_joint(target, prompt, temperature=1.0, top_p=1.0)
    counts, _, _ = empirical_joint(target, proposer(models, "intersection"), prompt, temperature=1.0, top_p=1.0)
    assert min(pair_p_values(counts, exact)) < P_MIN


def test_text_drafting_under_sampling_is_exact_too(models):
    """The text path proposes a deterministic guess (the draft's greedy text), verified as a point mass: exact."""
    target, _, _, _, prompt = models
    exact = exact_joint(target, prompt, temperature=1.0, top_p=1.0)
    counts, drafted, accepted = empirical_joint(target, proposer(models, "text"), prompt, temperature=1.0, top_p=1.0)
    assert accepted > 0
    for p_value in pair_p_values(counts, exact):
        assert p_value > P_MIN


assert GAMMA >= 1 and TOKENS >= 2  # the shared test bed of test_sampling: gamma 2, four tokens per request


# --- a draft of another tokenizer through `specbench run`, and what is refused ----------------------------------------

OTHER_WORDS = [*WORDS[:3], *reversed(WORDS[3:40]), "zebra", "quartz", "fjord"]  # 37 of the target's, reordered
STRANGER_WORDS = [*WORDS[:3], *(f"w{i}" for i in range(40))]  # 3 of the target's 64 tokens


def cross_project(tmp_path, *, draft_words: list[str], extra: str = "", engine: str | None = None):
    from tiny import tiny_profile, write_model_folder, write_project

    project = write_project(tmp_path, profile="", prompts=[("the cat sat on the mat and the dog ran fast", "chat"),
                                                          ("write code to sum one two three", "chat")])
    target = tiny_llama(vocab_size=len(WORDS))
    write_model_folder(project / "other", reindexed(target, list(WORDS), draft_words, scale=0.01),
                       word_tokenizer(draft_words))
    write_model_folder(project / "target", target)  # the project's target, so that the draft above agrees with it
    profile = tiny_profile(gamma=(2,), temperature=(0.0, 0.8), max_new_tokens=12, repeats=1, warmup=0)
    profile = profile.replace('[[drafts]]\nname = "close"', f'[[drafts]]\nname = "other"\nmethod = "draft"\n'
                              f'model = "./other"\n{extra}[[drafts]]\nname = "close"')
    (project / "tiny.toml").write_text(profile)
    return project


def test_a_run_drafts_with_another_tokenizer_and_records_the_overlap(tmp_path, monkeypatch):
    import pandas as pd
    from typer.testing import CliRunner

    from specbench.cli import app

    project = cross_project(tmp_path, draft_words=OTHER_WORDS)
    monkeypatch.chdir(project)
    result = CliRunner().invoke(app, ["run", "tiny.toml", "--out", "out"])
    assert result.exit_code == 0, result.output
    points = pd.read_parquet(project / "out" / "points.parquet").set_index("point_id")
    other = points.loc[["other-g2-t0-p1", "other-g2-t0.8-p1"]]
    assert (other["vocabulary"] == "intersection").all() and (other["shared_tokens"] == 40).all()
    assert other["shared_vocabulary_mass"].between(0, 1).all() and (other["status"] == "ok").all()
    assert bool(other.loc["other-g2-t0-p1", "outputs_match_baseline"])
    assert other.loc["other-g2-t0-p1", "acceptance_rate"] > 0
    assert points.loc["close-g2-t0-p1", "vocabulary"] is pd.NA or pd.isna(points.loc["close-g2-t0-p1", "vocabulary"])


def test_a_draft_sharing_too_little_is_refused_before_any_point(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from specbench.cli import app

    project = cross_project(tmp_path, draft_words=STRANGER_WORDS)
    monkeypatch.chdir(project)
    result = CliRunner().invoke(app, ["run", "tiny.toml", "--out", "out"])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.output  # after the loading messages, one line
    assert "drafts[1].model: " in errors[0] and "other shares 3 of the target's 64 tokens (4.7%)" in errors[0]
    assert not (project / "out" / "points.parquet").exists()


@pytest.mark.parametrize("engine, vocabulary, words", [
    ("vllm", "text", "by the token-level intersection only"),
    ("llama.cpp", "intersection", "llama.cpp runs no draft with another tokenizer"),
    ("sglang", "intersection", "SGLang runs no draft with another tokenizer"),
])
def test_engines_without_a_way_of_drafting_across_vocabularies_are_refused(tmp_path, engine, vocabulary, words):
    from specbench.profile import ProfileError, load_profile

    path = tmp_path / "p.toml"
    path.write_text(f'name = "x"\nbackend = "server"\n[server]\nengine = "{engine}"\n[target]\nmodel = "t"\n'
                    f'[[drafts]]\nname = "other"\nmethod = "draft"\nmodel = "d"\nvocabulary = "{vocabulary}"\n'
                    '[sweep]\ngamma = [3]\ntemperature = [0.0]\n[workload]\nprompts = "builtin:mixed"\n')
    with pytest.raises(ProfileError) as error:
        load_profile(path)
    assert "drafts[0].vocabulary" in str(error.value) and words in str(error.value)


def test_vllm_drafts_across_vocabularies_with_use_heterogeneous_vocab():
    from specbench.engines import ENGINES
    from specbench.engines.base import Speculation

    config = ENGINES["vllm"].speculative_config(Speculation("draft", 3, "d", vocabulary="intersection"))
    assert config == {"method": "draft_model", "num_speculative_tokens": 3, "model": "d",
                      "use_heterogeneous_vocab": True}


def test_the_hf_backend_drafts_across_vocabularies_through_transformers(tmp_path, monkeypatch):
    """transformers' assistant_tokenizer: universal assisted generation when greedy (outputs equal the baseline's),
    its token-level intersection when sampling; each point says which."""
    import pandas as pd
    from typer.testing import CliRunner

    from specbench.cli import app

    project = cross_project(tmp_path, draft_words=OTHER_WORDS)
    monkeypatch.chdir(project)
    result = CliRunner().invoke(app, ["run", "tiny.toml", "--backend", "hf", "--out", "out"])
    assert result.exit_code == 0, result.output
    points = pd.read_parquet(project / "out" / "points.parquet").set_index("point_id")
    assert points.loc["other-g2-t0-p1", "vocabulary"] == "text" and bool(points.loc["other-g2-t0-p1",
                                                                                    "outputs_match_baseline"])
    assert points.loc["other-g2-t0.8-p1", "vocabulary"] == "intersection"
    assert (points["status"] == "ok").all(), points[["status", "error"]]


@pytest.mark.parametrize("draft_words, start, end", [
    (OTHER_WORDS, "drafts[0].model: its tokenizer is not the target's (", "other shares 40 of the target's 64 tokens "
     "(62.5%)) and llama.cpp drafts only with the target's; use engine = \"vllm\" (use_heterogeneous_vocab), backend "
     "= \"native\", or a draft of the target's family"),
    (STRANGER_WORDS, "drafts[0].model: ", "other shares 3 of the target's 64 tokens (4.7%), under the 10% a draft of "
     "another tokenizer needs; pick a draft whose tokenizer is closer to the target's"),
])
def test_the_server_backend_finds_another_tokenizer_before_any_launch(tmp_path, monkeypatch, draft_words, start, end):
    """A draft model whose tokenizer is not the target's, the profile silent about it: on an engine that cannot
    draft across vocabularies (llama.cpp here), or sharing too little, one line naming the draft, exit 2, nothing
    launched or written (vLLM launches it with use_heterogeneous_vocab: tests/test_server_vllm.py)."""
    from typer.testing import CliRunner

    from specbench.cli import app

    project = cross_project(tmp_path, draft_words=draft_words)
    binary = project / "llama-server"
    binary.write_text("#!/bin/sh\n")  # found, never launched
    binary.chmod(0o755)
    (project / "server.toml").write_text(
        f'name = "s"\nbackend = "server"\n[server]\nengine = "llama.cpp"\nbinary = "{binary}"\n[target]\n'
        'model = "./target"\n[[drafts]]\nname = "other"\nmethod = "draft"\nmodel = "./other"\n[sweep]\ngamma = [2]\n'
        'temperature = [0.0]\n[workload]\nprompts = "prompts.jsonl"\nmax_new_tokens = 8\n')
    monkeypatch.chdir(project)
    result = CliRunner().invoke(app, ["run", "server.toml", "--out", "out"])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert errors[0].startswith(f"error: server.toml: {start}") and errors[0].endswith(end), errors[0]
    assert not (project / "out" / "points.parquet").exists()

"""Medusa heads (specbench.models.medusa, decoding.medusa) on tiny models: vLLM's folder format, the hidden row every
head reads, greedy outputs equal to the baseline's, the sampled distribution exact, and heads that do not fit refused
in one line."""

from __future__ import annotations

import json

import pytest
import torch

from specbench.decoding.decode import generate
from specbench.decoding.medusa import MedusaProposer
from specbench.decoding.proposers import BaselineProposer
from specbench.models.errors import HeadError
from specbench.models.medusa import MedusaHeads, load_medusa, save_medusa
from test_sampling import P_MIN, VOCAB, empirical_joint, exact_joint, pair_p_values
from tiny import DEVICE, tiny_llama


def noisy_heads(target, *, num_heads: int = 3, scale: float = 0.5, seed: int = 0) -> MedusaHeads:
    """Medusa's initialisation (the target's LM head, zero blocks) plus noise in the blocks."""
    heads = MedusaHeads.from_target(target, num_heads=num_heads)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in heads.blocks:
            for layer in block.layers:
                layer.weight.add_(scale * torch.randn(layer.weight.shape, generator=generator).to(layer.weight.device))
    return heads.eval()


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab_size=VOCAB, layers=1, hidden=32, seed=3, init_std=0.3)


def test_heads_save_in_vllms_format_and_load_back(tmp_path, target):
    heads = noisy_heads(target)
    save_medusa(heads, tmp_path / "medusa")
    config = json.loads((tmp_path / "medusa" / "config.json").read_text())
    assert config["model_type"] == "medusa" and config["architectures"] == ["MedusaModel"]
    assert (config["hidden_size"], config["vocab_size"], config["num_heads"], config["num_hidden_layers"]) == \
        (32, VOCAB, 3, 1)
    from safetensors.torch import load_file

    names = set(load_file(str(tmp_path / "medusa" / "model.safetensors")))
    assert {"blocks.0.layers.0.weight", "blocks.2.layers.0.bias", "lm_heads.1.weight"} <= names
    loaded = load_medusa(tmp_path / "medusa", target)
    hidden = torch.randn(5, 32)
    assert torch.allclose(loaded(hidden), heads(hidden))


def test_heads_for_another_hidden_size_are_refused_in_one_line(tmp_path, target):
    save_medusa(noisy_heads(tiny_llama(vocab_size=VOCAB, layers=1, hidden=64, seed=1)), tmp_path / "other")
    with pytest.raises(HeadError) as error:
        load_medusa(tmp_path / "other", target)
    assert "read hidden states of size 64, the target's are 32" in str(error.value)
    assert "\n" not in str(error.value)


def test_a_config_without_a_head_count_is_refused_in_one_line(tmp_path, target):
    folder = save_medusa(noisy_heads(target), tmp_path / "heads")
    config = json.loads((folder / "config.json").read_text())
    del config["num_heads"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(HeadError, match=r"config\.json: num_heads must be an integer >= 1 \(got None\)$"):
        load_medusa(folder, target)


def test_every_head_reads_the_row_that_chose_the_newest_token(target):
    """At every step of a real decode, the proposals equal the heads applied to the target's last-norm output, computed
    afresh without a cache, at the row that chose the sequence's newest token."""
    heads = noisy_heads(target)
    proposed: list[tuple[int, list[int]]] = []

    class Recording(MedusaProposer):
        def propose(self, sequence, k, sampler):
            proposal = super().propose(sequence, k, sampler)
            proposed.append((len(sequence), proposal.tokens.tolist()))
            return proposal

    prompt = [3, 7, 1, 12, 5]
    trace = generate(target, Recording(heads, target, device=DEVICE), prompt, gamma=3, temperature=0.0,
                     max_new_tokens=20)
    full = prompt + list(trace.output_ids)
    captured = {}
    handle = target.get_decoder().norm.register_forward_hook(lambda m, a, out: captured.__setitem__("h", out[0]))
    with torch.no_grad():
        target(torch.tensor([full]))
    handle.remove()
    assert len(trace.steps) - 1 <= len(proposed) <= len(trace.steps) and len(proposed) > 3  # none when no room is left
    for length, tokens in proposed:
        assert tokens == heads(captured["h"][length - 2], heads=len(tokens)).argmax(dim=-1).tolist()


@pytest.mark.parametrize("gamma", [1, 3])
def test_greedy_outputs_equal_the_baseline(target, gamma):
    prompt = [3, 7, 1, 12, 5, 3, 7]
    baseline = generate(target, BaselineProposer(DEVICE), prompt, gamma=1, temperature=0.0, max_new_tokens=24)
    trace = generate(target, MedusaProposer(noisy_heads(target, scale=0.05), target, device=DEVICE), prompt,
                     gamma=gamma, temperature=0.0, max_new_tokens=24)
    assert trace.output_ids == baseline.output_ids
    assert trace.drafted_tokens > 0


def test_sampled_outputs_follow_the_target_distribution(target):
    prompt = [3, 7, 1, 12, 5]
    continuation = generate(target, BaselineProposer(DEVICE), prompt, gamma=1, temperature=0.0, max_new_tokens=14)
    prompt = prompt + list(continuation.output_ids)
    heads = noisy_heads(target, scale=0.05)
    exact = exact_joint(target, prompt, temperature=1.0, top_p=1.0)
    counts, drafted, accepted = empirical_joint(target, lambda: MedusaProposer(heads, target, device=DEVICE), prompt,
                                                temperature=1.0, top_p=1.0)
    assert 0 < accepted < drafted
    for p_value in pair_p_values(counts, exact):
        assert p_value > P_MIN


def medusa_project(tmp_path, models_dir, *, hidden: int | None = None):
    from transformers import AutoModelForCausalLM

    from tiny import tiny_profile, write_project

    project = write_project(tmp_path, profile="", prompts=[("the cat sat on the mat and the dog ran fast", "chat"),
                                                          ("write code to sum one two three", "chat")],
                            models=models_dir)
    target = AutoModelForCausalLM.from_pretrained(project / "target")
    source = target if hidden is None else tiny_llama(vocab_size=target.config.vocab_size, hidden=hidden, seed=2)
    save_medusa(noisy_heads(source, scale=0.05), project / "medusa")
    profile = tiny_profile(gamma=(2, 3), temperature=(0.0, 0.8), max_new_tokens=12, repeats=1, warmup=0)
    (project / "tiny.toml").write_text(profile.replace(
        '[[drafts]]\nname = "close"', '[[drafts]]\nname = "heads"\nmethod = "medusa"\nmodel = "./medusa"\n'
        '[[drafts]]\nname = "close"'))
    return project


def test_a_run_drafts_with_medusa_heads_on_the_native_backend(tmp_path, models_dir, monkeypatch):
    import pandas as pd
    from typer.testing import CliRunner

    from specbench.cli import app

    project = medusa_project(tmp_path, models_dir)
    monkeypatch.chdir(project)
    result = CliRunner().invoke(app, ["run", "tiny.toml", "--out", "out"])
    assert result.exit_code == 0, result.output
    points = pd.read_parquet(project / "out" / "points.parquet").set_index("point_id")
    heads = points[points["method"] == "medusa"]
    assert len(heads) == 4 and (heads["status"] == "ok").all()
    assert heads[heads["temperature"] == 0]["outputs_match_baseline"].all()
    assert (heads["drafted_per_step"] > 0).all()


def test_heads_that_do_not_fit_the_target_stop_the_run_in_one_line(tmp_path, models_dir, monkeypatch):
    from typer.testing import CliRunner

    from specbench.cli import app

    project = medusa_project(tmp_path, models_dir, hidden=32)
    monkeypatch.chdir(project)
    result = CliRunner().invoke(app, ["run", "tiny.toml", "--out", "out"])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert "drafts[1].model: " in errors[0] and "read hidden states of size 32, the target's are 64" in errors[0]
    assert not (project / "out" / "points.parquet").exists()


def test_a_gamma_beyond_the_heads_is_refused_in_one_line(tmp_path, models_dir, monkeypatch):
    from typer.testing import CliRunner

    from specbench.cli import app

    project = medusa_project(tmp_path, models_dir)
    (project / "tiny.toml").write_text((project / "tiny.toml").read_text().replace("gamma = [2, 3]", "gamma = [2, 4]"))
    monkeypatch.chdir(project)
    result = CliRunner().invoke(app, ["run", "tiny.toml", "--out", "out"])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert "propose 3 tokens a step, gamma 4 asks for more: use gammas up to 3" in errors[0]


def test_heads_train_kind_medusa_distils_heads_that_a_run_drafts_with(tmp_path, monkeypatch):
    """`specbench heads train --kind medusa` on a tiny target: heads in vLLM's format, each agreeing with the target's
    greedy tokens on its training positions far more than Medusa's initialisation, cached; a run drafts with them."""
    import pandas as pd
    from typer.testing import CliRunner

    from specbench.cli import app
    from test_heads import PROMPTS
    from tiny import WORDS, tiny_profile, write_model_folder

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    write_model_folder(tmp_path / "target", tiny_llama(vocab_size=len(WORDS), layers=2, init_std=0.3, seed=5))
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    args = ["heads", "train", "--kind", "medusa", "--target", "./target", "--workload", "prompts.jsonl",
            "--max-prompts", "8", "--max-new-tokens", "16", "--epochs", "40", "--ttt-steps", "2",
            "--learning-rate", "0.01", "--out", "heads", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{\n"):])
    assert report["settings"]["kind"] == "medusa" and len(report["agreement"]) == 2
    assert all(t > u + 0.2 for t, u in zip(report["train_agreement"], report["agreement_untrained"]))
    assert report["losses"][1] < report["losses"][0]
    assert json.loads((tmp_path / "heads" / "config.json").read_text())["num_heads"] == 2
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and json.loads(again.stdout[again.stdout.index("{\n"):])["cached"]
    (tmp_path / "tiny.toml").write_text(
        tiny_profile(gamma=(2,), temperature=(0.0,), max_new_tokens=12, repeats=1, warmup=0).replace(
            '[[drafts]]\nname = "close"\nmethod = "draft"\nmodel = "./draft"\n',
            '[[drafts]]\nname = "heads"\nmethod = "medusa"\nmodel = "./heads"\n'))
    (tmp_path / "tiny.toml").write_text((tmp_path / "tiny.toml").read_text().replace(
        '[workload]\nprompts = "prompts.jsonl"', '[workload]\nprompts = "prompts.jsonl"\nmax_prompts = 3'))
    run = CliRunner().invoke(app, ["run", "tiny.toml", "--out", "out"])
    assert run.exit_code == 0, run.output
    points = pd.read_parquet(tmp_path / "out" / "points.parquet").set_index("point_id")
    assert bool(points.loc["heads-g2-t0-p1", "outputs_match_baseline"])
    assert points.loc["heads-g2-t0-p1", "acceptance_rate"] > 0

"""MTP: a target written in MiMo's format (exactly the same model), its MTP layer's names and refusals, the native
proposer (greedy equality, the training unroll's drafts, the target's exact distribution, a broken rule caught),
`specbench heads train --kind mtp` and `target.mtp = "trained:PRESET"` end to end on a tiny target, and the profile's
one-line refusals. On a real engine: tests/test_eagle3_engines.py (the MTP model natively and on vLLM CPU)."""

from __future__ import annotations

import json
import re
import subprocess

import pandas as pd
import pytest
import torch
from eagle3_tiny import embedding_of, random_prompts
from test_decoding import check_accounting
from test_heads import PROMPTS, SETTINGS
from test_sampling import P_MIN, broken_verify_sampling, empirical_joint, exact_joint, pair_p_values
from installed_engines import VLLM_PYTHON, needs_vllm
from tiny import DEVICE, WORDS, tiny_llama, write_model_folder
from typer.testing import CliRunner

from specbench.cli import app
from specbench.decoding import decode
from specbench.decoding.decode import generate
from specbench.decoding.eagle3 import MtpProposer
from specbench.decoding.proposers import BaselineProposer
from specbench.decoding.sampling import Sampler
from specbench.heads import reference
from specbench.heads.data import capture_examples, greedy_continuations
from specbench.heads.settings import HeadSettings
from specbench.heads.train import TrainSettings, fit, make_batches, unroll
from specbench.models.errors import HeadError
from specbench.models.mtp import load_mtp_layers, new_layer, write_mtp_model

MAX_NEW = 40
# what vLLM 0.32's MiMoMTP.load_weights reads of layer 0 (mimo_mtp.py maps self_attn/mlp/norms under mtp_block),
# for hidden 64, 4 heads and 2 KV heads of 16, intermediate 128
MTP_TENSORS = {
    "token_layernorm.weight": [64], "hidden_layernorm.weight": [64], "input_proj.weight": [64, 128],
    "final_layernorm.weight": [64], "input_layernorm.weight": [64], "post_attention_layernorm.weight": [64],
    "self_attn.q_proj.weight": [64, 64], "self_attn.q_proj.bias": [64], "self_attn.k_proj.weight": [32, 64],
    "self_attn.k_proj.bias": [32], "self_attn.v_proj.weight": [32, 64], "self_attn.v_proj.bias": [32],
    "self_attn.o_proj.weight": [64, 64], "mlp.gate_proj.weight": [128, 64], "mlp.up_proj.weight": [128, 64],
    "mlp.down_proj.weight": [64, 128],
}


def tiny_target(*, vocab_size: int = 64, seed: int = 2):
    return tiny_llama(vocab_size=vocab_size, layers=3, hidden=64, seed=seed, init_std=0.3)


def examples_of(target, *, count: int = 24, max_new_tokens: int = 24):
    prompts = random_prompts(count, vocab_size=target.config.vocab_size, seed=0)
    continuations = greedy_continuations(target, prompts, max_new_tokens=max_new_tokens,
                                         eos_token_ids=(target.config.eos_token_id,), pad_token_id=0, batch_size=8)
    return capture_examples(target, prompts, continuations, layer_ids=[target.config.num_hidden_layers])


def trained_layer(target, *, epochs: int = 30, examples=None):
    torch.manual_seed(0)
    layer = new_layer(target).to(DEVICE)
    batches = make_batches(examples or examples_of(target), batch_tokens=512, steps=3, to_draft=None, device=DEVICE)
    settings = TrainSettings(epochs=epochs, batch_tokens=512, learning_rate=3e-3, ttt_steps=3, seed=0)
    losses = fit(layer, batches, settings=settings, embed=embedding_of(target),
                 lm_head_weight=target.get_output_embeddings().weight.detach())
    return layer.eval(), losses


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def trained(target):
    return trained_layer(target)


@pytest.fixture(scope="module")
def layer(trained):
    return trained[0]


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return random_prompts(1, vocab_size=64, seed=0)[0]  # one the layer was trained on


# --- the format -------------------------------------------------------------------------------------------------


def test_a_target_written_as_mimo_is_exactly_the_same_model(target, layer, tmp_path):
    """A Llama target (tied embeddings, no biases) written as MiMoForCausalLM (zero q/k/v biases for vLLM's Qwen2
    layers, its own lm_head): transformers loads it as the Llama it was, its logits bit for bit the original's. The MTP
    layer carries the names vLLM's MiMoMTP reads."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    write_model_folder(tmp_path / "llama", target)
    write_mtp_model(tmp_path / "llama", [layer], tmp_path / "mimo")
    config = json.loads((tmp_path / "mimo" / "config.json").read_text())
    assert config["architectures"] == ["MiMoForCausalLM"] and config["model_type"] == "llama"
    assert config["num_nextn_predict_layers"] == 1 and config["tie_word_embeddings"] is False
    tensors = load_file(str(tmp_path / "mimo" / "model.safetensors"))
    mtp = {name.removeprefix("model.mtp_layers.0."): list(t.shape) for name, t in tensors.items() if "mtp" in name}
    assert mtp == MTP_TENSORS
    assert torch.equal(tensors["lm_head.weight"], target.get_output_embeddings().weight.cpu())
    assert not tensors["model.layers.0.self_attn.q_proj.bias"].any()
    mimo = AutoModelForCausalLM.from_pretrained(tmp_path / "mimo", dtype=torch.float32).to(DEVICE).eval()
    assert type(mimo).__name__ == "LlamaForCausalLM"
    ids = torch.tensor([random_prompts(1, vocab_size=64, seed=3)[0]], device=DEVICE)
    with torch.no_grad():
        assert torch.equal(mimo(ids).logits, target(ids).logits)
    [loaded] = load_mtp_layers(tmp_path / "mimo", mimo.config, device=DEVICE)
    assert all(torch.equal(value, layer.state_dict()[name]) for name, value in loaded.state_dict().items())


def test_folders_without_mtp_layers_or_with_broken_ones_are_refused_in_one_line(target, layer, tmp_path):
    from safetensors.torch import load_file, save_file

    write_model_folder(tmp_path / "llama", target)
    with pytest.raises(HeadError, match=re.escape(f"{tmp_path / 'llama' / 'config.json'}: num_nextn_predict_layers: "
                                                  "the model has no MTP layers")):
        load_mtp_layers(tmp_path / "llama", target.config)
    write_mtp_model(tmp_path / "llama", [layer], tmp_path / "mimo")
    tensors = load_file(str(tmp_path / "mimo" / "model.safetensors"))
    del tensors["model.mtp_layers.0.input_proj.weight"]
    save_file(tensors, str(tmp_path / "mimo" / "model.safetensors"))
    with pytest.raises(HeadError, match=re.escape("tensor model.mtp_layers.0.input_proj.weight is missing")):
        load_mtp_layers(tmp_path / "mimo", target.config)
    config = json.loads((tmp_path / "llama" / "config.json").read_text())
    (tmp_path / "llama" / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(HeadError, match=re.escape('model_type: "gpt2": specbench makes MTP models of')):
        write_mtp_model(tmp_path / "llama", [layer], tmp_path / "other")


# --- the proposer ------------------------------------------------------------------------------------------------


def test_the_training_unroll_equals_what_the_proposer_drafts(target):
    """The proposer's draft distributions (its cache, positions, position 0's masked token, its own output fed back)
    equal the training-time test's at the same anchor."""
    torch.manual_seed(4)
    layer = new_layer(target).to(DEVICE).eval()
    prefix = [5, 9, 13, 22, 5, 9, 40, 41, 42, 5, 9, 13, 7]
    proposer = MtpProposer(layer, target, device=DEVICE)
    proposer.prefill(prefix, max_length=64)
    with torch.no_grad():
        target(input_ids=torch.tensor([prefix[:-1]], device=DEVICE))  # what the target verified
        sampler = Sampler(temperature=1.0, top_p=1.0, generator=torch.Generator(device=DEVICE).manual_seed(0))
        proposal = proposer.propose(prefix, 3, sampler)
        sequence = prefix + proposal.tokens.tolist()[:2]
        [example] = capture_examples(target, [sequence], [[]], layer_ids=[target.config.num_hidden_layers])
        [batch] = make_batches([example], batch_tokens=1024, steps=3, to_draft=None, device=DEVICE)
        logits = unroll(layer, batch, embed=embedding_of(target), lm_head_weight=target.get_output_embeddings().weight,
                        steps=3)
    anchor = len(prefix) - 2
    expected = torch.stack([torch.softmax(step[0, anchor], dim=-1) for step in logits])
    torch.testing.assert_close(proposal.probs, expected, rtol=1e-4, atol=1e-6)


def test_training_lowers_the_loss(trained):
    losses = trained[1]
    assert sum(losses[-3:]) < 0.5 * sum(losses[:3]), (losses[:3], losses[-3:])


@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_greedy_mtp_equals_baseline(target, layer, prompt, gamma):
    expected = generate(target, BaselineProposer(DEVICE), prompt, gamma=1, temperature=0.0, max_new_tokens=MAX_NEW)
    trace = generate(target, MtpProposer(layer, target, device=DEVICE), prompt, gamma=gamma, temperature=0.0,
                     max_new_tokens=MAX_NEW)
    assert trace.output_ids == expected.output_ids
    check_accounting(trace, gamma=gamma)
    assert 0 < trace.accepted_tokens < trace.drafted_tokens, "the test needs accepted and rejected drafts"
    if gamma > 1:
        assert trace.accepted_per_position[1] > 0, "and acceptance of the chained layer's drafts"


@pytest.fixture(scope="module")
def small():
    """A 16-token target with peaked distributions, an MTP layer trained on it, and a prompt it continues."""
    target = tiny_target(vocab_size=16, seed=3)
    layer, _ = trained_layer(target, epochs=10, examples=examples_of(target, count=16))
    start = [3, 7, 1, 12, 5]
    continuation = generate(target, BaselineProposer(DEVICE), start, gamma=1, temperature=0.0, max_new_tokens=14)
    return target, layer, start + list(continuation.output_ids)


def test_mtp_sampling_matches_the_target_distribution(small):
    target, layer, prompt = small
    exact = exact_joint(target, prompt, temperature=0.7, top_p=1.0)
    counts, drafted, accepted = empirical_joint(target, lambda: MtpProposer(layer, target, device=DEVICE), prompt,
                                                temperature=0.7, top_p=1.0)
    assert 0.05 * drafted < accepted < 0.95 * drafted, "the test needs both accepted and rejected drafts"
    assert min(pair_p_values(counts, exact)) > P_MIN


def test_a_broken_acceptance_rule_is_caught_with_mtp(small, monkeypatch):
    monkeypatch.setattr(decode, "verify_sampling", broken_verify_sampling)
    target, layer, prompt = small
    exact = exact_joint(target, prompt, temperature=1.0, top_p=1.0)
    counts, _, _ = empirical_joint(target, lambda: MtpProposer(layer, target, device=DEVICE), prompt,
                                   temperature=1.0, top_p=1.0)
    assert min(pair_p_values(counts, exact)) < P_MIN


# --- end to end on a tiny target ---------------------------------------------------------------------------------


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    write_model_folder(tmp_path / "target", tiny_llama(vocab_size=len(WORDS), layers=3, init_std=0.3, seed=5))
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return tmp_path


def profile_text(*, target: str = "./target", mtp: str | None = None, backend: str = "native",
                 extra: str = "") -> str:
    mtp_key = f'mtp = "{mtp}"\n' if mtp else ""
    return (f'name = "tiny"\nbackend = "{backend}"\n{extra}[target]\nmodel = "{target}"\n{mtp_key}'
            '[[drafts]]\nname = "mtp"\nmethod = "mtp"\n'
            '[sweep]\ngamma = [1, 3]\ntemperature = [0.0, 0.8]\n'
            '[workload]\nprompts = "prompts.jsonl"\nmax_prompts = 3\nmax_new_tokens = 12\n[run]\nwarmup = 0\n')


def test_heads_train_kind_mtp_makes_a_model_a_run_drafts_with(project):
    args = ["heads", "train", "--kind", "mtp", "--target", "./target", "--workload", "prompts.jsonl",
            "--max-prompts", "8", "--max-new-tokens", "16", "--epochs", "30", "--learning-rate", "0.01",
            "--out", "mimo", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{\n"):])
    assert report["settings"]["kind"] == "mtp" and len(report["agreement"]) == 3
    assert all(t > u + 0.2 for t, u in zip(report["train_agreement"], report["agreement_untrained"]))
    assert json.loads((project / "mimo" / "config.json").read_text())["num_nextn_predict_layers"] == 1
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and json.loads(again.stdout[again.stdout.index("{\n"):])["cached"]
    (project / "tiny.toml").write_text(profile_text(target="./mimo"))
    run = CliRunner().invoke(app, ["run", "tiny.toml", "--out", "out"])
    assert run.exit_code == 0, run.output
    points = pd.read_parquet(project / "out" / "points.parquet").set_index("point_id")
    assert (points["status"] == "ok").all() and len(points) == 6
    greedy = points[(points["method"] == "mtp") & (points["temperature"] == 0)]
    assert greedy["outputs_match_baseline"].all() and (greedy["acceptance_rate"] > 0).all()
    assert points.loc["mtp-g1-t0-p1", "max_gamma_predicted_speedup"] > 0  # predicted from gamma 3, as any draft's
    # tune searches the number of speculative tokens like any draft's gamma, and recommends the engines' MTP flags
    tuned = CliRunner().invoke(app, ["tune", "tiny.toml", "--trials", "3", "--out", "tuned"])
    assert tuned.exit_code == 0, tuned.output
    choice = json.loads((project / "tuned" / "recommendation.json").read_text())["temperatures"][0]
    if choice["speculate"]:
        settings = choice["engine_settings"]
        assert settings["vllm"]["speculative_config"]["method"] == "mtp"
        assert settings["sglang"]["args"][:4] == ["--speculative-algorithm", "NEXTN",
                                                  "--speculative-draft-model-path", str(project / "mimo")]
        assert "assistant_model" not in settings["transformers"]["generate_kwargs"]  # transformers has no MTP
        assert any("not mtp" in note for note in settings["notes"])


def test_a_target_mimos_format_cannot_hold_is_refused_before_distilling(project):
    config = json.loads((project / "target" / "config.json").read_text())
    (project / "target" / "config.json").write_text(json.dumps({**config, "model_type": "gpt_neox"}))
    result = CliRunner().invoke(app, ["heads", "train", "--kind", "mtp", "--target", "./target", "--workload",
                                      "prompts.jsonl"])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert 'model_type: "gpt_neox": specbench makes MTP models of LlamaForCausalLM and Qwen2ForCausalLM' in errors[0]
    assert not (project / "cache" / "heads").exists() or not any((project / "cache" / "heads").iterdir())


def test_target_mtp_trained_serves_every_point_with_the_mtp_model(project, monkeypatch):
    """target.mtp = "trained:quick": the MTP model distilled first (the preset's settings), then every point, the
    baseline's too, runs it; a second run takes it from the cache."""
    from specbench.sweep import run_profile
    from specbench.profile import load_profile

    monkeypatch.setitem(reference.PRESETS, "quick", HeadSettings(**{**SETTINGS, "epochs": 10}))
    (project / "tiny.toml").write_text(profile_text(mtp="trained:quick"))
    result = run_profile(load_profile(project / "tiny.toml"), out=project / "out")
    assert result.failed == 0
    points = pd.read_parquet(project / "out" / "points.parquet")
    assert points["target_model"].str.contains("/heads/mtp-").all()
    assert points[points["temperature"] == 0]["outputs_match_baseline"].all()
    trained = list((project / "cache" / "heads").iterdir())
    run_profile(load_profile(project / "tiny.toml"), out=project / "again")
    assert list((project / "cache" / "heads").iterdir()) == trained


@pytest.mark.parametrize("text, message", [
    (profile_text(), 'drafts[0].method: "mtp" drafts with the target\'s own MTP layers, and '),
    (profile_text(target="builtin:smollm2-135m-instruct"),
     'drafts[0].method: "mtp" drafts with the target\'s own MTP layers, and builtin:smollm2-135m-instruct has none'),
    (profile_text(mtp="trained:big"), 'target.mtp: must be "trained:default" or "trained:quick"'),
    (profile_text(mtp="quick"), 'target.mtp: must be "trained:default" or "trained:quick"'),
    (profile_text(mtp="trained:quick", backend="server",
                  extra='[server]\nengine = "llama.cpp"\n'),
     "target.mtp: llama.cpp's draft-mtp runs the MTP layers of GGUF targets whose architecture has them"),
    (profile_text(target="builtin:smollm2-135m-instruct", backend="server", extra='[server]\nengine = "llama.cpp"\n'),
     "builtin:smollm2-135m-instruct has none (its GGUF header has no nextn_predict_layers)"),
    (profile_text(mtp="trained:quick").replace('method = "mtp"\n', 'method = "mtp"\nmodel = "./target"\n'),
     'drafts[0].model: "mtp" drafts with the target\'s own MTP layers (remove model'),
    (profile_text(mtp="trained:quick", backend="hf"), 'drafts[0].method: "mtp" runs on backend "native" or "server"'),
], ids=["folder-without-layers", "builtin", "unknown-preset", "not-trained", "llama.cpp-mimo", "llama.cpp-builtin",
        "model", "hf"])
def test_bad_mtp_profiles_are_one_line_exit_2_and_write_nothing(project, text, message):
    (project / "tiny.toml").write_text(text)
    result = CliRunner().invoke(app, ["run", "tiny.toml", "--out", "out"])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert message in " ".join(result.output.split()), result.output
    assert not (project / "out").exists()


def test_vllm_refuses_a_gamma_its_mtp_layers_do_not_divide(project, layer, target):
    """vLLM chains a model's N MTP layers: num_speculative_tokens at most N or a multiple of N."""
    write_model_folder(project / "llama", target)
    write_mtp_model(project / "llama", [layer, layer], project / "two")
    (project / "tiny.toml").write_text(profile_text(target="./two", backend="server", extra=(
        '[server]\nengine = "vllm"\n')).replace("temperature = [0.0, 0.8]", "temperature = [0.0]"))
    result = CliRunner().invoke(app, ["run", "tiny.toml", "--out", "out"])
    assert result.exit_code == 2, result.output
    assert ("sweep.gamma: vLLM chains a target's 2 MTP layers, so its num_speculative_tokens must be at most 2 or a "
            "multiple of 2 (vllm/config/speculative.py; got gamma 3)") in " ".join(result.output.split())


# --- the GPU profiles' flags, against vLLM's own parser -------------------------------------------------------

PARSE = """
import dataclasses, json, sys
from vllm.config import SpeculativeConfig
from vllm.entrypoints.launchers.cli_args import make_arg_parser  # what vllm.entrypoints.openai.api_server parses with
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
for argv in json.loads(sys.stdin.read()):
    args = parser.parse_args(argv)
    config = json.loads(args.speculative_config) if isinstance(args.speculative_config, str) else args.speculative_config
    if config:
        unknown = set(config) - {field.name for field in dataclasses.fields(SpeculativeConfig)}
        assert not unknown, (argv, unknown)
    print(args.model, args.trust_remote_code, json.dumps(config))
"""


@needs_vllm
def test_the_vllm_gpu_mtp_profile_launches_what_vllms_own_parser_takes():
    """Every launch of profiles/vllm-gpu-mtp.toml, argv as the server backend builds it, parsed by the installed
    vLLM's own server parser (the CPU build's is the CUDA build's), its speculative config's keys all vLLM's."""
    from pathlib import Path

    from specbench.engines import ENGINES, Speculation
    from specbench.profile import load_profile

    profile = load_profile(Path(__file__).parent.parent / "profiles" / "vllm-gpu-mtp.toml")
    engine = ENGINES["vllm"]
    argvs = [[*engine.command(target=profile.target.model, host="127.0.0.1", port=8000, binary="python")[3:],
              *profile.server.extra_args]]
    for draft in profile.drafts:
        for gamma in profile.gammas(draft):
            speculation = Speculation(draft.method, gamma, None, draft.ngram_min, draft.ngram_max, draft.gamma_schedule)
            argvs.append([*argvs[0], *engine.speculation_args(speculation, version="0.32.0")])
    done = subprocess.run([str(VLLM_PYTHON), "-c", PARSE], input=json.dumps(argvs), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 + 3 + 1 + 3  # the baseline, mtp at 1-3, mtp by load, n-gram at 1-3
    assert all(line.startswith("XiaomiMiMo/MiMo-7B-RL True ") for line in lines)
    configs = [json.loads(line.split(" ", 2)[2]) for line in lines]
    assert {"method": "mtp", "num_speculative_tokens": 2} in configs
    assert {"method": "mtp", "num_speculative_tokens": 3,
            "num_speculative_tokens_per_batch_size": [[1, 8, 3], [9, 32, 1]]} in configs

"""An EAGLE-3 head the engines cannot be given is refused before anything launches: one line naming the draft's key
and the fix, exit 2, nothing written, the engine never started (a llama-server stand-in that records a launch).
The heads that run are tested against the real engines in test_eagle3_engines.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eagle3_tiny import tiny_target, untrained_head
from tiny import write_model_folder
from typer.testing import CliRunner

from specbench.cli import app
from specbench.heads.reference import PRESETS
from specbench.models.registry import builtin_gguf_path
from specbench.models.eagle3 import ARCHITECTURE, save_head
from specbench.profile.references import TRAINED_PRESETS

TARGET = "builtin:smollm2-135m-instruct"  # hidden 576, 30 decoder layers, 49152 ids


def _head_config(**changes) -> dict:
    return {"architectures": [ARCHITECTURE], "model_type": "llama", "num_hidden_layers": 1, "hidden_size": 576,
            "target_hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
            "num_key_value_heads": 3, "vocab_size": 49152, "draft_vocab_size": 2048,
            "eagle_aux_hidden_state_layer_ids": [2, 15, 27], "norm_before_residual": False, **changes}


def _config_folder(folder: Path, config: dict) -> str:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def _not_eagle3(tmp_path: Path) -> str:
    return str(write_model_folder(tmp_path / "plain", tiny_target()))


def _other_hidden_size(tmp_path: Path) -> str:
    return str(save_head(untrained_head(tiny_target()), tmp_path / "tiny-head"))


CASES = {
    "not an EAGLE-3 config": (_not_eagle3, 'config.json: architectures: ["LlamaForCausalLM"] is not an EAGLE-3 head'),
    "hidden size": (_other_hidden_size, "config.json: hidden_size: 64 does not match the target's hidden_size 576"),
    "vocabulary": (lambda tmp: _config_folder(tmp / "h", _head_config(vocab_size=32000)),
                   "config.json: vocab_size: 32000 does not match the target's vocab_size 49152"),
    "aux layers": (lambda tmp: _config_folder(tmp / "h", _head_config(eagle_aux_hidden_state_layer_ids=[2, 15, 40])),
                   "config.json: eagle_aux_hidden_state_layer_ids: [2, 15, 40] must be layers 0..30 of the target"),
    "a GGUF that is no head": (lambda tmp: str(builtin_gguf_path("smollm2-135m-instruct")),
                               "general.architecture: 'llama' is not an EAGLE-3 head"),
    "a hub id out of reach": (lambda tmp: "someone/some-eagle3-head", "cannot download the EAGLE-3 head "
                              "'someone/some-eagle3-head' from the Hugging Face hub"),
    "no converter": (lambda tmp: _config_folder(tmp / "h", _head_config()),
                     "its converter (convert_hf_to_gguf.py) was not found above"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_head_llama_cpp_cannot_be_given_is_refused_before_launch(tmp_path, monkeypatch, case):
    make, expected = CASES[case]
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPECBENCH_LLAMA_CONVERTER", raising=False)
    # a hub id: the real client, asking a hub out of reach here (or one without that repo) — one request, then the
    # error (the listing retried for 23 s; HF_HUB_OFFLINE set here did nothing, huggingface_hub reads it on import)
    binary = tmp_path / "bin" / "llama-server"  # answers --help and --version; anything else is a launch
    binary.parent.mkdir()
    binary.write_text('#!/bin/sh\ncase "$1" in --help|--version) exit 0;; esac\ntouch "$(dirname "$0")/launched"\n')
    binary.chmod(0o755)
    model = make(tmp_path)
    (tmp_path / "p.toml").write_text(f"""name = "p"
backend = "server"
[server]
engine = "llama.cpp"
binary = "{binary}"
[target]
model = "{TARGET}"
[[drafts]]
name = "head"
method = "eagle3"
model = "{model}"
[sweep]
gamma = [2]
temperature = [0.0]
[workload]
prompts = "builtin:mixed"
max_prompts = 2
""")
    result = CliRunner().invoke(app, ["run", "p.toml"])
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    line = line[line.index("error: "):]  # after the progress messages, the one error line
    assert line.startswith("error: p.toml: drafts[0].model: ") and expected in line, line
    assert not (tmp_path / "results").exists() and not (binary.parent / "launched").exists()


def test_every_trained_preset_a_profile_may_name_has_settings():
    assert tuple(PRESETS) == TRAINED_PRESETS
    assert PRESETS["quick"].max_prompts < PRESETS["default"].max_prompts

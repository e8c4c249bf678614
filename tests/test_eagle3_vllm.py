"""The head specbench saves is the head vLLM 0.32 loads: its own Eagle3LlamaForCausalLM, built for a tiny target
by vLLM's Python, takes every tensor through its load_weights (names mapped, q/k/v and gate/up fused) unchanged.
The four heads load in one vLLM process (one import of vLLM, ~30 s, instead of four)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from eagle3_tiny import AUX_LAYERS, tiny_target, untrained_head
from test_server_vllm import VLLM_PYTHON, needs_vllm
from tiny import write_model_folder

from specbench.models.eagle3 import save_head

SCRIPT = Path(__file__).parent / "fixtures" / "vllm_load_eagle3.py"
LAYER = "model.layers.0."


CASES = [(draft_vocab, norm_before_residual) for norm_before_residual in (False, True) for draft_vocab in (None, 32)]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> dict:
    """Per case (a reduced draft vocabulary of 32 or none, the norm before the residual or after), what vLLM's
    Python loaded: the four heads saved for one tiny target and loaded by one vLLM process."""
    folder = tmp_path_factory.mktemp("eagle3-vllm")
    target = tiny_target()
    write_model_folder(folder / "target", target)
    heads = []
    for index, (draft_vocab, norm_before_residual) in enumerate(CASES):
        head = untrained_head(target, draft_vocab=None if draft_vocab is None else torch.arange(0, 2 * draft_vocab, 2))
        head.config.norm_before_residual = norm_before_residual
        save_head(head, folder / f"head{index}")
        heads.append(str(folder / f"head{index}"))
    out = subprocess.run([str(VLLM_PYTHON), str(SCRIPT), str(folder / "target"), str(folder), *heads],
                         capture_output=True, text=True, timeout=600, cwd=folder, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"head"')]
    assert [line["head"] for line in lines] == heads
    return dict(zip(CASES, lines))


@needs_vllm
@pytest.mark.parametrize("draft_vocab", [None, 32])
@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_vllm_loads_the_saved_head(loaded, draft_vocab, norm_before_residual):
    loaded = loaded[(draft_vocab, norm_before_residual)]
    assert all(loaded["same"].values()), loaded["same"]
    parameters = loaded["parameters"]
    assert parameters["model.fc.weight"] == [64, 3 * 64]
    assert parameters[LAYER + "self_attn.qkv_proj.weight"] == [64 + 2 * 32, 2 * 64]  # q, k, v over embeds ⊕ hidden
    assert parameters[LAYER + "mlp.gate_up_proj.weight"] == [2 * 128, 64]
    assert loaded["has_own_lm_head"] == (draft_vocab is not None)
    if draft_vocab is not None:
        assert loaded["draft_vocab_size"] == 32 and parameters["draft_id_to_target_id"] == [32]
        assert parameters["lm_head.weight"] == [64, 64]  # 32 rows, padded by vLLM to a multiple of 64
    assert loaded["aux_layers"] == list(AUX_LAYERS)
    assert loaded["norm_before_residual"] == ("_norm_before_residual" if norm_before_residual
                                              else "_norm_after_residual")

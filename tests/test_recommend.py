"""Engine settings in recommendation.json: what a user pastes into vLLM, transformers and llama.cpp."""

from __future__ import annotations

import json

from specbench.models import builtin_gguf_path
from specbench.tune.recommend import engine_settings

TARGET, DRAFT = "builtin:qwen2.5-coder-1.5b-instruct", "builtin:qwen2.5-coder-0.5b-instruct"


def test_a_builtin_draft_is_its_hub_repository_for_vllm_and_transformers_and_its_gguf_for_llama_cpp():
    row = {"method": "draft", "gamma": 5, "draft_model": DRAFT, "draft_quantize": None}
    settings = engine_settings(row, target=TARGET, temperature=0.7, top_p=0.9)
    vllm = settings["vllm"]
    assert vllm["speculative_config"] == {"model": "Qwen/Qwen2.5-Coder-0.5B-Instruct", "num_speculative_tokens": 5}
    assert json.loads(vllm["args"][1]) == vllm["speculative_config"] and vllm["args"][0] == "--speculative-config"
    assert settings["transformers"]["generate_kwargs"] == {
        "do_sample": True, "temperature": 0.7, "top_p": 0.9, "assistant_model": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        "num_assistant_tokens": 5, "num_assistant_tokens_schedule": "constant"}
    args = settings["llama_cpp"]["server_args"]
    gguf = builtin_gguf_path("qwen2.5-coder-0.5b-instruct")
    assert args[args.index("-md") + 1] == (str(gguf) if gguf else "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    assert args[args.index("--draft-max") + 1] == "5" and args[-4:] == ["--temp", "0.7", "--top-p", "0.9"]
    assert any(note.startswith(f"{DRAFT} is Qwen/Qwen2.5-Coder-0.5B-Instruct; ") for note in settings["notes"])


def test_other_references_pass_through_and_ngram_maps_to_prompt_lookup():
    row = {"method": "ngram", "gamma": 3, "ngram_min": 1, "ngram_max": 4, "draft_model": None}
    settings = engine_settings(row, target="my-org/my-model", temperature=0.0, top_p=1.0)
    assert settings["vllm"]["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3,
                                                      "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    assert settings["transformers"]["generate_kwargs"] == {"do_sample": False, "prompt_lookup_num_tokens": 3,
                                                           "max_matching_ngram_size": 4}
    assert settings["llama_cpp"]["server_args"][:2] == ["-m", "my-org/my-model"]
    assert not any(" is " in note and "dequantised" in note for note in settings["notes"])
    no_speculation = engine_settings(None, target="my-org/my-model", temperature=0.0, top_p=1.0)
    assert no_speculation["vllm"] == {"speculative_config": None, "args": []}


def test_speculation_is_recommended_only_when_the_ci_clears_the_baseline():
    from specbench.tune.outputs import _measurably_faster

    assert not _measurably_faster({"speedup": 1.03, "speedup_ci_low": 0.99})  # faster on average, not measurably
    assert _measurably_faster({"speedup": 1.20, "speedup_ci_low": 1.05})
    assert _measurably_faster({"speedup": 1.20, "speedup_ci_low": float("nan")})  # no CI (one prompt): the speedup
    assert not _measurably_faster({"speedup": 0.90, "speedup_ci_low": None})

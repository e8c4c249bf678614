"""Engine settings in recommendation.json: what a user pastes into vLLM, SGLang, llama.cpp and transformers;
the serving engines' flags are the mapping the server backend launches them with (specbench.engines), and
llama.cpp's are named as the real binary's --help names them where one is installed (make engines)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from installed_engines import LLAMA_SERVER, needs_llama_server
from specbench.engines import ENGINES, Speculation
from specbench.models.registry import builtin_gguf_path
from specbench.tune.recommend import engine_settings, read_help

TARGET, DRAFT = "builtin:qwen2.5-coder-1.5b-instruct", "builtin:qwen2.5-coder-0.5b-instruct"


def test_a_builtin_draft_is_its_hub_repository_for_vllm_and_transformers_and_its_gguf_for_llama_cpp():
    row = {"method": "draft", "gamma": 5, "draft_model": DRAFT, "draft_quantize": None}
    settings = engine_settings(row, target=TARGET, temperature=0.7, top_p=0.9)
    vllm = settings["vllm"]
    assert vllm["speculative_config"] == {"method": "draft_model", "model": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
                                          "num_speculative_tokens": 5}
    assert json.loads(vllm["args"][1]) == vllm["speculative_config"] and vllm["args"][0] == "--speculative-config"
    assert settings["transformers"]["generate_kwargs"] == {
        "do_sample": True, "temperature": 0.7, "top_p": 0.9, "assistant_model": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        "num_assistant_tokens": 5, "num_assistant_tokens_schedule": "constant"}
    args = settings["llama_cpp"]["server_args"]
    gguf = builtin_gguf_path("qwen2.5-coder-0.5b-instruct")
    assert args[args.index("-md") + 1] == (str(gguf) if gguf else "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    assert args[args.index("--spec-type") + 1] == "draft-simple" and args[args.index("--spec-draft-n-max") + 1] == "5"
    assert settings["request"] == {"temperature": 0.7, "top_p": 0.9}  # per request, as specbench sent it
    assert settings["sglang"]["args"] == ENGINES["sglang"].speculation_args(
        Speculation("draft", 5, draft_model="Qwen/Qwen2.5-Coder-0.5B-Instruct"))
    assert any(note.startswith(f"{DRAFT} is Qwen/Qwen2.5-Coder-0.5B-Instruct; ") for note in settings["notes"])


def test_other_references_pass_through_and_ngram_maps_to_prompt_lookup():
    row = {"method": "ngram", "gamma": 4, "ngram_min": 1, "ngram_max": 4, "draft_model": None}
    settings = engine_settings(row, target="my-org/my-model", temperature=0.0, top_p=1.0)
    assert settings["vllm"]["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 4,
                                                      "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    assert settings["transformers"]["generate_kwargs"] == {"do_sample": False, "prompt_lookup_num_tokens": 4,
                                                           "max_matching_ngram_size": 4}
    assert settings["llama_cpp"]["server_args"] == ["-m", "my-org/my-model", "--spec-type", "ngram-simple",
                                                    "--spec-draft-n-max", "4", "--spec-ngram-simple-size-n", "4",
                                                    "--spec-ngram-simple-size-m", "4"]
    assert settings["request"] == {"temperature": 0.0}
    assert not any(" is " in note and "dequantised" in note for note in settings["notes"])
    assert not any("drafts only with a draft model" in note for note in settings["notes"])
    no_speculation = engine_settings(None, target="my-org/my-model", temperature=0.0, top_p=1.0)
    assert no_speculation["vllm"]["speculative_config"] is None and no_speculation["vllm"]["args"] == []
    assert no_speculation["llama_cpp"]["server_args"] == ["-m", "my-org/my-model"]


@pytest.mark.parametrize("row", [
    {"method": "ngram", "gamma": 4, "ngram_min": 1, "ngram_max": 3, "draft_model": None},
    {"method": "draft", "gamma": 5, "ngram_min": float("nan"), "ngram_max": float("nan"), "draft_model": DRAFT},
])
def test_the_serving_engines_settings_are_the_mapping_the_server_backend_launches_with(row):
    settings = engine_settings(row, target=TARGET, temperature=0.0, top_p=1.0)
    draft = "Qwen/Qwen2.5-Coder-0.5B-Instruct" if row["draft_model"] else None
    speculation = Speculation(row["method"], row["gamma"], draft, 1 if draft is None else None,
                              3 if draft is None else None)
    assert settings["vllm"]["speculative_config"] == ENGINES["vllm"].speculative_config(speculation)
    assert settings["vllm"]["args"] == ENGINES["vllm"].speculation_args(speculation)
    command = settings["vllm"]["command"]
    assert command[command.index("--model") + 1] == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert command[-2:] == settings["vllm"]["args"]


def test_a_speculation_the_engine_refuses_is_an_error_not_flags():
    row = {"method": "ngram", "gamma": 2, "ngram_min": 1, "ngram_max": 3, "draft_model": None}
    settings = engine_settings(row, target="m.gguf", temperature=0.0, top_p=1.0)
    assert settings["llama_cpp"] == {"error": "llama.cpp's ngram-simple drafts nothing when gamma (2) is below the "
                                              "n-gram size ngram_max (3); use gamma >= ngram_max"}
    assert "error" not in settings["vllm"]


@needs_llama_server
@pytest.mark.parametrize("row", [
    {"method": "ngram", "gamma": 4, "ngram_min": 1, "ngram_max": 3, "draft_model": None},
    {"method": "draft", "gamma": 5, "draft_model": DRAFT},
])
def test_every_llama_cpp_flag_recommended_is_one_the_real_binary_knows(row):
    help_text = read_help(str(LLAMA_SERVER))
    assert help_text and "--spec-type" in help_text
    settings = engine_settings(row, target=TARGET, temperature=0.0, top_p=1.0, llama_cpp_binary=str(LLAMA_SERVER),
                               llama_cpp_help=help_text)
    llama = settings["llama_cpp"]
    assert llama["command"][0] == str(LLAMA_SERVER)
    flags = [part for part in llama["command"] if part.startswith("-")]
    assert "--spec-type" in flags and all(flag in help_text for flag in flags)
    assert f"llama.cpp: flags as {LLAMA_SERVER} --help names them" in settings["notes"]


def test_speculation_is_recommended_only_when_the_ci_clears_the_baseline():
    from specbench.tune.outputs import _measurably_faster

    assert not _measurably_faster({"speedup": 1.03, "speedup_ci_low": 0.99})  # faster on average, not measurably
    assert _measurably_faster({"speedup": 1.20, "speedup_ci_low": 1.05})
    assert _measurably_faster({"speedup": 1.20, "speedup_ci_low": float("nan")})  # no CI (one prompt): the speedup
    assert not _measurably_faster({"speedup": 0.90, "speedup_ci_low": None})

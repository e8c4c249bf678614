"""`python -m specbench.bench` options (the measurement itself is `make bench`, not a test)."""

from __future__ import annotations

import pytest
import torch

from specbench.bench import MODEL, BenchConfig, draft_quantize, parse_args


def test_options_choose_the_model_device_and_dtype():
    assert parse_args([]) == BenchConfig()
    assert BenchConfig().model == MODEL and BenchConfig().device == "cpu" and BenchConfig().dtype == "float32"
    config = parse_args(["--model", "Qwen/Qwen2.5-0.5B-Instruct", "--device", "cuda", "--dtype", "bfloat16",
                         "--no-draft"])
    assert (config.model, config.device, config.dtype, config.draft) == (
        "Qwen/Qwen2.5-0.5B-Instruct", "cuda", "bfloat16", False)
    with pytest.raises(SystemExit):
        parse_args(["--dtype", "int4"])


def test_the_self_draft_is_int8_only_where_dynamic_quantisation_works():
    assert draft_quantize(torch.device("cpu"), torch.float32) == "int8"
    assert draft_quantize(torch.device("cpu"), torch.bfloat16) is None
    assert draft_quantize(torch.device("cuda"), torch.float32) is None

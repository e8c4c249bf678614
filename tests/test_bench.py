"""`python -m specbench.bench`: options, and the figures it derives from request rows (the measurement itself
is `make bench`, not a test)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from specbench import results, stats
from specbench.summary import predict
from specbench.bench import MODEL, BenchConfig, Measurement, draft_quantize, parse_args, summarize
from specbench.bench.render import render
from specbench.decoding.trace import StepRecord, Trace
from specbench.results import PointSpec
from specbench.workloads import Prompt


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


# --- figures from request rows (no model: hand-built traces) ------------------------------------


def _trace(steps: list[tuple[int | None, int]], *, step_ms: float, ttft_ms: float) -> Trace:
    records = [StepRecord(drafted=d, accepted=a, emitted=a + 1, draft_s=0.0 if d is not None else None,
                          verify_s=step_ms / 1e3 if d is not None else None) for d, a in steps]
    times = [ttft_ms / 1e3]
    for i, record in enumerate(records, start=1):
        times += [(ttft_ms + i * step_ms) / 1e3] * record.emitted
    return Trace(prompt_tokens=10, output_ids=tuple(range(len(times))), ttft_s=ttft_ms / 1e3,
                 token_times_s=tuple(times), steps=tuple(records), gamma=2)


def _measurement() -> Measurement:
    config = BenchConfig(prompts=2, gamma=2, repeats=2, draft=False)
    baseline = PointSpec.baseline(0.0, 1.0)
    ngram = PointSpec("ngram-g2-t0-p1", "ngram", "ngram", 2, 0.0, 1.0, ngram_min=1, ngram_max=3)
    steps = {"baseline": [(0, 0)] * 8, "ngram": [(2, 2), (2, 0), (2, 2), (0, 0)]}  # 8 decode tokens each
    rows = []
    for backend in ("native", "hf"):
        for spec in (baseline, ngram):
            for prompt in range(2):
                for repeat in range(2):
                    step_ms = {"native": 10.0, "hf": 12.0}[backend] * (1 + prompt) * (1.5 if repeat else 1.0)
                    recorded = [(d if backend == "native" else None, a) for d, a in steps[spec.method]]
                    trace = _trace(recorded, step_ms=step_ms, ttft_ms=5.0)
                    rows.append({"backend": backend, **results.request_row(
                        spec, point_key="k", prompt=Prompt(f"p{prompt}", "c", ()), repeat=repeat, seed=0, trace=trace)})
    return Measurement(config, "cpu", 1, (baseline, ngram), (10, 10), pd.DataFrame(rows), {})


def test_the_figures_come_from_each_prompts_fastest_repeat_through_results_and_stats():
    measurement = _measurement()
    summary = summarize(measurement)
    baseline, ngram = summary.methods
    # 4 of 6 drafted tokens accepted; one rejection, after which one drafted token was never judged
    assert (ngram.acceptance_rate, ngram.alpha) == (4 / 6, 4 / 5)
    fastest = measurement.requests[measurement.requests["repeat"] == 0]  # repeat 1 is 1.5x slower everywhere
    side = {(b, m): fastest[(fastest["backend"] == b) & (fastest["point_id"] == s.point_id)]
            for b in ("native", "hf") for m, s in zip(("baseline", "ngram"), measurement.specs)}
    per_prompt = {key: (rows["output_tokens"].to_numpy(float), rows["e2e_ms"].to_numpy(float))
                  for key, rows in side.items()}
    assert ngram.native.speedup.value == pytest.approx(
        stats.paired_bootstrap_speedup(*per_prompt["native", "ngram"], *per_prompt["native", "baseline"])[0])
    assert (ngram.native_over_hf.value, ngram.native_over_hf.low, ngram.native_over_hf.high) == pytest.approx(
        stats.paired_bootstrap_speedup_ratio((*per_prompt["native", "ngram"], *per_prompt["native", "baseline"]),
                                             (*per_prompt["hf", "ngram"], *per_prompt["hf", "baseline"])))
    # tokens/s ratio = HF milliseconds / native milliseconds (the same tokens)
    assert baseline.native_over_hf.value == pytest.approx((5 + 8 * 12 + 5 + 8 * 24) / (5 + 8 * 10 + 5 + 8 * 20))
    assert ngram.prediction == predict(side["native", "ngram"], side["native", "baseline"])
    assert ngram.prediction.model.drafted_share() == (0.25, 0.0, 0.75)
    assert ngram.native.mean_accepted_length == ngram.hf.mean_accepted_length == 2.0
    assert (ngram.identical, ngram.compared) == (4, 4) and summary.mismatches == ()
    assert 0.44 < summary.repeat_spread < 0.49  # repeat 1's steps took 1.5x as long; the 5 ms prefill did not


def test_the_tables_name_alpha_and_the_acceptance_rate_apart(capsys):
    render(summarize(_measurement()))
    out = capsys.readouterr().out
    assert "acceptance rate" in out and "α" in out and "predicted ÷ measured" in out
    assert "engine" not in out  # native and hf are backends


# --- make bench-compiled: eager, compiled and vLLM from request rows -----------------------------------------


def _compiled_rows() -> pd.DataFrame:
    """Three prompts, two repeats; per path a seconds-per-token for the baseline and for n-gram (a second repeat
    slower by 50 %, as a disturbed one is), the same 20 tokens; vLLM's n-gram output differs on prompt c."""
    per_token_s = {("eager", "baseline"): 0.050, ("eager", "ngram"): 0.040, ("compiled", "baseline"): 0.040,
                   ("compiled", "ngram"): 0.032, ("vllm", "baseline"): 0.050, ("vllm", "ngram"): 0.025}
    rows = []
    for (path, method), seconds in per_token_s.items():
        for prompt in ("a", "b", "c"):
            for repeat in (0, 1):
                sha = f"{prompt}-{path}" if path == "vllm" and method == "ngram" and prompt == "c" else prompt
                rows.append({"path": path, "method": method, "point_id": method, "prompt_id": prompt,
                             "repeat": repeat, "output_tokens": 20, "output_sha": sha,
                             "e2e_ms": 1e3 * 20 * seconds * (1.5 if repeat else 1.0)})
    return pd.DataFrame(rows)


def test_bench_compiled_ratios_come_from_the_fastest_repeats():
    from specbench.bench.compiled import identical
    from specbench.bench.compiled import summarize as summarize_compiled

    figures = summarize_compiled(_compiled_rows())
    expected = {"baseline tokens/s, compiled ÷ eager": 1.25, "ngram tokens/s, compiled ÷ eager": 1.25,
                "ngram speedup, eager": 1.25, "ngram speedup, compiled": 1.25, "ngram speedup, compiled ÷ eager": 1.0,
                "baseline tokens/s, compiled ÷ vLLM": 1.25, "baseline tokens/s, eager ÷ vLLM": 1.0,
                "ngram speedup, vLLM": 2.0, "ngram speedup, compiled ÷ vLLM": 0.625,
                "baseline tokens/s, compiled": 25.0, "ngram tokens/s, vllm": 40.0}
    for name, value in expected.items():
        assert figures[name][0] == pytest.approx(value), name
        assert figures[name][1] <= figures[name][0] <= figures[name][2]
    assert identical(_compiled_rows(), ("eager", "compiled"), "eager") == (24, 24)
    assert identical(_compiled_rows(), ("vllm",), "vllm") == (10, 12)
    without_vllm = summarize_compiled(_compiled_rows().query("path != 'vllm'"))
    assert not any("vLLM" in name or "vllm" in name for name in without_vllm)

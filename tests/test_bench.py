"""`python -m benches`: options, and the figures it derives from request rows (the measurement itself
is `make bench`, not a test)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from specbench.core import results, stats
from specbench.core.summary import predict
from benches import MODEL, BenchConfig, Measurement, draft_quantize, parse_args, summarize
from benches.render import render
from specbench.core.trace import StepRecord, Trace
from specbench.core.results import PointSpec
from specbench.workloads.prompts import Prompt


def test_options_choose_the_model_device_and_dtype(tmp_path):
    assert parse_args(["--no-vllm"]) == BenchConfig()
    assert parse_args(["--no-compile", "--no-vllm"]).compile is False
    python = tmp_path / "python"
    python.touch()
    assert parse_args(["--vllm", str(python)]).vllm == python
    assert parse_args(["--vllm", str(python), "--device", "cuda"]).vllm is None  # vLLM's CPU build: fp32 on a CPU
    with pytest.raises(SystemExit):
        parse_args(["--vllm", str(tmp_path / "missing")])
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


# --- native eager, native compiled, HF and vLLM side by side (hand-built rows) -----------------------------------


def _four_backends() -> Measurement:
    """Two prompts, two repeats (the second 1.5x slower); per (backend, method) a step time; vLLM's outputs are its
    own (another engine), its n-gram output on prompt p1 differs from its baseline's; the draft method was skipped
    on the compiled backend and on vLLM."""
    config = BenchConfig(prompts=2, gamma=2, repeats=2)
    baseline = PointSpec.baseline(0.0, 1.0)
    ngram = PointSpec("ngram-g2-t0-p1", "ngram", "ngram", 2, 0.0, 1.0, ngram_min=1, ngram_max=3)
    step_ms = {("native", "baseline"): 10.0, ("native", "ngram"): 10.0, ("compiled", "baseline"): 8.0,
               ("compiled", "ngram"): 9.0, ("hf", "baseline"): 12.0, ("hf", "ngram"): 12.0,
               ("vllm", "baseline"): 12.0, ("vllm", "ngram"): 7.0}
    steps = {"baseline": [(0, 0)] * 8, "ngram": [(2, 2), (2, 0), (2, 2), (0, 0)]}
    rows = []
    for (backend, method), ms in step_ms.items():
        spec = baseline if method == "baseline" else ngram
        for prompt in range(2):
            for repeat in range(2):
                recorded = [(d if backend in ("native", "compiled") else None, a) for d, a in steps[method]]
                trace = _trace(recorded, step_ms=ms * (1.5 if repeat else 1.0), ttft_ms=5.0)
                row = results.request_row(spec, point_key="k", prompt=Prompt(f"p{prompt}", "c", ()), repeat=repeat,
                                          seed=0, trace=trace)
                if backend == "vllm":
                    row["output_sha"] = f"vllm-{prompt}" if method == "baseline" or prompt == 0 else "other"
                rows.append({"backend": backend, **row})
    skipped = {("compiled", "self-int8-g2-t0-p1"): "draft self-int8 failed to compile",
               ("vllm", "self-int8-g2-t0-p1"): "vLLM has no int8 dynamically quantised self-draft"}
    return Measurement(config, "cpu", 1, (baseline, ngram), (10, 10), pd.DataFrame(rows), skipped)


def test_every_backend_side_by_side_with_the_ratios_the_bench_exists_for(capsys):
    measurement = _four_backends()
    assert measurement.backends == ("native", "compiled", "hf", "vllm")
    summary = summarize(measurement)
    ms = lambda step: 2 * (5 + 8 * step)  # noqa: E731 - both prompts' fastest repeats: 5 ms prefill, 8 steps each
    decode = lambda step: 2 * (5 + 4 * step)  # noqa: E731 - n-gram: the same 9 tokens in 4 steps
    tokens_per_s = {("native", "baseline"): 18 / ms(10), ("compiled", "baseline"): 18 / ms(8),
                    ("compiled", "ngram"): 18 / decode(9), ("vllm", "ngram"): 18 / decode(7)}
    for key, value in tokens_per_s.items():
        assert summary.paths[key].tokens_per_s == pytest.approx(1e3 * value), key
    ratios = dict(summary.ratios)
    expected = {
        "baseline tokens/s, native compiled ÷ native eager": ms(10) / ms(8),
        "baseline tokens/s, native compiled ÷ vLLM": ms(12) / ms(8),
        "baseline tokens/s, native eager ÷ vLLM": ms(12) / ms(10),
        "ngram tokens/s, native compiled ÷ vLLM": decode(7) / decode(9),
        "ngram speedup, native compiled ÷ native eager": (ms(8) / decode(9)) / (ms(10) / decode(10)),
        "ngram speedup, native compiled ÷ vLLM": (ms(8) / decode(9)) / (ms(12) / decode(7)),
    }
    for name, value in expected.items():
        assert ratios[name].value == pytest.approx(value), name
        assert ratios[name].low <= ratios[name].value <= ratios[name].high
    assert not any("HF" in name for name in ratios)  # HF against native: the methods' own comparison
    assert summary.mismatches == ("vllm ngram-g2-t0-p1, prompt 2, repeat 1", "vllm ngram-g2-t0-p1, prompt 2, repeat 2")
    render(summary)
    out = capsys.readouterr().out
    assert "baseline tokens/s, native compiled ÷ vLLM" in out and "skipped: draft self-int8 failed to compile" not in out
    assert "│ ngram    │ vLLM " in out


def test_without_vllm_nothing_is_compared_with_it():
    measurement = _four_backends()
    requests = measurement.requests[measurement.requests["backend"] != "vllm"]
    summary = summarize(Measurement(**{**measurement.__dict__, "requests": requests}))
    assert summary.mismatches == () and not any("vLLM" in name for name, _ in summary.ratios)
    assert ("vllm", "baseline") not in summary.paths


def test_a_skipped_cell_points_to_its_reason_under_the_table(capsys):
    """A reason (torch's compile error, say) is long: the table says `skipped [n]`, the reason follows it once."""
    measurement = _four_backends()
    ngram = measurement.specs[1]
    reason = "target failed to compile: " + "x" * 300
    requests = measurement.requests[~((measurement.requests["backend"] == "compiled")
                                      & (measurement.requests["point_id"] == ngram.point_id))]
    render(summarize(Measurement(**{**measurement.__dict__, "requests": requests,
                                    "skipped": {("compiled", ngram.point_id): reason}})))
    out = capsys.readouterr().out
    assert any(line.startswith("│ ngram    │ native compiled │") and "│ skipped [1] │" in line for line in out.splitlines())
    assert f"[1] {reason}" in out.replace("\n", "")

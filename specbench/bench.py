"""The native engine against the Hugging Face reference, side by side on the embedded model (`make bench`).

Both engines decode the same prompts with the same settings (greedy), interleaved request by request in
one process so that drift on a shared machine hits both alike. Reported: native baseline tokens/s over
HF `generate` tokens/s; for ngram (prompt lookup) and draft (an int8 copy of the target as its own draft),
the native speedup over the HF speedup, each relative to its own engine's baseline; beside each speedup the
analytic prediction from the measured acceptance rate and step costs; and whether every greedy output is
identical token for token. Each prompt's time is its fastest repeat (other processes only ever add time).

    python -m specbench.bench [--prompts 6] [--max-new-tokens 64] [--gamma 4] [--repeats 2]
                              [--model REF] [--device cuda] [--dtype bfloat16]

On a GPU, or in another dtype than float32, the draft is a second copy of the target in the same dtype (int8
dynamic quantisation needs float32 on a CPU).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from specbench import stats
from specbench.devices import device_name
from specbench.engine import BaselineProposer, DraftModelProposer, NgramProposer, StepRecord, Trace, generate
from specbench.engine.hf import hf_generate
from specbench.models import load_model
from specbench.workloads import encode_prompt, load_prompts

MODEL = "builtin:smollm2-135m-instruct"
PROMPTS = "builtin:mixed"
ENGINES = ("native", "hf")
HF_NAMES = {"baseline": "HF generate", "ngram": "HF prompt lookup", "draft": "HF assisted generation"}
WARMUP_TOKENS = 8
UNSTABLE_SPREAD = 0.05  # repeats of one request further apart than this: other processes disturbed the timing

Progress = Callable[[str], None] | None


@dataclass(frozen=True)
class BenchConfig:
    prompts: int = 6
    max_new_tokens: int = 64
    gamma: int = 4
    ngram_max: int = 3
    repeats: int = 2
    draft: bool = True  # also compare the draft method (int8 self-draft; on a GPU a same-dtype copy)
    model: str = MODEL
    device: str = "cpu"
    dtype: str = "float32"


@dataclass(frozen=True)
class Request:
    """One measured request: the source of truth every figure is derived from."""

    engine: str  # native | hf
    method: str  # baseline | ngram | draft
    prompt: int  # index into the prompt list
    repeat: int
    trace: Trace


@dataclass(frozen=True)
class Measurement:
    config: BenchConfig
    device: str
    threads: int
    prompt_tokens: tuple[int, ...]
    requests: tuple[Request, ...]
    skipped: dict[tuple[str, str], str]  # (engine, method) -> why it was not measured


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float


@dataclass(frozen=True)
class EngineFigures:
    tokens_per_s: float
    tokens_per_step: float  # mean accepted length, bonus token included
    speedup: Interval | None  # over the same engine's baseline; None for the baseline itself


@dataclass(frozen=True)
class MethodComparison:
    method: str
    native: EngineFigures
    hf: EngineFigures | None  # None when HF could not run the method
    hf_skipped: str | None
    native_over_hf: Interval | None  # baseline: tokens/s ratio; other methods: ratio of speedups
    acceptance_rate: float | None  # native: the per-token alpha, accepted / (accepted + rejections)
    expected_tokens_per_step: float | None  # (1 - a^(g+1)) / (1 - a)
    draft_ms_per_token: float | None
    verify_ms: float | None  # mean native time to verify gamma + 1 tokens
    predicted_speedup: float | None
    identical: int  # requests whose native and HF outputs equal the native baseline's
    compared: int


@dataclass(frozen=True)
class BenchSummary:
    measurement: Measurement
    target_ms_per_token: float  # native baseline: mean time of a 1-token target step
    methods: tuple[MethodComparison, ...]
    mismatches: tuple[str, ...]
    repeat_spread: float | None  # median over (engine, method, prompt) of slowest / fastest repeat - 1


# --- measure ------------------------------------------------------------------------------------


def measure(config: BenchConfig, *, progress: Progress = None) -> Measurement:
    """Load the embedded model (and its int8 copy as a draft), warm every engine up, then run each prompt
    through every (method, engine) pair, alternating which engine goes first."""
    device = torch.device(config.device)
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(threads)
    dtype = getattr(torch, config.dtype)
    _report(progress, f"loading {config.model}")
    target = load_model(config.model, device=device, dtype=dtype)
    draft = (load_model(config.model, device=device, dtype=dtype, quantize=draft_quantize(device, dtype)).model
             if config.draft else None)
    prompt_ids = [encode_prompt(target.tokenizer, p) for p in load_prompts(PROMPTS, max_prompts=config.prompts)]
    eos = [target.tokenizer.eos_token_id]
    vocab_size = target.model.get_output_embeddings().weight.shape[0]
    methods = ("baseline", "ngram", "draft") if config.draft else ("baseline", "ngram")

    def run(engine: str, method: str, ids: list[int], max_new_tokens: int) -> Trace:
        settings = dict(gamma=config.gamma, temperature=0.0, max_new_tokens=max_new_tokens, eos_token_ids=eos)
        if engine == "hf":
            return hf_generate(target.model, ids, method=method, draft=draft, ngram_max=config.ngram_max, **settings)
        proposer = {
            "baseline": lambda: BaselineProposer(device),
            "ngram": lambda: NgramProposer(ngram_min=1, ngram_max=config.ngram_max, device=device),
            "draft": lambda: DraftModelProposer(draft, vocab_size=vocab_size, device=device),
        }[method]()
        return generate(target.model, proposer, ids, **settings)

    skipped: dict[tuple[str, str], str] = {}
    if draft is not None and getattr(draft, "generation_config", None) is None:
        skipped["hf", "draft"] = "the int8 draft has no generation_config"
    _report(progress, "warming up")
    for method in methods:
        for engine in ENGINES:
            if (engine, method) in skipped:
                continue
            try:
                run(engine, method, prompt_ids[0], WARMUP_TOKENS)
            except (ValueError, TypeError, AttributeError, RuntimeError, NotImplementedError) as error:
                if engine == "native":
                    raise
                skipped[engine, method] = f"{type(error).__name__}: {error}".splitlines()[0]

    requests: list[Request] = []
    for repeat in range(config.repeats):
        for prompt, ids in enumerate(prompt_ids):
            _report(progress, f"repeat {repeat + 1}/{config.repeats}, prompt {prompt + 1}/{len(prompt_ids)}")
            order = ENGINES if (prompt + repeat) % 2 == 0 else ENGINES[::-1]
            for method in methods:
                for engine in order:
                    if (engine, method) not in skipped:
                        trace = run(engine, method, ids, config.max_new_tokens)
                        requests.append(Request(engine, method, prompt, repeat, trace))
    return Measurement(config, device_name(device), threads, tuple(len(ids) for ids in prompt_ids),
                       tuple(requests), skipped)


def draft_quantize(device: torch.device, dtype: torch.dtype) -> str | None:
    """The self-draft is an int8 copy where dynamic quantisation works (float32 on a CPU), else a plain copy."""
    return "int8" if device.type == "cpu" and dtype == torch.float32 else None


def _report(progress: Progress, message: str) -> None:
    if progress is not None:
        progress(message)


# --- summarize ----------------------------------------------------------------------------------


def summarize(measurement: Measurement) -> BenchSummary:
    requests = measurement.requests
    gamma = measurement.config.gamma
    n_prompts = len(measurement.prompt_tokens)
    native_baseline = _select(requests, "native", "baseline")
    target_s = float(np.mean([s.verify_s for r in native_baseline for s in r.trace.steps]))  # 1-token steps
    baseline_ids = {(r.prompt, r.repeat): r.trace.output_ids for r in native_baseline}

    mismatches = [
        f"{r.engine} {r.method}, prompt {r.prompt + 1}, repeat {r.repeat + 1}"
        for r in requests if r.trace.output_ids != baseline_ids[r.prompt, r.repeat]
    ]
    methods = sorted({r.method for r in requests}, key=("baseline", "ngram", "draft").index)
    comparisons = []
    for method in methods:
        native = _select(requests, "native", method)
        hf_skipped = measurement.skipped.get(("hf", method))
        hf = _select(requests, "hf", method) if hf_skipped is None else []
        per_prompt = {
            engine: {m: _per_prompt(_select(requests, engine, m), n_prompts) for m in ("baseline", method)}
            for engine in ENGINES
        }
        if method == "baseline":
            native_over_hf = Interval(*stats.paired_bootstrap_speedup(*per_prompt["native"]["baseline"],
                                                                     *per_prompt["hf"]["baseline"]))
        else:
            native_over_hf = None if hf_skipped else _ratio_of_speedups(per_prompt)

        alpha, draft_s, verify_s = _step_costs([s for r in native for s in r.trace.steps], gamma=gamma)
        predicted = None
        if alpha is not None and verify_s is not None:
            predicted = stats.predicted_speedup(alpha=alpha, gamma=gamma, draft_s_per_token=draft_s,
                                                verify_s=verify_s, target_s_per_token=target_s)
        hf_ids = {(r.prompt, r.repeat): r.trace.output_ids for r in hf}
        pair_ok = sum(
            1 for r in native
            if r.trace.output_ids == baseline_ids[r.prompt, r.repeat]
            and hf_ids.get((r.prompt, r.repeat), r.trace.output_ids) == r.trace.output_ids
        )
        comparisons.append(MethodComparison(
            method=method,
            native=_engine_figures(native, per_prompt["native"], method),
            hf=_engine_figures(hf, per_prompt["hf"], method) if hf else None,
            hf_skipped=hf_skipped,
            native_over_hf=native_over_hf,
            acceptance_rate=alpha,
            expected_tokens_per_step=stats.expected_tokens_per_step(alpha, gamma) if alpha is not None else None,
            draft_ms_per_token=draft_s * 1e3 if draft_s is not None else None,
            verify_ms=verify_s * 1e3 if verify_s is not None else None,
            predicted_speedup=predicted,
            identical=pair_ok,
            compared=len(native),
        ))
    return BenchSummary(measurement, target_s * 1e3, tuple(comparisons), tuple(mismatches),
                        _repeat_spread(requests))


def _step_costs(steps: list[StepRecord], *, gamma: int) -> tuple[float | None, float | None, float | None]:
    """(per-token acceptance alpha = accepted / (accepted + rejections), draft seconds per drafted token, mean seconds to verify gamma + 1 tokens) of a
    method's native steps; all None when nothing was drafted (the baseline)."""
    drafted = sum(s.drafted for s in steps)
    if not drafted:
        return None, None, None
    full = [s.verify_s for s in steps if s.drafted == gamma]
    accepted = sum(s.accepted for s in steps)
    judged = accepted + sum(1 for s in steps if s.accepted < s.drafted)  # tokens after a rejection are never judged
    alpha = accepted / judged if judged else None  # the per-token alpha of the analytic model
    return alpha, sum(s.draft_s for s in steps) / drafted, float(np.mean(full)) if full else None


def _repeat_spread(requests: tuple[Request, ...]) -> float | None:
    """Median of (slowest / fastest - 1) over the repeats of each (engine, method, prompt); None for 1 repeat."""
    times: dict[tuple[str, str, int], list[float]] = {}
    for r in requests:
        times.setdefault((r.engine, r.method, r.prompt), []).append(r.trace.e2e_s)
    spreads = [max(t) / min(t) - 1 for t in times.values() if len(t) > 1]
    return float(np.median(spreads)) if spreads else None


def _select(requests: tuple[Request, ...], engine: str, method: str) -> list[Request]:
    return [r for r in requests if r.engine == engine and r.method == method]


def _per_prompt(requests: list[Request], n_prompts: int) -> tuple[np.ndarray, np.ndarray]:
    """Output tokens [P] and seconds [P] of each prompt's fastest repeat: other processes on a shared
    machine only ever add time, so the fastest repeat is the least disturbed one."""
    tokens, seconds = np.zeros(n_prompts), np.full(n_prompts, np.inf)
    for r in requests:
        if r.trace.e2e_s < seconds[r.prompt]:
            tokens[r.prompt], seconds[r.prompt] = r.trace.output_tokens, r.trace.e2e_s
    return tokens, seconds


def _engine_figures(requests: list[Request], per_prompt: dict, method: str) -> EngineFigures:
    steps = [s for r in requests for s in r.trace.steps]
    speedup = None
    if method != "baseline":
        speedup = Interval(*stats.paired_bootstrap_speedup(*per_prompt[method], *per_prompt["baseline"]))
    return EngineFigures(
        tokens_per_s=stats.throughput(*per_prompt[method]),
        tokens_per_step=sum(s.emitted for s in steps) / len(steps),
        speedup=speedup,
    )


def _ratio_of_speedups(per_prompt: dict, *, n_resamples: int = 2000, seed: int = 0) -> Interval:
    """(native method / native baseline) / (HF method / HF baseline) throughputs, with a percentile
    bootstrap CI that resamples prompts, keeping each prompt's four measurements together."""
    (method,) = set(per_prompt["native"]) - {"baseline"}
    sides = [per_prompt[engine][m] for engine in ENGINES for m in (method, "baseline")]  # 4 x (tokens, s)

    def ratio(picks: np.ndarray) -> np.ndarray:
        rates = [tokens[picks].sum(-1) / seconds[picks].sum(-1) for tokens, seconds in sides]
        return (rates[0] / rates[1]) / (rates[2] / rates[3])

    n = len(sides[0][0])
    picks = np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))  # [B, P]
    low, high = np.percentile(ratio(picks), [2.5, 97.5])
    return Interval(float(ratio(np.arange(n))), float(low), float(high))


# --- render -------------------------------------------------------------------------------------


def render(summary: BenchSummary) -> None:
    m, config = summary.measurement, summary.measurement.config
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 120)
    console.print(
        f"{m.config.model} {m.config.dtype} on {m.device}, {m.threads} threads; {len(m.prompt_tokens)} prompts "
        f"from {PROMPTS} ({min(m.prompt_tokens)}-{max(m.prompt_tokens)} tokens); "
        f"max_new_tokens {config.max_new_tokens}, "
        f"gamma {config.gamma}, ngram_max {config.ngram_max}, greedy; engines interleaved per prompt, "
        f"fastest of {config.repeats} repeat(s) per prompt"
    )
    speed = Table(title="throughput: native engine vs Hugging Face")
    for column in ("method", "native tok/s", "HF tok/s", "native speedup", "HF speedup", "native ÷ HF [95% CI]",
                   "greedy identical"):
        speed.add_column(column, justify="left" if column == "method" else "right")
    model = Table(title="analytic model (native traces) beside the measured speedup")
    for column in ("method", "α", "tok/step native", "tok/step HF", "E\\[tok/step]", "draft ms/tok",
                   f"verify {config.gamma + 1} tok ms", "predicted", "measured native", "measured HF"):
        model.add_column(column, justify="left" if column == "method" else "right")
    for c in summary.methods:
        hf = c.hf
        speed.add_row(
            c.method, f"{c.native.tokens_per_s:.2f}", f"{hf.tokens_per_s:.2f}" if hf else "skipped",
            _speedup(c.native.speedup), _speedup(hf.speedup) if hf else "-", _interval(c.native_over_hf),
            f"{c.identical}/{c.compared}",
        )
        if c.method != "baseline":
            model.add_row(
                c.method, _number(c.acceptance_rate), f"{c.native.tokens_per_step:.2f}",
                f"{hf.tokens_per_step:.2f}" if hf else "-", _number(c.expected_tokens_per_step, ".2f"),
                _number(c.draft_ms_per_token, ".2f"), _number(c.verify_ms, ".1f"),
                _number(c.predicted_speedup), _speedup(c.native.speedup), _speedup(hf.speedup) if hf else "-",
            )
    console.print(speed)
    console.print(model)
    console.print(
        f"target step (1 token, native baseline): {summary.target_ms_per_token:.1f} ms. predicted = E\\[tok/step] / "
        "((gamma * draft ms/tok + verify ms) / target step ms), E\\[tok/step] = (1 - α^(gamma+1)) / (1 - α); "
        "it assumes gamma tokens drafted every step (ngram drafts fewer, or none, when no n-gram matches)"
    )
    for c in summary.methods:
        if c.method == "baseline":
            console.print("[bold]native baseline tokens/s ÷ HF generate tokens/s = "
                          f"{_interval(c.native_over_hf)}[/bold]")
        elif c.hf is None:
            console.print(f"[bold]native {c.method} speedup {_speedup(c.native.speedup)}; {HF_NAMES[c.method]} "
                          f"skipped: {c.hf_skipped}[/bold]")
        else:
            console.print(
                f"[bold]native {c.method} speedup ÷ {HF_NAMES[c.method]} speedup = {_interval(c.native_over_hf)}"
                f"[/bold] ({_speedup(c.native.speedup)} vs {_speedup(c.hf.speedup)}; predicted "
                f"{_number(c.predicted_speedup, '.2f')}x)"
            )
    if summary.repeat_spread is not None and summary.repeat_spread > UNSTABLE_SPREAD:
        console.print(f"[bold yellow]unstable timing: repeats of the same request differ by "
                      f"{summary.repeat_spread:.0%} (median); another process was probably using the CPU. "
                      "Rerun on a quiet machine[/bold yellow]")
    elif summary.repeat_spread is not None:
        console.print(f"timing stable: repeats of the same request differ by {summary.repeat_spread:.1%} (median)")
    if summary.mismatches:
        console.print(f"[bold red]greedy outputs that differ from the native baseline: {'; '.join(summary.mismatches)}"
                      "[/bold red]")
    else:
        total = sum(c.compared for c in summary.methods)
        console.print(f"[bold]greedy outputs identical token for token: all {total} native requests equal the native "
                      "baseline and their HF twins[/bold]")


def _speedup(interval: Interval | None) -> str:
    return "-" if interval is None else f"{interval.value:.2f}x"


def _interval(interval: Interval | None) -> str:
    return "-" if interval is None else f"{interval.value:.3f} [{interval.low:.3f}, {interval.high:.3f}]"


def _number(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


# --- command line -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> BenchConfig:
    parser = argparse.ArgumentParser(prog="python -m specbench.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=6, help=f"prompts from {PROMPTS} (default 6)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per request (default 64)")
    parser.add_argument("--gamma", type=int, default=4, help="drafted tokens per step (default 4)")
    parser.add_argument("--ngram-max", type=int, default=3, help="longest n-gram prompt lookup matches (default 3)")
    parser.add_argument("--repeats", type=int, default=2, help="passes over the prompts (default 2)")
    parser.add_argument("--no-draft", action="store_true", help="skip the draft method (int8 self-draft)")
    parser.add_argument("--model", default=MODEL, help=f"the target (default {MODEL}); any specbench model reference")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args(argv)
    for name in ("prompts", "max_new_tokens", "gamma", "ngram_max", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(args, name)})")
    return BenchConfig(prompts=args.prompts, max_new_tokens=args.max_new_tokens, gamma=args.gamma,
                       ngram_max=args.ngram_max, repeats=args.repeats, draft=not args.no_draft, model=args.model,
                       device=args.device, dtype=args.dtype)


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    measurement = measure(config, progress=lambda message: print(f"[bench] {message}", file=sys.stderr, flush=True))
    render(summarize(measurement))


if __name__ == "__main__":
    main()

"""The bench's terminal output (the only bench module that imports rich)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from benches.measure import PROMPTS
from benches.summary import NAMES, BenchSummary, Interval, MethodComparison

HF_NAMES = {"baseline": "HF generate", "ngram": "HF prompt lookup", "draft": "HF assisted generation"}
UNSTABLE_SPREAD = 0.05  # repeats of one request further apart than this: other processes disturbed the timing


def render(summary: BenchSummary) -> None:
    m, config = summary.measurement, summary.measurement.config
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 140)
    console.print(
        f"{config.model} {config.dtype} on {m.device}, {m.threads} threads; {len(m.prompt_tokens)} prompts "
        f"from {PROMPTS} ({min(m.prompt_tokens)}-{max(m.prompt_tokens)} tokens); "
        f"max_new_tokens {config.max_new_tokens}, gamma {config.gamma}, ngram_max {config.ngram_max}, greedy; "
        f"in-process backends interleaved per prompt, fastest of {config.repeats} repeat(s) per prompt"
    )
    _print_backends(console, summary)
    speed = _table("throughput: native backend vs Hugging Face",
                   ("method", "native tok/s", "HF tok/s", "native speedup", "HF speedup", "native ÷ HF [95% CI]",
                    "greedy identical"))
    model = _table("analytic model of the native requests",
                   ("method", "acceptance rate", "α", "drafted/step", "E\\[tok/step]", "tok/step", "tok/step HF",
                    "draft ms/tok", "verify ms/step", "TTFT ms (baseline)"))
    versus = _table("predicted beside measured speedup",
                    ("method", "predicted decode", "predicted", "measured", "predicted ÷ measured", "measured HF"))
    for c in summary.methods:
        hf = c.hf
        speed.add_row(
            c.method, f"{c.native.tokens_per_s:.2f}", f"{hf.tokens_per_s:.2f}" if hf else "skipped",
            _speedup(c.native.speedup), _speedup(hf.speedup) if hf else "-", _interval(c.native_over_hf),
            f"{c.identical}/{c.compared}",
        )
        p = c.prediction
        if c.method == "baseline" or p is None:
            continue
        model.add_row(
            c.method, _number(c.acceptance_rate), _number(c.alpha), f"{p.model.drafted_per_step():.2f}",
            f"{p.tokens_per_step:.2f}", f"{c.native.mean_accepted_length:.2f}",
            f"{hf.mean_accepted_length:.2f}" if hf else "-", f"{p.draft_ms_per_token:.2f}",
            f"{p.verify_ms_per_step:.1f}", f"{p.ttft_ms:.0f} ({p.baseline_ttft_ms:.0f})",
        )
        versus.add_row(c.method, f"{p.decode_speedup:.2f}x", f"{p.speedup:.2f}x", _speedup(c.native.speedup),
                       _number(c.predicted_over_measured), _speedup(hf.speedup) if hf else "-")
    console.print(speed)
    console.print(model)
    console.print(versus)
    console.print(
        f"target step (1 token, native baseline): {_number(summary.target_ms_per_token, '.1f')} ms. "
        "E\\[tok/step] = 1 + Σ_k P(drafted tokens 0..k accepted), from the per-position counts the requests "
        "recorded (n-gram lookup drafts fewer than gamma tokens, or none, when nothing matches); "
        "predicted decode = E\\[tok/step] / ((draft ms/tok × drafted/step + verify ms/step) / target step ms); "
        "predicted adds each side's prefill (TTFT) per request, as the measured speedup does. "
        "acceptance rate = accepted / drafted; α = accepted / (accepted + rejections)."
    )
    for c in summary.methods:
        console.print(_headline(c))
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
        console.print(f"[bold]greedy outputs identical token for token: all {len(m.requests)} requests equal the native "
                      "baseline's (vLLM's: vLLM's baseline)[/bold]")


def _print_backends(console: Console, summary: BenchSummary) -> None:
    """Every backend side by side (tokens/s and speedup per method), the ratios with CIs, what compiling cost."""
    m = summary.measurement
    backends = m.backends
    table = _table("every backend side by side (speedup: over the same backend's baseline)",
                   ("method", "backend", "tok/s", "speedup", "tok/step"))
    reasons: list[str] = []  # why a cell was skipped, once each, printed under the table (they can be long)
    for spec in m.specs:
        for backend in backends:
            cell = summary.paths.get((backend, spec.method))
            if cell is None:
                reason = m.skipped.get((backend, spec.point_id), "not measured")
                if reason not in reasons:
                    reasons.append(reason)
                table.add_row(spec.method, NAMES[backend], "-", f"skipped [{reasons.index(reason) + 1}]", "-")
            else:
                table.add_row(spec.method, NAMES[backend], f"{cell.tokens_per_s:.2f}", _speedup(cell.speedup),
                              _number(cell.mean_accepted_length, ".2f"))
    console.print(table)
    for number, reason in enumerate(reasons, 1):
        console.print(f"[{number}] {escape(reason)}", highlight=False)
    for name, interval in summary.ratios:
        console.print(f"{name}: {_interval(interval)}")
    if m.compile is not None:
        models = m.compile.get("models", {})
        spent = ", ".join(f"{role} {entry['compile_s']:.0f} s ({entry['mode']})" for role, entry in models.items())
        console.print(f"native compiled: compilation before the first request, not timed: {spent or 'none'}"
                      + (f"; fell back: {m.compile['fallback']}" if m.compile.get("fallback") else ""))


def _headline(c: MethodComparison) -> str:
    if c.method == "baseline":
        return f"[bold]native baseline tokens/s ÷ HF generate tokens/s = {_interval(c.native_over_hf)}[/bold]"
    predicted = (f"; predicted {c.prediction.speedup:.2f}x, predicted ÷ measured {_number(c.predicted_over_measured)}"
                 if c.prediction is not None else "")
    if c.hf is None or c.native_over_hf is None:
        return (f"[bold]native {c.method} speedup {_speedup(c.native.speedup)}{predicted}; {HF_NAMES[c.method]} "
                f"skipped: {c.hf_skipped}[/bold]")
    return (f"[bold]native {c.method} speedup ÷ {HF_NAMES[c.method]} speedup = {_interval(c.native_over_hf)}"
            f"[/bold] ({_speedup(c.native.speedup)} vs {_speedup(c.hf.speedup)}{predicted})")


def _table(title: str, columns: tuple[str, ...]) -> Table:
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="left" if column in ("method", "backend") else "right")
    return table


def _speedup(interval: Interval | None) -> str:
    return "-" if interval is None else f"{interval.value:.2f}x"


def _interval(interval: Interval | None) -> str:
    if interval is None:
        return "-"
    if interval.low is None or interval.high is None:
        return f"{interval.value:.3f}"
    return f"{interval.value:.3f} [{interval.low:.3f}, {interval.high:.3f}]"


def _number(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)

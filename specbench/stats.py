"""Statistics over raw per-request measurements: percentiles, paired bootstrap speedups, the analytic model.

Everything a summary reports is derived here, from the per-request rows; nothing is tracked in parallel.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (linear interpolation), None for no values."""
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def throughput(output_tokens: Sequence[int], e2e_s: Sequence[float]) -> float:
    """Tokens per second over requests run one after another: total tokens / total time."""
    total_s = float(np.sum(e2e_s))
    return float(np.sum(output_tokens)) / total_s if total_s > 0 else float("nan")


def paired_bootstrap_speedup(
    point_tokens: np.ndarray,
    point_s: np.ndarray,
    baseline_tokens: np.ndarray,
    baseline_s: np.ndarray,
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Speedup = throughput(point) / throughput(baseline) on the same prompts, with a percentile
    bootstrap CI that resamples prompts (pairs), keeping each prompt's point and baseline together.

    Inputs are per prompt (repeats already summed): tokens [P] and seconds [P] for each side.
    """
    if not (len(point_tokens) == len(point_s) == len(baseline_tokens) == len(baseline_s)) or len(point_s) == 0:
        raise ValueError("paired bootstrap needs the same non-empty set of prompts on both sides")
    speedup = (point_tokens.sum() / point_s.sum()) / (baseline_tokens.sum() / baseline_s.sum())
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(point_s), size=(n_resamples, len(point_s)))  # [B, P]
    resampled = (point_tokens[picks].sum(1) / point_s[picks].sum(1)) / (
        baseline_tokens[picks].sum(1) / baseline_s[picks].sum(1)
    )
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(resampled, [tail, 100 - tail])
    return float(speedup), float(low), float(high)


def expected_tokens_per_step(alpha: float, gamma: float) -> float:
    """E[tokens emitted per target step] = (1 - alpha^(gamma+1)) / (1 - alpha) (Leviathan et al. 2023)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(
    *, alpha: float, gamma: float, draft_s_per_token: float, verify_s: float, target_s_per_token: float
) -> float:
    """The analytic speedup: expected tokens per step over the step's cost relative to one autoregressive
    target step. Leviathan et al. use gamma * c + 1 with c = draft / target time per token; here the
    verify term is the measured time of verifying gamma + 1 tokens instead of one target step."""
    relative_cost = (gamma * draft_s_per_token + verify_s) / target_s_per_token
    return expected_tokens_per_step(alpha, gamma) / relative_cost

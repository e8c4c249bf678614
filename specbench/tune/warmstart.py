"""The analytic warm start: one calibration point per draft at the largest gamma measures how often
each draft position is accepted and what drafting and verifying cost; from these the speedup of every
smaller gamma is predicted, and the best predictions are tried first.

Leviathan et al. (2023) predict E[tokens per step] = (1 - a^(g+1)) / (1 - a) from one acceptance rate a.
Measured per-position acceptance refines it: E = 1 + sum_{i<g} P(drafted tokens 0..i all accepted),
which is the same number when acceptance is geometric. The step's cost is the draft time of the tokens
drafted plus the time of verifying them and the bonus token, relative to the baseline's time per token.
The verify time of k tokens is the baseline's one-token step times the ratio a timing of the target's
forward pass at k = 1..g_max + 1 measured (specbench.engine.costs: not linear in k on a CPU), weighted
by how many tokens the draft proposed per step (n-grams often propose fewer than gamma, or none).
Without that timing (a replay) it is interpolated linearly between the baseline's one-token step and
the calibration's measured step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Calibration:
    gamma: int  # the gamma it was measured at (the space's largest)
    accepted_per_step: tuple[float, ...]  # [gamma]: P(position i accepted) = accepted_per_position[i] / steps
    drafted_per_step: tuple[float, ...]  # [gamma]: drafted_per_position[i] / steps (< 1 when n-grams miss)
    draft_ms_per_token: float
    verify_ms_per_step: float  # verifying gamma + 1 tokens
    target_ms_per_token: float  # the baseline's time per step (one token)
    verify_ms_by_tokens: tuple[float, ...] = ()  # [k - 1]: a forward pass of k tokens, k = 1..gamma + 1

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        return cls(**{**data, "accepted_per_step": tuple(data["accepted_per_step"]),
                      "drafted_per_step": tuple(data["drafted_per_step"]),
                      "verify_ms_by_tokens": tuple(data.get("verify_ms_by_tokens") or ())})


def calibrate(rows: pd.DataFrame, baseline_rows: pd.DataFrame, *, gamma: int,
              verify_ms_by_tokens: tuple[float, ...] = ()) -> Calibration | None:
    """From a calibration point's request rows; None when the backend does not record what it drafted
    (HF generate) or the point took no steps."""
    steps = rows["target_steps"].sum()
    if not steps or rows["drafted_tokens"].isna().any() or rows["verify_ms"].isna().any():
        return None
    accepted = _sum_lists(rows["accepted_per_position"], gamma)
    drafted = _sum_lists(rows["drafted_per_position"], gamma)
    drafted_tokens = rows["drafted_tokens"].sum()
    return Calibration(
        gamma=gamma,
        accepted_per_step=tuple(float(a) / steps for a in accepted),
        drafted_per_step=tuple(float(d) / steps for d in drafted),
        draft_ms_per_token=float(rows["draft_ms"].sum() / drafted_tokens) if drafted_tokens else 0.0,
        verify_ms_per_step=float(rows["verify_ms"].sum() / steps),
        target_ms_per_token=float(baseline_rows["verify_ms"].sum() / baseline_rows["target_steps"].sum()),
        verify_ms_by_tokens=tuple(float(v) for v in verify_ms_by_tokens),
    )


def expected_tokens_per_step(calibration: Calibration, gamma: int) -> float:
    """1 (the bonus or correction token) + the expected accepted drafted tokens at speculation length gamma."""
    return 1.0 + sum(calibration.accepted_per_step[:gamma])


def predicted_speedup(calibration: Calibration, gamma: int) -> float:
    if not 1 <= gamma <= calibration.gamma:
        raise ValueError(f"gamma {gamma} is outside the calibrated 1..{calibration.gamma}")
    one = calibration.target_ms_per_token
    draft_ms = calibration.draft_ms_per_token * sum(calibration.drafted_per_step[:gamma])
    return expected_tokens_per_step(calibration, gamma) / ((draft_ms + verify_ms(calibration, gamma)) / one)


def verify_ms(calibration: Calibration, gamma: int) -> float:
    """The expected time of one verification at speculation length gamma."""
    one = calibration.target_ms_per_token
    curve = calibration.verify_ms_by_tokens
    if len(curve) < gamma + 1:  # not timed (a replay): linear between 1 and gamma_max + 1 tokens
        return one + (calibration.verify_ms_per_step - one) * gamma / calibration.gamma
    # P(k tokens drafted) at gamma, from P(at least i + 1 drafted) = drafted_per_step[i]; k = gamma when
    # the draft had more to offer
    at_least = [1.0, *calibration.drafted_per_step[:gamma], 0.0]
    share = [max(at_least[k] - at_least[k + 1], 0.0) for k in range(gamma)] + [at_least[gamma]]
    return one * sum(p * curve[k] / curve[0] for k, p in enumerate(share)) / (sum(share) or 1.0)


def _sum_lists(column: pd.Series, width: int) -> np.ndarray:
    total = np.zeros(width)
    for values in column:
        if values is not None:
            values = np.asarray(values, dtype=float)[:width]
            total[: len(values)] += values
    return total

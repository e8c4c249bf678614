"""The analytic warm start: one calibration point per draft at the largest gamma measures how often
each draft position is accepted and what drafting and verifying cost; from these the speedup of every
smaller gamma is predicted, and the best predictions are tried first.

Leviathan et al. (2023) predict E[tokens per step] = (1 - a^(g+1)) / (1 - a) from one acceptance rate a.
Measured per-position acceptance refines it: E = 1 + sum_{i<g} P(drafted tokens 0..i all accepted),
which is the same number when acceptance is geometric. The step's cost is the draft time of the tokens
drafted plus the measured time of verifying g + 1 tokens (interpolated linearly between the baseline's
one-token step and the calibration's g_max + 1), relative to the baseline's time per token.
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

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        return cls(**{**data, "accepted_per_step": tuple(data["accepted_per_step"]),
                      "drafted_per_step": tuple(data["drafted_per_step"])})


def calibrate(rows: pd.DataFrame, baseline_rows: pd.DataFrame, *, gamma: int) -> Calibration | None:
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
    )


def expected_tokens_per_step(calibration: Calibration, gamma: int) -> float:
    """1 (the bonus or correction token) + the expected accepted drafted tokens at speculation length gamma."""
    return 1.0 + sum(calibration.accepted_per_step[:gamma])


def predicted_speedup(calibration: Calibration, gamma: int) -> float:
    if not 1 <= gamma <= calibration.gamma:
        raise ValueError(f"gamma {gamma} is outside the calibrated 1..{calibration.gamma}")
    one = calibration.target_ms_per_token
    verify_ms = one + (calibration.verify_ms_per_step - one) * gamma / calibration.gamma
    draft_ms = calibration.draft_ms_per_token * sum(calibration.drafted_per_step[:gamma])
    return expected_tokens_per_step(calibration, gamma) / ((draft_ms + verify_ms) / one)


def _sum_lists(column: pd.Series, width: int) -> np.ndarray:
    total = np.zeros(width)
    for values in column:
        if values is not None:
            values = np.asarray(values, dtype=float)[:width]
            total[: len(values)] += values
    return total

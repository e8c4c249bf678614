"""Predicting one gamma from another: a point measured at speculation length G (its steps' drafted and
accepted tokens per position, its draft and verify costs) predicts the speedup at every gamma <= G of the
same draft. `specbench run` records this prediction for every point from the largest-gamma point of its
draft (`max_gamma_predicted_speedup`), so the prediction tune's warm start acts on is checked against
measurements; `specbench tune` calibrates on one point per draft at the largest gamma and tries the best
predictions first.

At a smaller gamma' a sampled step drafts min(drafted, gamma') tokens and keeps the same accepted prefix, so
E[tokens per step] = 1 + sum_{k<gamma'} P(drafted tokens 0..k accepted), which is Leviathan et al.'s
(1 - a^(g+1)) / (1 - a) when every step drafts gamma tokens and acceptance is geometric; a greedy point's measured
spans are re-cut at gamma' instead (stats.StepModel.at_gamma: the output and the draft's guesses are the same at
every gamma). The step's cost
is the draft time of the tokens drafted plus the time of verifying them and the bonus token, relative to
the baseline's time per token; a request adds its prefill (TTFT: the target's and the draft's, the same
at every gamma) to its decode steps. The verify time at gamma' is the calibration point's measured verify time
times the ratio of a timing of the target's forward pass (specbench.decoding.costs, at k = 1..g_max + 1: not
linear in k on a CPU) at gamma' to the same at g_max, each weighted by how many tokens the draft proposed per step
(n-grams often propose fewer than gamma, or none). Without that timing (a replay of an older recording) it is
interpolated linearly in gamma between the baseline's one-token step and the calibration's measured step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from specbench.core.results import PointSpec
from specbench.core.stats import Prediction, StepModel


@dataclass(frozen=True)
class Calibration:
    """Plain data (stored in an Optuna user attr): the calibration point's step model and costs."""

    gamma: int  # the gamma it was measured at (the space's largest)
    accepted_per_step: tuple[float, ...]  # [gamma]: P(positions 0..i accepted) = accepted_per_position[i] / steps
    drafted_per_step: tuple[float, ...]  # [gamma]: P(at least i + 1 drafted) = drafted_per_position[i] / steps
    draft_ms_per_token: float
    verify_ms_per_step: float  # the measured mean verification (a step's drafted tokens + 1)
    target_ms_per_token: float  # the baseline's time per step (one token)
    verify_ms_by_tokens: tuple[float, ...] = ()  # [k - 1]: a forward pass of k tokens, k = 1..gamma + 1
    # per request (0 in calibrations stored before they were recorded: the decode steps alone are predicted)
    decode_tokens: float = 0.0  # output tokens after the prefill's first one
    ttft_ms: float = 0.0  # the point's prefill (target and draft) and first token
    baseline_ttft_ms: float = 0.0
    greedy: bool = False  # temperature 0: a smaller gamma re-cuts the measured spans (StepModel.at_gamma)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        return cls(**{**data, "accepted_per_step": tuple(data["accepted_per_step"]),
                      "drafted_per_step": tuple(data["drafted_per_step"]),
                      "verify_ms_by_tokens": tuple(data.get("verify_ms_by_tokens") or ())})

    def step_model(self, gamma: int | None = None) -> StepModel:
        """What a step drafts and accepts at `gamma` (default: the calibrated gamma)."""
        model = StepModel(self.drafted_per_step, self.accepted_per_step)
        return model if gamma is None else model.at_gamma(gamma, greedy=self.greedy)


def calibrate(rows: pd.DataFrame, baseline_rows: pd.DataFrame, *, gamma: int,
              verify_ms_by_tokens: tuple[float, ...] = (), greedy: bool = False) -> Calibration | None:
    """From a calibration point's request rows; None when the backend does not record what it drafted
    (HF generate) or the point took no steps."""
    steps = rows["target_steps"].sum()
    if not steps or rows["drafted_tokens"].isna().any() or rows["verify_ms"].isna().any():
        return None
    model = StepModel.from_counts(steps=int(steps),
                                  drafted_per_position=_sum_lists(rows["drafted_per_position"], gamma),
                                  accepted_per_position=_sum_lists(rows["accepted_per_position"], gamma))
    drafted_tokens = rows["drafted_tokens"].sum()
    return Calibration(
        gamma=gamma,
        accepted_per_step=model.accepted_through,
        drafted_per_step=model.drafted_at_least,
        draft_ms_per_token=float(rows["draft_ms"].sum() / drafted_tokens) if drafted_tokens else 0.0,
        verify_ms_per_step=float(rows["verify_ms"].sum() / steps),
        target_ms_per_token=float(baseline_rows["verify_ms"].sum() / baseline_rows["target_steps"].sum()),
        verify_ms_by_tokens=tuple(float(v) for v in verify_ms_by_tokens),
        decode_tokens=float(rows["decode_tokens"].mean()),
        ttft_ms=float(rows["ttft_ms"].mean()),
        baseline_ttft_ms=float(baseline_rows["ttft_ms"].mean()),
        greedy=greedy,
    )


def predict(calibration: Calibration, gamma: int) -> Prediction:
    """The analytic model at speculation length gamma (1..the calibrated gamma)."""
    return Prediction(calibration.step_model(gamma), draft_ms_per_token=calibration.draft_ms_per_token,
                      verify_ms_per_step=verify_ms(calibration, gamma),
                      target_ms_per_token=calibration.target_ms_per_token, decode_tokens=calibration.decode_tokens,
                      ttft_ms=calibration.ttft_ms, baseline_ttft_ms=calibration.baseline_ttft_ms)


def predicted_speedup(calibration: Calibration, gamma: int) -> float:
    return predict(calibration, gamma).speedup


def verify_ms(calibration: Calibration, gamma: int) -> float:
    """The expected time of one verification at speculation length gamma: the calibration point's measured
    verification, scaled by how the timed forward pass grows from its tokens to gamma's. The curve gives the shape,
    the point the level: in a speculative run a verification costs more than the curve's pass of as many tokens
    (measured on the embedded model: 6 % more for n-gram, 15 % for the int8 self-draft, whose forward passes run
    between the target's), which a level taken from the baseline's step missed at every gamma."""
    one = calibration.target_ms_per_token
    curve = calibration.verify_ms_by_tokens
    if len(curve) < calibration.gamma + 1:  # not timed (a replay): linear between 1 and gamma_max + 1 tokens
        return one + (calibration.verify_ms_per_step - one) * gamma / calibration.gamma
    at_calibration = calibration.step_model().verify_ms(curve)
    return calibration.verify_ms_per_step * calibration.step_model(gamma).verify_ms(curve) / at_calibration


def _sum_lists(column: pd.Series, width: int) -> np.ndarray:
    total = np.zeros(width)
    for values in column:
        if values is not None:
            values = np.asarray(values, dtype=float)[:width]
            total[: len(values)] += values
    return total


def family(spec: PointSpec) -> tuple:
    """What points of one draft share, gamma aside: their speedups are predicted from one another."""
    return (spec.method, spec.draft, spec.draft_model, spec.draft_quantize, spec.ngram_min, spec.ngram_max,
            spec.temperature, spec.top_p, spec.concurrency, spec.request_rate)


def from_largest_gamma(specs: Sequence[PointSpec], requests: Mapping[str, pd.DataFrame], *,
                       verify_ms_by_tokens: Sequence[float] = ()) -> dict[str, float]:
    """Per point (point id -> speedup): the speedup its draft's largest-gamma point predicts for its gamma — that
    point's per-position acceptance truncated at the gamma, its draft cost per token, and the verify cost of the
    gamma's tokens (from `verify_ms_by_tokens`, a timing of the target's forward pass at k = 1..G + 1 tokens, else
    interpolated). The prediction tune's warm start makes for a gamma it has not measured. Points whose backend
    does not record steps and costs (server, hf), with a gamma schedule, or without a baseline are left out; the
    largest-gamma point itself is included (its prediction restates its own measurement)."""
    largest: dict[tuple, PointSpec] = {}
    for spec in specs:
        if spec.gamma is None or spec.gamma_schedule is not None or spec.synthetic or spec.point_id not in requests:
            continue
        key = family(spec)
        if key not in largest or spec.gamma > largest[key].gamma:
            largest[key] = spec
    calibrations: dict[tuple, Calibration | None] = {}
    predicted: dict[str, float] = {}
    for spec in specs:
        top = largest.get(family(spec)) if spec.gamma is not None and spec.gamma_schedule is None \
            and not spec.synthetic else None
        if top is None or spec.gamma > top.gamma or top.baseline_id not in requests:
            continue
        key = family(spec)
        if key not in calibrations:
            curve = tuple(verify_ms_by_tokens) if len(verify_ms_by_tokens) >= top.gamma + 1 else ()
            calibrations[key] = calibrate(requests[top.point_id], requests[top.baseline_id], gamma=top.gamma,
                                          verify_ms_by_tokens=curve, greedy=top.temperature == 0)
        calibration = calibrations[key]
        if calibration is not None and calibration.drafted_per_step and calibration.drafted_per_step[0] > 0:
            predicted[spec.point_id] = predict(calibration, spec.gamma).speedup
    return predicted

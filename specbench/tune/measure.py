"""A trial's objective from request rows: each repeat measured on its own, the median over repeats,
and the spread between repeats (the noise a near-tie is judged against)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from specbench.core import summary
from specbench.core.results import PointSpec
from specbench.tune.objectives import Objective


@dataclass(frozen=True)
class Measurement:
    values: tuple[float, ...]  # per objective column: the median over repeats
    repeat_values: tuple[float, ...]  # the deciding (first) objective, one per repeat
    noise: float  # 1.4826 * MAD of repeat_values (a robust standard deviation); 0 with one repeat
    metrics: dict[str, Any]  # the point's row, as points.parquet holds it, from all rows so far


class NotMeasured(ValueError):
    """The rows do not give the objective (e.g. TPOT of one-token outputs, speedup without a baseline)."""


def measure(spec: PointSpec, rows: pd.DataFrame, *, baseline: PointSpec, baseline_rows: pd.DataFrame,
            objective: Objective, context: dict[str, Any], slo: dict[str, float] | None = None) -> Measurement:
    """The objective over the prompts in `rows` (the baseline is restricted to the same prompts); `slo`: the
    profile's limits, for goodput. One request at a time, each repeat is measured on its own; under load, the
    point is one measurement (its throughput is over the wall time of all its requests)."""
    baseline_rows = baseline_rows[baseline_rows["prompt_id"].isin(set(rows["prompt_id"]))]
    metrics = _row(spec, rows, baseline, baseline_rows, context, slo)
    if spec.open_loop or (spec.concurrency or 1) > 1:
        # under load the requests share one timeline (at a rate, a prompt's "repeat" counts its draws): one measurement
        per_repeat = [metrics]
    else:
        per_repeat = [_row(spec, rows[rows["repeat"] == r], baseline, baseline_rows[baseline_rows["repeat"] == r],
                           context, slo) for r in sorted(set(rows["repeat"]))]
    values = []
    for index, column in enumerate(objective.columns):
        if column == "peak_memory_mb":  # a peak over all requests, not a per-repeat statistic
            series = [metrics[column]]
        else:
            series = [row[column] for row in per_repeat]
        if any(_missing(v) for v in series):
            raise NotMeasured(f"{spec.point_id}: {column} was not measured")
        values.append(float(np.median(series)))
        if index == 0:
            first = np.asarray(series, dtype=float)
    noise = float(1.4826 * np.median(np.abs(first - np.median(first)))) if len(first) > 1 else 0.0
    return Measurement(tuple(values), tuple(float(v) for v in first), noise, metrics)


def _row(spec: PointSpec, rows: pd.DataFrame, baseline: PointSpec, baseline_rows: pd.DataFrame,
         context: dict[str, Any], slo: dict[str, float] | None) -> dict[str, Any]:
    both = pd.concat([baseline_rows, rows], ignore_index=True) if spec != baseline else rows
    points = summary.summarize([baseline, spec] if spec != baseline else [spec], both, failures={},
                               context={spec.point_id: context}, slo=slo or None)
    row = points[points["point_id"] == spec.point_id].iloc[0].to_dict()
    return {key: plain(value) for key, value in row.items()}


def plain(value: Any) -> Any:
    """A DataFrame cell as JSON-ready Python (lists stay lists, missing values become None)."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return [plain(v) for v in value]
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))

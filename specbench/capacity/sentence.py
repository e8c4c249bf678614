"""A capacity in words, one way for `specbench run`, `specbench report` and `specbench tune`: the number formats
and the sentence that says what a configuration serves within the SLO, against the baseline, at what cost."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from specbench.capacity.document import CapacityEntry


def missing(value: Any) -> bool:
    """None, NaN or pandas' NA: not measured."""
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def number(value: float) -> str:
    """At most two decimals, at least one: 1.3, 1.0, 1.25."""
    text = f"{value:.2f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def bound(value: Any, axis: str) -> str:
    """A load without its unit: `1.3`, `6` (a concurrency is whole); `-` when there is none."""
    if missing(value):
        return "-"
    return str(int(value)) if axis == "concurrency" else number(value)


def level(value: float, axis: str) -> str:
    """`1.3 requests/s`, `concurrency 6`."""
    return f"concurrency {int(value)}" if axis == "concurrency" else f"{number(value)} requests/s"


def usd(value: Any) -> str:
    """`$0.40`; below ten cents, two significant digits (`$0.0042`)."""
    return "-" if missing(value) else f"${value:.2f}" if value >= 0.1 else f"${value:.2g}"


def percent_change(value: Any) -> str:
    """`+30 %`, `-5 %`."""
    return "-" if missing(value) else f"{value * 100:+.0f} %"


def _capacity(entry: CapacityEntry, *, unit: bool = True) -> str:
    """`1.3 requests/s [1.2, 1.4]` (`1.3 [1.2, 1.4]` without the unit), in brackets the capacity's interval (`-` at an
    open end); `at least 4.0 requests/s` when every load probed met the SLO."""
    value = level(entry.capacity, entry.axis) if unit else bound(entry.capacity, entry.axis)
    if not entry.found:
        return f"at least {value}"
    if missing(entry.capacity_low) and missing(entry.capacity_high):
        return value
    return f"{value} [{bound(entry.capacity_low, entry.axis)}, {bound(entry.capacity_high, entry.axis)}]"


VERDICTS = {"higher": "measurably higher", "lower": "measurably lower", "within": "not measurably different"}


def gain_text(entry: CapacityEntry) -> str:
    """`+30 % [+12 %, +50 %], measurably higher`: the gain over the baseline with its interval and the verdict of
    the one rule (`document.measurable`); the bare gain where there is no interval."""
    if missing(entry.gain_vs_baseline):
        return "-"
    text = percent_change(entry.gain_vs_baseline)
    if not missing(entry.gain_low) and not missing(entry.gain_high):
        text += f" [{percent_change(entry.gain_low)}, {percent_change(entry.gain_high)}]"
    return text + (f", {VERDICTS[entry.verdict]}" if entry.verdict in VERDICTS else "")


def replicas_text(entry: CapacityEntry) -> str:
    """`4`, or `4 (3-5)` with the replicas at the interval's ends where they differ."""
    text = str(int(entry.replicas_for_traffic))
    if entry.replicas_range is not None and tuple(entry.replicas_range) != (entry.replicas_for_traffic,) * 2:
        text += f" ({entry.replicas_range[0]}-{entry.replicas_range[1]})"
    return text


def capacity_sentence(entry: CapacityEntry, baseline: CapacityEntry | None, *, usd_per_hour: float | None,
                      traffic_rps: float | None) -> str:
    """`ngram γ3 holds the SLO up to 1.3 requests/s [1.2, 1.4] against the baseline's 1.0 [0.95, 1.05]: +30 % [+12 %,
    +50 %], measurably higher, $0.52 → $0.40 per 1M output tokens (-23 %); 3 (3-4) replicas for 5.0 requests/s
    against 5 (5-6)`: in brackets each capacity's interval and the gain's; the verdict is the one rule's; the cost
    appears with a price (`usd_per_hour`), the replicas with a traffic figure; a status other than found and the
    search's note close the sentence."""
    name, axis = entry.configuration, entry.axis
    if missing(entry.capacity):
        return f"{name}: no {'concurrency' if axis == 'concurrency' else 'request-rate'} capacity found ({entry.status})"
    text = f"{name} holds the SLO up to {_capacity(entry)}"
    cost = None if missing(entry.usd_per_mtok_at_capacity) or missing(usd_per_hour) else entry.usd_per_mtok_at_capacity
    replicas = None if missing(entry.replicas_for_traffic) or missing(traffic_rps) else replicas_text(entry)
    if entry.is_baseline:
        if cost is not None:
            text += f": {usd(cost)} per 1M output tokens at capacity"
        if replicas is not None:
            text += f"; {replicas} replicas for {number(traffic_rps)} requests/s"
    elif baseline is None:
        text += "; there is no baseline to compare with"
    elif missing(baseline.capacity):
        text += f"; the baseline's capacity was not found ({baseline.status})"
    else:
        text += f" against the baseline's {_capacity(baseline, unit=False)}"
        parts = [gain_text(entry)] if not missing(entry.gain_vs_baseline) else []
        if cost is not None and not missing(baseline.usd_per_mtok_at_capacity):
            change = entry.usd_per_mtok_change_vs_baseline
            parts.append(f"{usd(baseline.usd_per_mtok_at_capacity)} → {usd(cost)} per 1M output tokens"
                         + ("" if missing(change) else f" ({percent_change(change)})"))
        text += (": " + ", ".join(parts)) if parts else ""
        if replicas is not None and not missing(baseline.replicas_for_traffic):
            text += f"; {replicas} replicas for {number(traffic_rps)} requests/s against {replicas_text(baseline)}"
    text += "" if entry.found else f" ({entry.status})"
    return text + (f" ({entry.note})" if not missing(entry.note) else "")

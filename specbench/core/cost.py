"""What serving costs: the price of a million output tokens on a replica billed by the hour, and the replicas a
traffic figure needs at a configuration's capacity."""

from __future__ import annotations

import math


def usd_per_mtok(usd_per_hour: float | None, tokens_per_s: float | None) -> float | None:
    """price / (3600 x output tokens/s) x 1e6: what a million output tokens cost at this throughput (None without
    a price or a throughput)."""
    if usd_per_hour is None or tokens_per_s is None or not tokens_per_s > 0:
        return None
    return usd_per_hour / (3600.0 * tokens_per_s) * 1e6


def replicas_for(traffic_rps: float | None, capacity_rps: float | None) -> int | None:
    """ceil(traffic / capacity): replicas that serve the traffic within the SLO (None without either)."""
    if traffic_rps is None or capacity_rps is None or not capacity_rps > 0:
        return None
    return math.ceil(traffic_rps / capacity_rps - 1e-9)


def change(value: float | None, reference: float | None) -> float | None:
    """value / reference − 1 (+0.3: 30 % more), None when either is missing."""
    if value is None or reference is None or not reference > 0:
        return None
    return value / reference - 1

"""What one configuration's capacity search comes to, from its probes: the entry capacity.json lists (the capacity
fitted to every request with its interval, the bracket, the attainment at each end, the cost at capacity), a
search repeated ([capacity] repeats) pooled into one, and the document the run writes. Pure: the sweep's
`specbench.sweep.capacity` sends the probes and calls these."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from specbench.capacity.document import CapacityDocument, compared, entry_from_dict
from specbench.capacity.estimate import CapacityEstimate, ProbeRequests
from specbench.capacity.search import Probe, SearchSettings, conclude, decide, met_slo
from specbench.core import cost


class Pooled:
    """One configuration's search on one axis over its repeats: their probes, requests and outcomes; `entry` is its
    capacity.json entry with every repeat so far."""

    def __init__(self) -> None:
        self.probes: list[dict[str, Any]] = []  # every repeat's, in the order sent ("repeat" in each)
        self.histories: list[list[Probe]] = []
        self.by_point: dict[str, ProbeRequests] = {}
        self.repeats: list[dict[str, Any]] = []  # per repeat: its own capacity, interval and status
        self.entry: dict[str, Any] | None = None
        self.settings: SearchSettings | None = None  # the last repeat's

    @property
    def requests(self) -> list[ProbeRequests]:
        return list(self.by_point.values())

    @property
    def capacity(self) -> float | None:
        """Where the repeats so far put the capacity (their own estimates' median), to start the next one at."""
        found = [r["capacity"] for r in self.repeats if r["capacity"] is not None]
        return float(np.median(found)) if found else None

    def add(self, repeat: int, history: list[Probe], requests: dict[str, ProbeRequests],
            outcome: dict[str, Any], settings: SearchSettings) -> None:
        self.settings = settings
        self.histories.append(history)
        self.by_point.update(requests)
        self.repeats.append({"repeat": repeat, "status": outcome["status"], "capacity": outcome["capacity"],
                             "capacity_low": outcome["capacity_low"], "capacity_high": outcome["capacity_high"]})

    def stopped(self, entry: dict[str, Any], repeat: int, status: str) -> dict[str, Any]:
        """The entry of a repeat that could not search (`status` says why): the repeats before it stand."""
        self.repeats.append({"repeat": repeat, "status": status, "capacity": None, "capacity_low": None,
                             "capacity_high": None})
        if self.entry is None or repeat == 0:
            return {**entry, **empty_outcome(), "status": status} | ({"repeats": list(self.repeats)} if repeat else {})
        return {**self.entry, "repeats": list(self.repeats)}


def merged_history(histories: list[list[Probe]]) -> list[Probe]:
    """The probes of several repeats as one search's: per load, its last probe in each repeat pooled (requests,
    met, time), void where every one was, unsustained where one was; in the order the loads were first probed."""
    latest: dict[float, list[Probe]] = {}
    for history in histories:
        own = {p.load: p for p in history}
        for load, probe in own.items():
            latest.setdefault(load, []).append(probe)
    merged = []
    for load, probes in latest.items():
        counted = [p for p in probes if p.void is None] or probes
        merged.append(Probe(load=load, n_requests=sum(p.n_requests for p in counted), met=sum(p.met for p in counted),
                            duration_s=sum(p.duration_s for p in probes),
                            void=None if any(p.void is None for p in probes) else probes[-1].void,
                            unsustained=next((p.unsustained for p in counted if p.unsustained), None)))
    return merged


def capacity_text(outcome: dict[str, Any]) -> str:
    if outcome.get("capacity") is None:
        return outcome["status"]
    low, high = outcome["capacity_low"], outcome["capacity_high"]
    return f"{outcome['capacity']:.3g} [" + (f"{low:.3g}" if low is not None else "open") + ", " + (
        f"{high:.3g}" if high is not None else "open") + "]"


def empty_outcome() -> dict[str, Any]:
    return {"capacity": None, "capacity_low": None, "capacity_high": None, "bracket_low": None, "bracket_high": None,
            "attainment_low": None, "attainment_high": None, "note": None, "curve": [], "dispersion": None,
            "run_dispersion": None, "between_repeats": None}


def search_outcome(history: list[Probe], settings: SearchSettings, probes: list[dict], axis: str, *,
                   estimate: CapacityEstimate | None, usd_per_hour: float | None = None) -> dict[str, Any]:
    """The entry's capacity with its interval (the estimate), the bracket the search closed and the attainment at
    each end, from the probes so far, and what 1M output tokens cost at capacity (`usd_per_mtok_at_capacity`)."""
    if not history:
        return {**empty_outcome(), "status": "not bracketed: no probe was decided"}
    outcome = conclude(history, settings, unit="rate" if axis == "request_rate" else "concurrency")

    def attainment(probe: Probe | None) -> list[float] | None:
        if probe is None:
            return None
        decision = decide(probe, settings)
        return [decision.attainment, decision.ci_low, decision.ci_high]

    capacity = estimate.capacity if estimate is not None and outcome.passing is not None else None
    high = estimate.ci_high if capacity is not None else None
    conditioning = estimate.note if capacity is not None else None
    unsustained = outcome.failing if outcome.failing is not None and outcome.failing.unsustained else None
    low = estimate.ci_low if capacity is not None else None
    if capacity is not None and unsustained is not None and (high is None or high > unsustained.load):
        # the fit leaves out the load where the queue grew, yet the capacity lies below it: the interval ends there
        # (and a crossing the fit put above it, between the loads either side, comes down to it)
        high = unsustained.load
        capacity = min(capacity, high)
        low = min(low, capacity) if low is not None else None
        conditioning = (f"its interval ends at {high:g}, where the engine's queue still grew"
                        if estimate.ci_high is None else conditioning)
    notes = [outcome.note, conditioning,
             "the attainment fitted to every probe misses the target at every load probed"
             if outcome.passing is not None and capacity is None else None]
    return {"status": outcome.status, "capacity": capacity,
            "capacity_low": low,
            "capacity_high": high,
            "bracket_low": outcome.passing.load if outcome.passing else None,
            "bracket_high": outcome.failing.load if outcome.failing else None,
            "attainment_low": attainment(outcome.passing), "attainment_high": attainment(outcome.failing),
            "note": "; ".join(n for n in notes if n) or None,
            "curve": [list(point) for point in estimate.curve] if estimate is not None else [],
            "dispersion": estimate.dispersion if estimate is not None else None,
            "usd_per_mtok_at_capacity": cost_at_capacity(probes, capacity, axis=axis, usd_per_hour=usd_per_hour)}


def met_in_arrival_order(rows: pd.DataFrame, slo: dict[str, float]) -> np.ndarray:
    """Whether each request met every SLO limit, in the order the requests were sent (neighbours shared a queue:
    the estimate's bootstrap keeps them together)."""
    if "start_ms" in rows and rows["start_ms"].notna().all():
        rows = rows.sort_values("start_ms", kind="stable")
    return met_slo(rows, slo)


def cost_at_capacity(probes: list[dict], capacity: float | None, *, axis: str,
                     usd_per_hour: float | None) -> float | None:
    """$ per 1M output tokens when a replica serves at capacity: price / (3600 x requests/s x output tokens per
    request) x 1e6. The requests/s are the capacity itself on the request-rate axis (the rate it holds in steady
    state), at a concurrency the completed requests/s of the highest probe at or below the capacity; the output
    tokens per request those of that probe. Not the probe's tokens/s: that divides by its schedule plus the drain
    after its last arrival too, and read ~22 % too high on vLLM CPU."""
    if capacity is None:
        return None
    measured = [p for p in probes if p["load"] <= capacity + 1e-9 and not p.get("error") and not p.get("void")
                and p.get("n_requests")
                and p.get("output_tokens") is not None]
    if not measured:
        return None
    probe = max(reversed(measured), key=lambda p: p["load"])  # the last at that load: a load sent again is its last
    rate = capacity if axis == "request_rate" else probe.get("request_throughput")
    if rate is None:
        return None
    return cost.usd_per_mtok(usd_per_hour, rate * probe["output_tokens"] / probe["n_requests"])


def capacity_document(entries: list[dict[str, Any]], *, slo: dict[str, float], spec, profile) -> CapacityDocument:
    """capacity.json: the settings, and per configuration its search with the gain over the baseline's capacity
    (same temperature, top_p and axis, both found), the cost per million output tokens at capacity and its change,
    and the replicas the traffic needs."""
    typed = [entry_from_dict(_jsonable(entry)) for entry in entries]
    return CapacityDocument(
        target_attainment=spec.attainment, confidence=spec.confidence, slo=dict(slo), resolution=spec.resolution_value,
        resolution_unit="relative" if spec.relative else "requests/s", usd_per_hour=profile.usd_per_replica_hour,
        traffic_rps=profile.cost.traffic_rps, configurations=compared(typed, traffic_rps=profile.cost.traffic_rps))


def _jsonable(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry as JSON holds it (numpy scalars as Python numbers)."""
    return json.loads(json.dumps(entry, default=lambda value: value.item() if hasattr(value, "item") else str(value)))


__all__ = ["Pooled", "capacity_document", "capacity_text", "cost_at_capacity", "empty_outcome", "merged_history",
           "met_in_arrival_order", "search_outcome"]

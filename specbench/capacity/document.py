"""capacity.json, typed: what a run's capacity searches found, written and read here only.

One `CapacityEntry` per configuration (baseline or draft x gamma), temperature, top_p and load axis: its capacity
with its interval (`specbench.capacity.estimate`: fitted from every request of every probe), the bracket the search
closed (the highest load that passed, the lowest that failed) with the attainment at each end, every probe (of every
repeat of the search, with each repeat's own estimate where [capacity] repeats asks for several), and,
against the baseline of the same temperature, top_p and axis, its gain with its interval and whether that is
measurable (`measurable`: the one rule), its cost per million output tokens and the replicas a traffic figure needs.
`CapacityDocument` adds the settings the searches ran with. The file carries a `version` (2 since the capacity is the
fitted estimate rather than the bracket's passing load; version 1 still reads, without intervals); files written
before it had none and read as version 1."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from specbench.capacity.estimate import compare, gain_interval
from specbench.core import cost
from specbench.core.documents import check_version, checked_object, known, read_object, write_document
from specbench.core.errors import OneLineError

CAPACITY_FILE = "capacity.json"
VERSION = 2
REQUIRED = ("configuration", "temperature", "top_p", "axis")  # what names an entry


class CapacityFileError(OneLineError, ValueError):
    """A capacity.json that cannot be read; the message names the file and the key."""


@dataclass(frozen=True)
class CapacityProbe:
    """One load a search sent, as a recorded point, and what its attainment decided."""

    load: float  # requests/s, or requests in flight
    n_requests: int
    met: int  # requests that met every SLO limit
    attainment: float
    ci_low: float
    ci_high: float
    decision: str
    point_id: str | None = None
    next: str | None = None  # what the search did after it
    reused: bool = False  # the point was already recorded with as many requests
    duration_s: float | None = None
    goodput: float | None = None
    tokens_per_s: float | None = None
    usd_per_mtok: float | None = None
    completed_per_s: float | None = None
    output_tokens: int | None = None  # of its measured requests: what a request yields at this load
    request_throughput: float | None = None  # requests/s it completed (the concurrency axis' steady rate)
    error: str | None = None  # the point failed: it met nothing
    void: str | None = None  # why it cannot be trusted (the client sent late): neither a pass nor a fail
    repeat: int = 0  # which repeat of the search sent it ([capacity] repeats; 0: the first)


@dataclass(frozen=True)
class CapacityRepeat:
    """One repeat of a configuration's search, estimated alone (the entry's capacity pools every repeat)."""

    repeat: int
    status: str
    capacity: float | None = None
    capacity_low: float | None = None
    capacity_high: float | None = None


@dataclass(frozen=True)
class CapacityEntry:
    """One configuration's search on one load axis at one temperature and top_p."""

    configuration: str  # "baseline", or "<draft> γ<gamma>"
    temperature: float
    top_p: float
    axis: Literal["request_rate", "concurrency"]
    method: str | None = None
    draft: str | None = None
    gamma: int | None = None
    status: str | None = None  # "found", or why there is no capacity (not bracketed, failed, ...)
    start: float | None = None  # the first load the search probed
    start_from: str | None = None  # where that came from: "serial" (one request at a time), "concurrency N" (the
    # requests/s the concurrency search's highest passing load completed), "start_rps", "repeats" (the earlier ones')
    capacity: float | None = None  # where the attainment fitted to every probe crosses the target (a lower bound
    # when every load probed met it)
    capacity_low: float | None = None  # its interval at `confidence`; None where it is open at that end
    capacity_high: float | None = None
    bracket_low: float | None = None  # the highest load that passed
    bracket_high: float | None = None  # the lowest load that failed
    attainment_low: tuple[float, float, float] | None = None  # share met, CI low, CI high at the bracket's low end
    attainment_high: tuple[float, float, float] | None = None
    note: str | None = None  # how the search ended, and why the capacity is ill-conditioned where it is
    curve: tuple[tuple[float, int, float], ...] = ()  # (load, requests, fitted attainment) per load probed
    dispersion: float | None = None  # the probes' scatter about the fit over independent requests' (the interval
    # allows for it where above 1); None where too few probes could tell
    run_dispersion: float | None = None  # the same pooled over every search of the run on this axis (the interval
    # allows for the larger of the two); None where the run has one search on it, or too few probes
    between_repeats: float | None = None  # with repeats: the spread of log capacity between them beyond their
    # intervals (0: they agree; the pooled interval is widened by it)
    usd_per_mtok_at_capacity: float | None = None
    gain_vs_baseline: float | None = None  # capacity / the baseline's - 1, both found
    gain_low: float | None = None  # its interval, from both capacities' intervals
    gain_high: float | None = None
    verdict: Literal["higher", "lower", "within"] | None = None  # `measurable`, against the baseline
    usd_per_mtok_change_vs_baseline: float | None = None
    replicas_for_traffic: int | None = None  # request-rate capacities only
    replicas_range: tuple[int, int] | None = None  # at the interval's high and low ends (None where open)
    probes: tuple[CapacityProbe, ...] = ()
    repeats: tuple[CapacityRepeat, ...] = ()  # with [capacity] repeats > 1: each repeat's own estimate

    @property
    def found(self) -> bool:
        return self.status == "found"

    @property
    def is_baseline(self) -> bool:
        return self.method == "baseline"

    @property
    def group(self) -> tuple[float, float, str]:
        """The baseline an entry is compared with has the same temperature, top_p and axis."""
        return (self.temperature, self.top_p, self.axis)


@dataclass(frozen=True)
class CapacityDocument:
    target_attainment: float  # the share of requests that must meet every SLO limit
    slo: dict[str, float]  # request column -> limit
    configurations: tuple[CapacityEntry, ...]
    confidence: float | None = None  # of each probe's Wilson interval and of each capacity's interval
    resolution: float | None = None
    resolution_unit: str | None = None  # "relative" (a fraction of the load) or "requests/s"
    usd_per_hour: float | None = None
    traffic_rps: float | None = None
    version: int = VERSION

    def baseline_of(self, entry: CapacityEntry) -> CapacityEntry | None:
        return next((e for e in self.configurations if e.is_baseline and e.group == entry.group), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measurable(entry: CapacityEntry, baseline: CapacityEntry) -> tuple[float, float, float, str] | None:
    """The one rule for "measurably different" capacities: (gain, low, high, verdict), the gain over the baseline
    with its interval (`estimate.gain_interval`) and "higher" when that whole interval lies above zero, "lower" when
    below, "within" otherwise; None unless both have a capacity with a closed interval."""
    if not (entry.found and baseline.found):
        return None
    gain = gain_interval(entry.capacity, (entry.capacity_low, entry.capacity_high), baseline.capacity,
                         (baseline.capacity_low, baseline.capacity_high))
    return None if gain is None else (*gain, compare(gain[1], gain[2]))


def compared(entries: list[CapacityEntry], *, traffic_rps: float | None) -> tuple[CapacityEntry, ...]:
    """Each entry with its gain, cost change and brackets against its baseline (both found), and the replicas the
    traffic needs at a request-rate capacity."""
    baselines = {e.group: e for e in entries if e.is_baseline}
    done = []
    for entry in entries:
        baseline = baselines.get(entry.group)
        both = baseline is not None and entry.found and baseline.found
        gain = measurable(entry, baseline) if both and not entry.is_baseline else None
        rate = entry.axis == "request_rate" and entry.found
        done.append(replace(
            entry,
            gain_vs_baseline=cost.change(entry.capacity, baseline.capacity) if both else None,
            gain_low=gain[1] if gain else None, gain_high=gain[2] if gain else None,
            verdict=gain[3] if gain else None,
            usd_per_mtok_change_vs_baseline=cost.change(entry.usd_per_mtok_at_capacity,
                                                        baseline.usd_per_mtok_at_capacity) if both else None,
            replicas_for_traffic=cost.replicas_for(traffic_rps, entry.capacity) if rate else None,
            replicas_range=_replicas_range(traffic_rps, entry) if rate else None))
    return tuple(done)


def _replicas_range(traffic_rps: float | None, entry: CapacityEntry) -> tuple[int, int] | None:
    """(fewest, most): the replicas the traffic needs at the capacity interval's high and low ends."""
    if entry.capacity_low is None or entry.capacity_high is None:
        return None
    fewest, most = cost.replicas_for(traffic_rps, entry.capacity_high), cost.replicas_for(traffic_rps, entry.capacity_low)
    return None if fewest is None or most is None else (fewest, most)


# --- JSON ----------------------------------------------------------------------------------------------------


def entry_from_dict(data: dict[str, Any], *, where: str = CAPACITY_FILE) -> CapacityEntry:
    if not isinstance(data, dict):
        raise CapacityFileError(f"{where}: not an object")
    if missing := [key for key in REQUIRED if data.get(key) is None]:
        raise CapacityFileError(f"{where} lacks {', '.join(missing)}")
    values = known(CapacityEntry, data)
    for end in ("attainment_low", "attainment_high", "replicas_range"):
        if values.get(end) is not None:
            values[end] = tuple(values[end])
    if values.get("curve") is not None:
        values["curve"] = tuple(tuple(point) for point in values["curve"])
    probes = data.get("probes") or []
    if not isinstance(probes, list) or not all(isinstance(p, dict) for p in probes):
        raise CapacityFileError(f"{where}: `probes` is not a list of objects")
    repeats = data.get("repeats") or []
    if not isinstance(repeats, list) or not all(isinstance(r, dict) for r in repeats):
        raise CapacityFileError(f"{where}: `repeats` is not a list of objects")
    try:
        values["probes"] = tuple(CapacityProbe(**known(CapacityProbe, probe)) for probe in probes)
        values["repeats"] = tuple(CapacityRepeat(**known(CapacityRepeat, repeat)) for repeat in repeats)
        return CapacityEntry(**values)
    except TypeError as error:
        raise CapacityFileError(f"{where}: {error}") from None


def document_from_dict(data: Any, *, source: str = CAPACITY_FILE) -> CapacityDocument:
    """The document, or a CapacityFileError naming the file and the key that makes it unusable."""
    data = checked_object(data, source=source, error=CapacityFileError)
    # version 1 (capacity = the bracket's passing load, no intervals) still reads: its gains have no interval and
    # no verdict
    check_version(data, version=VERSION, source=source, error=CapacityFileError,
                  again="write it again with this version's `specbench run`", older=(1,))
    entries = data.get("configurations")
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise CapacityFileError(f"{source}: `configurations` is not a list of objects")
    configurations = tuple(entry_from_dict(entry, where=f"{source}: configurations[{index}]")
                           for index, entry in enumerate(entries))
    values = known(CapacityDocument, {**data, "configurations": configurations})
    values["version"] = data.get("version", 1)
    values.setdefault("target_attainment", 0.95)
    values["slo"] = dict(values.get("slo") or {})
    try:
        return CapacityDocument(**values)
    except TypeError as error:
        raise CapacityFileError(f"{source}: {error}") from None


def write_capacity(document: CapacityDocument, folder: Path) -> Path:
    """capacity.json in `folder`."""
    return write_document(document.to_dict(), folder / CAPACITY_FILE)


def read_capacity(path: Path) -> CapacityDocument:
    return document_from_dict(read_object(path, CapacityFileError), source=path.name)


__all__ = ["CAPACITY_FILE", "VERSION", "CapacityDocument", "CapacityEntry", "CapacityFileError", "CapacityProbe",
           "CapacityRepeat",
           "compared", "document_from_dict", "entry_from_dict", "measurable", "read_capacity", "write_capacity"]

"""Capacity and cost from the capacity.json a capacity search leaves in a run folder: per temperature and load
axis, each configuration's capacity (the highest load at which the share of requests meeting the SLO reaches the target,
fitted to every probe) with its interval and the bracket the search closed, its gain over the baseline with its
interval and verdict, the cost per 1M output tokens at capacity, and every probe behind it. Outputs are DataFrames
and the strings every format shows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from specbench.capacity.document import CapacityDocument, CapacityEntry
from specbench.capacity.sentence import (bound, capacity_sentence, gain_text, level, missing, number, percent_change,
                                         replicas_text, usd)
from specbench.report import tables

CONFIGURATION_COLUMNS = (
    "temperature", "top_p", "configuration", "method", "draft", "gamma", "axis", "capacity", "capacity_low",
    "capacity_high", "bracket_low", "bracket_high", "attainment_low", "attainment_high", "status", "gain_vs_baseline",
    "gain_low", "gain_high", "verdict", "usd_per_mtok_at_capacity", "usd_per_mtok_change_vs_baseline",
    "replicas_for_traffic", "replicas_range", "note",
)  # attainment_low / _high: [share met, CI low, CI high] at the bracket's ends, or None
PROBE_COLUMNS = ("temperature", "top_p", "configuration", "axis", "load", "point_id", "reused", "n_requests", "met",
                 "attainment", "ci_low", "ci_high", "decision", "goodput", "tokens_per_s", "repeat")
FILTER_KEYS = ("temperature", "top_p", "method", "draft", "gamma")  # the --filter keys a configuration has


@dataclass(frozen=True)
class CapacityReport:
    target_attainment: float
    confidence: float | None  # the level of each probe's confidence interval
    slo: dict[str, float]
    resolution: float | None
    resolution_unit: str | None  # "relative" (a fraction of the load) or "requests/s"
    usd_per_hour: float | None
    traffic_rps: float | None
    configurations: pd.DataFrame  # CONFIGURATION_COLUMNS, as capacity.json lists them
    probes: pd.DataFrame  # PROBE_COLUMNS, each configuration's probes in the order they ran
    entries: list[CapacityEntry]  # the configurations shown, as capacity.json holds them


def capacity_report(document: CapacityDocument, filters: list[tables.Filter] = ()) -> CapacityReport:
    """The report's view of capacity.json. --filter keys a configuration has (temperature, top_p, method, draft,
    gamma) apply; the baselines stay, as the reference the gains are against; other keys do not apply."""
    every = list(document.configurations)
    configurations = pd.DataFrame([{column: getattr(entry, column) for column in CONFIGURATION_COLUMNS}
                                   for entry in every], columns=list(CONFIGURATION_COLUMNS))
    configurations = configurations.astype({"temperature": "float64", "top_p": "float64", "gamma": "Int64"})
    applicable = [f for f in filters if f.key in FILTER_KEYS]
    kept = tables.apply_filters(configurations, applicable) if applicable else configurations
    shown = configurations.index.isin(kept.index) | (configurations["method"] == "baseline")
    entries = [entry for entry, keep in zip(every, shown) if keep]
    probes = pd.DataFrame([{"temperature": entry.temperature, "top_p": entry.top_p,
                            "configuration": entry.configuration, "axis": entry.axis,
                            **{column: getattr(probe, column) for column in PROBE_COLUMNS[4:]}}
                           for entry in entries for probe in entry.probes], columns=list(PROBE_COLUMNS))
    return CapacityReport(target_attainment=document.target_attainment, confidence=document.confidence,
                          slo=dict(document.slo), resolution=document.resolution,
                          resolution_unit=document.resolution_unit, usd_per_hour=document.usd_per_hour,
                          traffic_rps=document.traffic_rps, configurations=configurations[shown].reset_index(drop=True),
                          probes=probes.astype({"temperature": "float64", "top_p": "float64"}), entries=entries)


@dataclass(frozen=True)
class CapacityGroup:
    """The searches of one temperature, top_p and load axis (a request rate and a concurrency are not one scale)."""

    name: str  # `temperature 0`; `temperature 0, by concurrency` where the run searched both axes
    axis: str  # "request_rate" or "concurrency"
    configurations: pd.DataFrame  # the baseline first, then as capacity.json lists them
    probes: pd.DataFrame

    @property
    def title(self) -> str:
        return f"Capacity and cost, {self.name}"

    @property
    def probes_title(self) -> str:
        return f"Capacity probes, {self.name}"


def groups(report: CapacityReport) -> list[CapacityGroup]:
    """Per temperature and top_p (ascending), and load axis (concurrency first)."""
    found = []
    both = report.configurations["axis"].nunique() > 1
    keys = set(report.configurations[["temperature", "top_p", "axis"]].itertuples(index=False, name=None))
    for temperature, top_p, axis in sorted(keys, key=lambda key: (key[0], key[1], key[2] != "concurrency", key[2])):
        mine = ((report.configurations["temperature"] == temperature) & (report.configurations["top_p"] == top_p)
                & (report.configurations["axis"] == axis))
        configurations = report.configurations[mine].sort_values("method", key=lambda m: m != "baseline",
                                                                 kind="stable")
        probes = report.probes[(report.probes["temperature"] == temperature) & (report.probes["top_p"] == top_p)
                               & (report.probes["axis"] == axis)]
        by = f", by {'concurrency' if axis == 'concurrency' else 'request rate'}" if both else ""
        found.append(CapacityGroup(name=tables.group_title(temperature, top_p) + by, axis=axis,
                                   configurations=configurations, probes=probes))
    return found


# --- strings --------------------------------------------------------------------------------------


def capacity_cell(row: dict) -> str:
    """`1.3 requests/s [1.2, 1.4]`: the capacity and, in brackets, its interval (`-` at an open end); `at least 4.0
    requests/s` when every load probed met the SLO, `below 0.5 requests/s` when none did."""
    capacity, axis = row["capacity"], row["axis"]
    if missing(capacity):
        return "-" if missing(row["bracket_high"]) else f"below {level(row['bracket_high'], axis)}"
    if row.get("status") != "found":
        return f"at least {level(capacity, axis)}"
    if missing(row.get("capacity_low")) and missing(row.get("capacity_high")):
        return level(capacity, axis)
    return f"{level(capacity, axis)} [{bound(row.get('capacity_low'), axis)}, {bound(row.get('capacity_high'), axis)}]"


def repeats_cell(entry: CapacityEntry) -> str:
    """`1.29 · 1.31 · 1.3`: each repeat's own capacity, in the order they ran (`-` where one found none)."""
    return " · ".join("-" if r.capacity is None else bound(r.capacity, entry.axis) for r in entry.repeats) or "-"


def bracket_cell(row: dict) -> str:
    """`[1.3, 1.41]`: the highest load that passed and the lowest that failed."""
    if missing(row["bracket_low"]) and missing(row["bracket_high"]):
        return "-"
    return f"[{bound(row['bracket_low'], row['axis'])}, {bound(row['bracket_high'], row['axis'])}]"


def attainment_cell(value: Any) -> str:
    """`97% [91%, 99%]`: the share of requests that met the SLO, with its CI."""
    if value is None or len(value) != 3 or any(missing(v) for v in value):
        return "-"
    share, low, high = value
    return f"{share:.0%} [{low:.0%}, {high:.0%}]"


def display_capacity(report: CapacityReport, group: pd.DataFrame) -> pd.DataFrame:
    """One group's configurations as strings, a row each; the cost columns only with a price, the replicas only
    with a traffic figure (and a request rate: replicas serve requests per second)."""
    entries = _entries(report, group)
    columns: dict[str, list[str]] = {
        "configuration": list(group["configuration"]),
        "capacity [interval]": [capacity_cell(row) for row in group.to_dict("records")],
        "bracket": [bracket_cell(row) for row in group.to_dict("records")],
        "met at low end": [attainment_cell(v) for v in group["attainment_low"]],
        "met at high end": [attainment_cell(v) for v in group["attainment_high"]],
        "gain [interval]": ["-" if entry.is_baseline else gain_text(entry) for entry in entries],
    }
    if any(entry.repeats for entry in entries):  # [capacity] repeats: each repeat's own capacity beside the pooled
        columns["each repeat"] = [repeats_cell(entry) for entry in entries]
    if report.usd_per_hour is not None:
        columns["$/1M tokens"] = [usd(v) for v in group["usd_per_mtok_at_capacity"]]
        columns["cost change"] = [_against_baseline(row, "usd_per_mtok_change_vs_baseline")
                                  for row in group.to_dict("records")]
    if report.traffic_rps is not None and (group["axis"] == "request_rate").all():
        columns["replicas"] = ["-" if missing(entry.replicas_for_traffic) else replicas_text(entry)
                               for entry in entries]
    columns["status"] = [str(status) + ("" if missing(note) else f" ({note})")
                         for status, note in zip(group["status"], group["note"])]
    return pd.DataFrame(columns)


def _entries(report: CapacityReport, group: pd.DataFrame) -> list[CapacityEntry]:
    """The entries behind a group's rows, in the rows' order."""
    named = {(e.configuration, e.temperature, e.top_p, e.axis): e for e in report.entries}
    return [named[key] for key in group[["configuration", "temperature", "top_p", "axis"]].itertuples(index=False,
                                                                                                     name=None)]


def _against_baseline(row: dict, column: str) -> str:
    """A change against the baseline; nothing on the baseline's own row (it is the reference)."""
    return "-" if row["method"] == "baseline" else percent_change(row[column])


def display_probes(probes: pd.DataFrame) -> pd.DataFrame:
    """Every probe of one group, in the order each configuration ran them: the evidence behind each capacity."""
    rows = [(
        row["configuration"], level(row["load"], row["axis"]),
        (row["point_id"] or "-") + (" (reused)" if not missing(row["reused"]) and bool(row["reused"]) else ""),
        tables.fmt(row["n_requests"], "d"), tables.fmt(row["met"], "d"),
        attainment_cell([row["attainment"], row["ci_low"], row["ci_high"]]), row["decision"],
        tables.fmt(row["goodput"], ".2f", " req/s"), tables.fmt(row["tokens_per_s"], ".1f"),
    ) for row in probes.astype({"n_requests": "Int64", "met": "Int64"}).to_dict("records")]
    return pd.DataFrame(rows, columns=["configuration", "load", "point", "requests", "met", "SLO met [CI]",
                                       "decision", "goodput", "tok/s"])


def headlines(report: CapacityReport, group: pd.DataFrame) -> list[str]:
    """The capacity sentence per speculative configuration of one group (temperature, top_p and load axis)."""
    shown = _entries(report, group)
    baseline = next((entry for entry in shown if entry.is_baseline), None)
    return [capacity_sentence(entry, baseline, usd_per_hour=report.usd_per_hour, traffic_rps=report.traffic_rps)
            for entry in shown if not entry.is_baseline]


def caption(report: CapacityReport, axis: str) -> str:
    """What the table says: the target, the SLO, how each end was decided, the price and the traffic."""
    load = "concurrency" if axis == "concurrency" else "request rate"
    slo = ", ".join(f"{key} <= {value:g}" for key, value in report.slo.items()) or "not recorded"
    confidence = f"{report.confidence:.0%} " if report.confidence is not None else ""
    text = (f"Capacity: the highest {load} at which at least {report.target_attainment:.0%} of requests meet the "
            f"SLO ({slo}), where the attainment fitted to every request of every probe (non-increasing in load) "
            f"crosses {report.target_attainment:.0%}; in brackets its {confidence}interval (a bootstrap over "
            "neighbouring requests within each probe, never narrower than the two loads the crossing lies between; "
            "- where it is open). Bracket: the highest load that passed and the lowest that failed, where the "
            "search stopped. Met at low / high end: the share of requests that met the SLO there, with the "
            f"{confidence}confidence interval that decided the probe (the probes list every one)")
    if report.resolution is not None:
        relative = report.resolution_unit == "relative"
        text += "; searched to " + (f"within {report.resolution:.0%} of the load" if relative
                                    else f"{report.resolution:g} {report.resolution_unit or ''}".rstrip())
    text += (". Gain: capacity over the baseline's, with its interval; measurably higher or lower only where the "
             "whole interval lies above or below zero")
    if report.usd_per_hour is not None:
        text += f". $/1M tokens: the cost of 1M output tokens at capacity, at ${report.usd_per_hour:g} per replica-hour"
    if report.traffic_rps is not None and axis == "request_rate":
        text += (f"; replicas: how many serve {number(report.traffic_rps)} requests/s at capacity (in parentheses, at "
                 "the interval's ends)")
    return text + "."


def plot_probes(probes: pd.DataFrame) -> pd.DataFrame:
    """The probe a plot shows per configuration and load (the last: a load probed again with more requests is
    decided by that), by load."""
    last = probes.drop_duplicates(["configuration", "load"], keep="last")
    return last.sort_values(["load"], kind="stable")

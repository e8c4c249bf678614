"""The report's tables of a run under load: where each configuration stops beating the baseline (the crossover,
per load axis) and goodput against the run's SLO, per temperature. Inputs are tables.load_speedups and
tables.by_configuration frames; outputs are DataFrames and the strings every text format shows."""

from __future__ import annotations

import numpy as np
import pandas as pd

from specbench.core import results
from specbench.report import tables

# The two load axes, never one scale: closed loop (requests in flight) and open loop (arrivals per second).
AXES = ("concurrency", "request_rate")
AXIS_NAMES = {"concurrency": "concurrency level", "request_rate": "request rate"}
CROSSOVER_COLUMNS = ("temperature", "top_p", "configuration", "axis", "load", "load_rank", "speedup",
                     "speedup_ci_low", "speedup_ci_high", "next_load")
GOODPUT_COLUMNS = ("temperature", "top_p", "configuration", "load", "load_rank", "request_rate", "goodput",
                   "slo_met_fraction", "slo", "status")


def axis_of(frame: pd.DataFrame) -> pd.Series:
    """Each row's load axis: "request_rate" where it ran at a request rate, else "concurrency"."""
    rate = frame["request_rate"] if "request_rate" in frame else pd.Series(pd.NA, index=frame.index)
    return pd.Series(np.where(rate.notna(), "request_rate", "concurrency"), index=frame.index)


def run_axes(points: pd.DataFrame) -> list[str]:
    """The load axes a run's points lie on, closed loop first."""
    kinds = {order[0] for order in results.load_labels(points)["load_order"]}  # 0: concurrency, 1: request rate
    return [axis for kind, axis in enumerate(AXES) if kind in kinds]


def crossovers(speedups: pd.DataFrame) -> pd.DataFrame:
    """CROSSOVER_COLUMNS, per temperature, top_p, speculative configuration and load axis of tables.load_speedups
    (a concurrency and a request rate are not one scale): the highest level on the axis at which a trusted
    point's 95 % CI lies wholly above 1.0 (it still beats the baseline), and the next level on the axis the
    configuration ran at (NA when none); `load` NA when it beats the baseline at no level of the axis. Unstable,
    failed and mismatched points never count. Closed-loop rows first."""
    speculative = speedups[speedups["method"] != "baseline"].sort_values("load_rank", kind="stable")
    speculative = speculative.assign(axis=axis_of(speculative))
    rows = []
    for (temperature, top_p, name, axis), group in speculative.groupby(
            ["temperature", "top_p", "configuration", "axis"], sort=False):
        beats = group[(group["status"] == "ok") & (group["speedup_ci_low"].astype(float) > 1.0)]
        row = {"temperature": temperature, "top_p": top_p, "configuration": name, "axis": axis}
        if len(beats):
            last = beats.iloc[-1]
            later = group[group["load_rank"] > last["load_rank"]]
            row |= {column: last[column] for column in ("load", "load_rank", "speedup", "speedup_ci_low",
                                                        "speedup_ci_high")}
            row["next_load"] = later["load"].iloc[0] if len(later) else pd.NA
        rows.append(row)
    return pd.DataFrame(rows, columns=CROSSOVER_COLUMNS)


def crossover_line(row: dict) -> str:
    """`ngram g=3 beats the baseline up to concurrency 4 (1.12× [1.05, 1.19]); not at concurrency 8`, `...; at
    every request rate it ran`."""
    name, axis = row["configuration"], AXIS_NAMES[row["axis"]]
    if pd.isna(row["load"]):
        return f"{name} beats the baseline at no {axis} (no 95 % CI wholly above 1.0)"
    head = (f"{name} beats the baseline up to {row['load']} ({row['speedup']:.2f}× "
            f"[{row['speedup_ci_low']:.2f}, {row['speedup_ci_high']:.2f}])")
    return head + (f"; at every {axis} it ran" if pd.isna(row["next_load"]) else f"; not at {row['next_load']}")


def crossover_lines(crossover: pd.DataFrame, temperature: float, top_p: float) -> list[str]:
    """The lines under one temperature's speedup table."""
    mine = crossover[(crossover["temperature"] == temperature) & (crossover["top_p"] == top_p)]
    return [crossover_line(row) for row in mine.to_dict("records")]


# --- goodput -------------------------------------------------------------------------------------


def goodput(points: pd.DataFrame) -> pd.DataFrame:
    """GOODPUT_COLUMNS, one row per point (the baselines too) that has a goodput, in tables.by_configuration's
    order; empty when no point has one (no SLO set, or files from before it)."""
    if "goodput" not in points or points["goodput"].isna().all():
        return pd.DataFrame(columns=GOODPUT_COLUMNS)
    frame = tables.by_configuration(points)
    return frame[frame["goodput"].notna()][list(GOODPUT_COLUMNS)].reset_index(drop=True)


def display_goodput(group: pd.DataFrame) -> pd.DataFrame:
    """One temperature's goodput as strings: a row per configuration (the baseline first), a column per level
    in load order; a cell `1.85 req/s (93%)`: goodput and the fraction of requests that met the SLO."""
    columns = tables.level_columns(group)
    rows = []
    for name, cells in group.groupby("configuration", sort=False):
        by_level = {row["load"]: goodput_cell(row) for row in cells.to_dict("records")}
        rows.append([name, *(by_level.get(level, "-") for level in columns)])
    return pd.DataFrame(rows, columns=["configuration", *columns])


def goodput_cell(row: dict) -> str:
    met = "" if pd.isna(row["slo_met_fraction"]) else f" ({row['slo_met_fraction']:.0%})"
    status = "" if row["status"] == "ok" else f" ({row['status']})"
    return f"{row['goodput']:.2f} req/s{met}{status}"


def goodput_title(group: pd.DataFrame) -> str:
    return f"Goodput, {tables.group_title(group['temperature'].iloc[0], group['top_p'].iloc[0])}"


def goodput_caption(group: pd.DataFrame) -> str:
    slos = [str(slo) for slo in group["slo"].dropna().unique()]
    slo = "; ".join(slos) if slos else "not recorded"
    return (f"Goodput: requests per second that met every SLO ({slo}); in brackets, the fraction of requests "
            "that met it.")

"""Terminal output of `specbench run`: sweep progress (bars; plain lines in a log), the run summary and capacity,
the builtin models and datasets."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from specbench.capacity.document import CapacityDocument
from specbench.capacity.sentence import capacity_sentence
from specbench.core.contention import ADVICE
from specbench.workloads.datasets import DatasetInfo
from specbench.models.registry import BuiltinInfo
from specbench.core import results
from specbench.core.results import PointSpec
from specbench.core.summary import mismatch_warning
from specbench.ui.lines import ProgressStyle, SweepLines, wants_lines


class SweepProgress:
    """Overall points and the current point's requests, each with an ETA (implements SweepObserver)."""

    def __init__(self, console: Console):
        self.console = console
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(), console=console, transient=False,
        )
        self._overall = None
        self._point = None

    def __enter__(self) -> "SweepProgress":
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def message(self, text: str) -> None:
        self.progress.console.print(f"[dim]{escape(text)}[/dim]")

    def sweep_started(self, points: list[PointSpec], to_run: list[PointSpec]) -> None:
        resumed = len(points) - len(to_run)
        if resumed:
            self.message(f"resuming: {resumed} of {len(points)} points already done")
        self._overall = self.progress.add_task("points", total=len(points), completed=resumed)

    def point_started(self, spec: PointSpec, n_requests: int) -> None:
        if self._point is not None:
            self.progress.remove_task(self._point)
        self._point = self.progress.add_task(f"  {spec.point_id}", total=n_requests)

    def request_done(self, spec: PointSpec) -> None:
        self.progress.advance(self._point)

    def point_finished(self, spec: PointSpec, row: dict[str, Any]) -> None:
        self.progress.advance(self._overall)
        if row.get("status") == "failed":
            self.progress.console.print(f"[red]failed[/red] {spec.point_id}: {escape(str(row.get('error')))}")


def sweep_observer(console: Console, style: ProgressStyle = ProgressStyle.auto) -> SweepProgress | SweepLines:
    """Progress bars in a terminal; plain lines in a log (specbench.ui.lines), or as `style` asks."""
    return SweepLines(console) if wants_lines(console, style) else SweepProgress(console)


def fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return "-"
    return f"{value:{spec}}{suffix}"


def best_points_table(points: pd.DataFrame, *, per_temperature: int = 5) -> list[Table]:
    """Per temperature (and top_p, and concurrency where it varies): the fastest points first, the baseline included for reference.
    MAL = mean accepted length (tokens per target step); match = greedy output equals the baseline's; under load
    TTFT/TPOT p99 in ms, and with SLOs goodput in requests/s meeting every one;
    a speedup marked "!" was measured while the machine was not quiet (the point or its baseline)."""
    tables = []
    ok = points[points["status"] == "ok"]
    ok = ok.join(results.load_labels(ok))
    under_load = any(order != (0, 1.0) for order in ok["load_order"])
    with_slo = "goodput" in ok and ok["goodput"].notna().any()
    with_failed = "failed_requests" in ok and ok["failed_requests"].fillna(0).gt(0).any()
    for (temperature, top_p, _, load), group in ok.groupby(["temperature", "top_p", "load_order", "load"], sort=True):
        title = (f"temperature {temperature:g}" + (f", top_p {top_p:g}" if top_p < 1 else "")
                 + (f", {load}" if ok["load"].nunique() > 1 else ""))
        table = Table(title=title, title_justify="left")
        table.add_column("point", no_wrap=True)
        # under load, the tail latencies replace the median TPOT; with SLOs, goodput (requests/s meeting them)
        for column in ("speedup", "95% CI", "tok/s", "accept", "MAL", *(("TTFT p99", "TPOT p99") if under_load
                       else ("TPOT ms",)), "peak MB", "match", *(("goodput", "SLO met") if with_slo else ()),
                       *(("failed",) if with_failed else ())):
            table.add_column(column, justify="right")
        ranked = group.sort_values("speedup", ascending=False, na_position="last")
        best_id = ranked.iloc[0]["point_id"]
        shown = ranked.head(per_temperature)
        if "baseline" not in set(shown["method"]):
            shown = pd.concat([shown, ranked[ranked["method"] == "baseline"]])
        for row in shown.to_dict("records"):
            match = row["outputs_match_baseline"]
            unstable = row.get("unstable") is True
            table.add_row(
                row["point_id"],
                f"{fmt(row['speedup'])}x" + (" [bold yellow]![/bold yellow]" if unstable else ""),
                f"{fmt(row['speedup_ci_low'])}-{fmt(row['speedup_ci_high'])}",
                fmt(row["tokens_per_s"], ".1f"),
                fmt(row["acceptance_rate"], ".0%"),
                fmt(row["mean_accepted_length"]),
                *((fmt(row.get("ttft_ms_p99"), ".0f"), fmt(row.get("tpot_ms_p99"), ".1f")) if under_load
                  else (fmt(row["tpot_ms_p50"], ".1f"),)),
                fmt(row["peak_memory_mb"], ".0f"),
                "-" if match is None or match is pd.NA else ("yes" if match else "[bold red]NO[/bold red]"),
                *((fmt(row.get("goodput"), ".2f"), fmt(row.get("slo_met_fraction"), ".0%")) if with_slo else ()),
                *((fmt(row.get("failed_requests"), "d"),) if with_failed else ()),
                style="bold green" if row["point_id"] == best_id and row["method"] != "baseline" else None,
            )
        tables.append(table)
    return tables


def print_run_summary(console: Console, points: pd.DataFrame, out_dir: str, *, probes: Collection[str] = ()) -> None:
    """The best points per level; a capacity search's probes (`probes`, their point ids) are left to its headline."""
    for table in best_points_table(points[~points["point_id"].isin(list(probes))]):
        console.print(table)
    if probes:
        console.print(f"[dim]{len(probes)} points the capacity search measured at the loads it chose are left out of "
                      "these tables (points.parquet holds them; capacity.json lists every probe)[/dim]")
    failed = points[points["status"] == "failed"]
    for row in failed.to_dict("records"):
        console.print(f"[red]failed[/red] {row['point_id']}: {escape(str(row['error']))}")
    partly = points[(points["status"] == "ok") & points["failed_requests"].fillna(0).gt(0)] \
        if "failed_requests" in points else points.iloc[:0]
    for row in partly.to_dict("records"):  # measured all the same: a failed request counts as missing every SLO
        console.print(f"[yellow]{row['point_id']}: {row['failed_requests']} of {row['failed_requests'] + row['n_requests']} "
                      f"requests failed ({escape(str(row['request_errors']))})[/yellow]")
    mismatched = points[points["outputs_match_baseline"].eq(False).fillna(False)]
    for row in mismatched.to_dict("records"):
        console.print(f"[bold red]{escape(mismatch_warning(row))}[/bold red]")
    print_unstable(console, points)
    console.print(f"results: {escape(str(out_dir))}  ({len(points) - len(failed)} ok, {len(failed)} failed)")


def capacity_lines(document: CapacityDocument) -> list[str]:
    """capacity.json in words, per temperature: each configuration's capacity [interval], its gain over the
    baseline's [interval] and whether that is measurable, and the cost of a million output tokens at capacity (and
    the replicas for the traffic)."""
    slo = ", ".join(f"{name} <= {limit:g}" for name, limit in document.slo.items())
    level = f"{document.confidence:.0%} " if document.confidence is not None else ""
    lines = [f"capacity: the highest load at which {document.target_attainment:.0%} of requests meet {slo}, fitted "
             f"to every probe [{level}interval]"]
    entries = document.configurations
    for temperature, top_p in dict.fromkeys((e.temperature, e.top_p) for e in entries):
        lines.append(f"temperature {temperature:g}" + (f", top_p {top_p:g}" if top_p < 1 else ""))
        for entry in (e for e in entries if (e.temperature, e.top_p) == (temperature, top_p)):
            sentence = capacity_sentence(entry, document.baseline_of(entry), usd_per_hour=document.usd_per_hour,
                                         traffic_rps=document.traffic_rps)
            lines.append("  " + sentence)
    return lines


def print_capacity(console: Console, document: CapacityDocument) -> None:
    for line in capacity_lines(document):
        style = "bold" if not line.startswith("  ") else None
        console.print(escape(line), style=style, highlight=False, soft_wrap=True)


def print_unstable(console: Console, points: pd.DataFrame) -> None:
    """Never a silent speedup from a contended point: say which, why, and what to do."""
    if "unstable" not in points:
        return
    unstable = points[points["unstable"].eq(True).fillna(False)]
    if not len(unstable):
        return
    console.print(f"[bold yellow]! unstable timing at {len(unstable)} of {len(points)} points: their speedups "
                  f"cannot be trusted; {ADVICE}[/bold yellow]")
    for row in unstable.head(8).to_dict("records"):
        console.print(f"[yellow]  {row['point_id']}: {escape(str(row['unstable_reason']))}[/yellow]")
    if len(unstable) > 8:
        console.print(f"[yellow]  ... and {len(unstable) - 8} more (specbench report shows all)[/yellow]")


def print_builtins(console: Console, builtins: list[BuiltinInfo]) -> None:
    table = Table(title="builtin models", title_justify="left")
    for column in ("name", "size", "available", "description"):
        table.add_column(column)
    for info in builtins:
        table.add_row(info.name, f"{info.size_bytes / 2**20:.0f} MB",
                      "yes" if info.available else f"no: specbench models fetch {info.name}", info.description)
    console.print(table)


def print_datasets(console: Console, infos: list[DatasetInfo]) -> None:
    table = Table(title="datasets (workload.prompts = \"builtin:NAME\")", title_justify="left")
    for column in ("name", "package", "available", "description"):
        table.add_column(column)
    for info in infos:
        table.add_row(info.name, info.requirement, str(info.path) if info.available
                      else f"no: specbench datasets fetch {info.name}", info.description)
    console.print(table)

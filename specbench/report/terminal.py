"""The report in a terminal: rich tables. The only report module that imports rich."""

from __future__ import annotations

import pandas as pd
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specbench.report import capacity, load_tables, schedule, tables, trials, workload
from specbench.report.build import Report, RunReport
from specbench.report.text import (display_comparison, display_matrix, mismatch_warning, options_line, unstable_lines,
                                   unstable_warning)

STATUS_STYLE = {"failed": "red", "mismatch": "bold white on red", "unstable": "yellow"}


def print_report(console: Console, report: Report) -> None:
    console.print(f"[dim]{escape(options_line(report))}[/dim]")
    for run_report in report.runs:
        _print_run(console, run_report)
    if report.comparison is not None:
        first, second = (r.run.name for r in report.runs)
        table = _table(display_comparison(report.comparison, first, second),
                       title=f"comparison: {first} -> {second} (faster / slower: 95 % CIs apart)")
        console.print(table)


def _print_run(console: Console, run_report: RunReport) -> None:
    console.rule(f"[bold]{escape(run_report.run.name)}[/bold]")
    console.print(f"[dim]{escape(str(run_report.run.path))}: {escape(run_report.summary)}[/dim]", soft_wrap=True)
    if not len(run_report.table):
        console.print("no points match the filters")
    for (temperature, top_p), group in run_report.table.groupby(["temperature", "top_p"], sort=True):
        styles = ["bold green" if best else STATUS_STYLE.get(status) for best, status in
                  zip(group["best"], group["status"])]
        speedups = run_report.speedups_by_load
        best = f"best per {tables.load_axis(tables.level_columns(speedups))} level" if len(speedups) else "best"
        title = f"{tables.group_title(temperature, top_p)}  ({best} in bold green)"
        console.print(_table(tables.display_points(group), title=title, row_styles=styles))
    _print_load(console, run_report)
    if run_report.capacity is not None:
        _print_capacity(console, run_report.capacity)
    for row in run_report.failed.to_dict("records"):
        console.print(f"[red]failed[/red] {escape(row['point_id'])}: {escape(str(row['error']))}", soft_wrap=True)
    for row in run_report.mismatched:
        console.print(f"[bold red]WARNING: {escape(mismatch_warning(row))}[/bold red]", soft_wrap=True)
    warning = unstable_warning(run_report)
    if warning:
        console.print(f"[bold yellow]{escape(warning)}[/bold yellow]", soft_wrap=True)
        for line in unstable_lines(run_report):
            console.print(f"[yellow]  {escape(line)}[/yellow]", soft_wrap=True)
    if run_report.workload is not None:
        _print_workload(console, run_report.workload)
    matrix = tables.category_matrix(run_report.categories)
    if len(matrix):
        console.print(_table(display_matrix(matrix), title="speedup per workload category"))
    for study in run_report.studies:
        chosen = (study.recommendation or {}).get("trial")
        styles = ["bold green" if number == chosen else "dim" if state != "COMPLETE" else None
                  for number, state in zip(study.trials["number"], study.trials["state"])]
        console.print(_table(trials.display_trials(study), title=f"tune: {study.title}", row_styles=styles))
        console.print(f"[bold]{escape(trials.recommendation_line(study))}[/bold]", soft_wrap=True)
        console.print(escape(trials.importance_line(study)), soft_wrap=True)
        for line in study.failed:
            console.print(f"[red]failed[/red] {escape(line)}", soft_wrap=True)
        if study.not_run:
            console.print(f"[dim]{escape(study.not_run_line)}[/dim]", soft_wrap=True)
        if study.load is not None:
            _print_schedule(console, study, study.load)


def _print_workload(console: Console, report: workload.WorkloadReport) -> None:
    """The workload's facts, a line each, its token lengths, and whose outputs they are."""
    console.print("[bold]workload[/bold]")
    for line in workload.workload_lines(report):
        console.print(f"  {escape(line)}", soft_wrap=True)
    console.print(_table(workload.display_lengths(report), title="token lengths"))
    console.print(f"[dim]{escape(workload.lengths_caption(report))}[/dim]", soft_wrap=True)


def _print_schedule(console: Console, study: trials.StudyReport, load: dict) -> None:
    """A tune under load: the best per level, the crossover, the schedule to paste, its verification."""
    title = schedule.levels_title(study)
    console.print(_table(schedule.display_levels(load), title=title, min_width=len(title)))
    for line in (schedule.crossover_line(load), schedule.single_line(load)):
        if line:
            console.print(escape(line), soft_wrap=True)
    gammas = schedule.display_schedule(load)
    if gammas is not None:
        title = schedule.schedule_title(study)
        console.print(_table(gammas, title=title, min_width=len(title)))
    for line in schedule.schedule_lines(load):
        console.print(escape(line), soft_wrap=True)
    argument = schedule.speculative_config_arg(load)
    if argument:  # one unwrapped, unhighlighted line: copied as it stands
        console.print(argument, markup=False, highlight=False, soft_wrap=True)
    verification = schedule.display_verification(load)
    if verification is not None:
        styles = ["bold red" if worse else None for worse in schedule.worse_rows(verification)]
        title = schedule.verification_title(study)
        console.print(_table(verification, title=title, row_styles=styles, min_width=len(title)))
    verdict = schedule.verification_line(load)
    if verdict:
        console.print(f"[bold]{escape(verdict)}[/bold]", soft_wrap=True)


def _print_load(console: Console, run_report: RunReport) -> None:
    """Speedup against load per temperature with its crossover lines, and goodput per temperature."""
    speedups = run_report.speedups_by_load
    for (temperature, top_p), group in speedups.groupby(["temperature", "top_p"], sort=True):
        display = tables.display_load(group, sep="\n")  # acceptance below the speedup: narrow columns
        styles = [None] * (len(display) - 1) + ["bold green"]  # the last row: the best at each level
        title = tables.load_title(group)
        for part, columns in enumerate(_column_chunks(display, width=console.width)):
            console.print(_table(display[columns], title=title + (" (continued)" if part else ""), row_styles=styles))
        for line in load_tables.crossover_lines(run_report.crossover, temperature, top_p):
            console.print(escape(line), soft_wrap=True)
    if len(speedups):
        console.print(f"[dim]{escape(tables.load_note(tables.level_columns(speedups)))}[/dim]", soft_wrap=True)
    for _, group in run_report.goodput.groupby(["temperature", "top_p"], sort=True):
        display = load_tables.display_goodput(group)
        for part, columns in enumerate(_column_chunks(display, width=console.width)):
            title = load_tables.goodput_title(group) + (" (continued)" if part else "")
            console.print(_table(display[columns], title=title))
        console.print(f"[dim]{escape(load_tables.goodput_caption(group))}[/dim]", soft_wrap=True)


def _print_capacity(console: Console, report: capacity.CapacityReport) -> None:
    """Per temperature: the capacity table, the headline per speculative configuration, what it means, the probes."""
    for group in capacity.groups(report):
        display = capacity.display_capacity(report, group.configurations)
        for part, columns in enumerate(_column_chunks(display, width=console.width)):
            title = group.title + (" (continued)" if part else "")
            console.print(_table(display[columns], title=title, min_width=len(title)))
        for line in capacity.headlines(report, group.configurations):
            console.print(f"[bold]{escape(line)}[/bold]", soft_wrap=True)
        console.print(f"[dim]{escape(capacity.caption(report, group.axis))}[/dim]", soft_wrap=True)
        if len(group.probes):
            display = capacity.display_probes(group.probes)
            for part, columns in enumerate(_column_chunks(display, width=console.width)):
                title = group.probes_title + (" (continued)" if part else "")
                console.print(_table(display[columns], title=title, min_width=len(title)))


def _column_chunks(frame: pd.DataFrame, *, width: int) -> list[list[str]]:
    """The first column with as many of the next as fit `width` (headers unwrapped: rich cannot always wrap them),
    then with the rest: a table with many concurrency levels is split rather than cut off."""
    widths = {column: max(_width(frame[column]), len(str(column))) + 2 for column in frame.columns}
    first, *rest = frame.columns
    chunks: list[list[str]] = [[]]
    for column in rest:
        if chunks[-1] and widths[first] + sum(widths[c] for c in chunks[-1]) + widths[column] > width:
            chunks.append([])
        chunks[-1].append(column)
    return [[first, *chunk] for chunk in chunks]


def _width(values: pd.Series) -> int:
    return max([len(line) for value in values for line in str(value).splitlines()] + [1])


def _table(frame: pd.DataFrame, *, title: str, row_styles: list[str | None] | None = None,
           min_width: int | None = None) -> Table:
    """Compact (no vertical rules) so a point table fits 120 columns; values never wrap, headers may (and the
    title, unless min_width keeps the table as wide as it)."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True,
                  pad_edge=False, min_width=min_width)
    for index, column in enumerate(frame.columns):
        table.add_column(escape(str(column)), justify="left" if index == 0 else "right",
                         min_width=_width(frame[column]))
    for style, row in zip(row_styles or [None] * len(frame), frame.itertuples(index=False)):
        table.add_row(*(escape(str(value)) for value in row), style=style)
    return table

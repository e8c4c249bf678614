"""The report in a terminal: rich tables. The only report module that imports rich."""

from __future__ import annotations

import pandas as pd
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from specbench.report.build import Report
from specbench.report.sections import Lines, Section, Table, Alert, options_line, run_sections, tail_sections

ROW_STYLE = {"best": "bold green", "summary": "bold green", "chosen": "bold green", "failed": "red",
             "mismatch": "bold white on red", "unstable": "yellow", "worse": "bold red", "dim": "dim"}
LINE_STYLE = {"strong": "bold", "note": "dim", "failed": "red"}


def print_report(console: Console, report: Report) -> None:
    console.print(f"[dim]{escape(options_line(report))}[/dim]")
    for run_report in report.runs:
        console.rule(f"[bold]{escape(run_report.run.name)}[/bold]")
        console.print(f"[dim]{escape(str(run_report.run.path))}: {escape(run_report.summary)}[/dim]", soft_wrap=True)
        for section in run_sections(run_report):
            _print_section(console, section)
    for section in tail_sections(report):
        _print_section(console, section)


def _print_section(console: Console, section: Section) -> None:
    if section.title:
        console.print()
        console.print(f"[bold]{escape(section.title)}[/bold]", soft_wrap=True)
    for block in section.blocks:
        if isinstance(block, Table):
            _print_table(console, block, section=section.title)
        elif isinstance(block, Alert):
            style = "bold red" if block.kind == "mismatch" else "bold yellow"
            console.print(f"[{style}]{escape(block.text)}[/{style}]", soft_wrap=True)
            for line in block.details:
                console.print(f"[yellow]  {escape(line)}[/yellow]", soft_wrap=True)
        elif isinstance(block, Lines):
            _print_lines(console, block)
        # Figures: a terminal shows none (the HTML and Markdown reports do)


def _print_lines(console: Console, block: Lines) -> None:
    if block.title:
        console.print(f"[bold]{escape(block.title)}[/bold]", soft_wrap=True)
    for line in block.lines:
        if block.style == "code":  # one unwrapped, unhighlighted line: copied as it stands
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        elif block.style in LINE_STYLE:
            style = LINE_STYLE[block.style]
            console.print(f"[{style}]{escape(line)}[/{style}]", soft_wrap=True)
        else:
            console.print(escape(line), soft_wrap=True)


def _print_table(console: Console, block: Table, *, section: str | None = None) -> None:
    """A table too wide for the console is split into several, the first column in each (the parts after the first
    titled "... (continued)", after the section where the table has no title of its own); then its caption."""
    title = block.title or ""
    if block.legend and "best" in block.roles:
        title += f"  ({block.legend} in bold green)"
    styles = [ROW_STYLE.get(role) for role in block.roles] or None
    chunks = _column_chunks(block.frame, width=console.width) if block.split else [list(block.frame.columns)]
    for part, columns in enumerate(chunks):
        shown = ((title or section or "") + " (continued)") if part else title
        console.print(_table(block.frame[columns], title=shown, row_styles=styles, min_width=len(shown) or None))
    if block.caption:
        console.print(f"[dim]{escape(block.caption)}[/dim]", soft_wrap=True)


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
           min_width: int | None = None) -> RichTable:
    """Compact (no vertical rules) so a point table fits 120 columns; values never wrap, headers may (and the
    title, unless min_width keeps the table as wide as it)."""
    table = RichTable(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True,
                  pad_edge=False, min_width=min_width)
    for index, column in enumerate(frame.columns):
        table.add_column(escape(str(column)), justify="left" if index == 0 else "right",
                         min_width=_width(frame[column]))
    for style, row in zip(row_styles or [None] * len(frame), frame.itertuples(index=False)):
        table.add_row(*(escape(str(value)) for value in row), style=style)
    return table

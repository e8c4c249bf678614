"""`specbench report`: tables, plots and comparisons from the result folders `specbench run` writes.

    folders.py   find and read result folders; skip unreadable ones with a reason
    tables.py    the tables as DataFrames (filter, sort, per category, speedup by load, comparison, Pareto front)
    load_tables.py  under load: the crossover per configuration and load axis, goodput against the SLO
    capacity.py  capacity.json: capacity per configuration, its bracket and probes, gain and cost
    trials.py    a tune's trials, recommendation and importances per study
    schedule.py  a tune under load: best per load level, crossover, gamma schedule, its verification
    workload.py  what a run sent: requests, dataset, shared prefixes, token lengths (prompt, budget, generated)
    build.py     assemble a Report
    sections.py  the report as format-free sections (tables with row roles, lines, warnings, figures), in order
    text.py      Markdown (the sections), CSV, JSON      html.py   one self-contained HTML file (the sections)
    terminal.py  rich tables (the sections)               plots.py  matplotlib figures as PNG
    load_plots.py  the plots against load and around capacity    figures.py  what the plot modules share
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path

from specbench.report.build import Report, RunReport, build_report
from specbench.report.folders import ReportError, Skipped

HTML_FILE = "report.html"


class Format(str, Enum):
    terminal = "terminal"
    md = "md"
    html = "html"
    csv = "csv"
    json = "json"


def render(report: Report, fmt: Format) -> str:
    """The report as md, html, csv or json text (the terminal format is printed by terminal.py)."""
    if fmt == Format.html:
        from specbench.report.html import to_html  # matplotlib loads only when plots are drawn

        return to_html(report)
    from specbench.report import text

    renderers = {Format.md: text.to_markdown, Format.csv: text.to_csv, Format.json: text.to_json}
    if fmt not in renderers:
        raise ReportError(f"--format {fmt.value} is printed, not rendered to text")
    return renderers[fmt](report)


def default_html_path(paths: list[str | Path]) -> Path:
    """Where an HTML report goes without --out: report.html in the first folder given."""
    return Path(paths[0]) / HTML_FILE


__all__ = ["Format", "HTML_FILE", "Report", "ReportError", "RunReport", "Skipped", "build_report",
           "default_html_path", "render"]

"""`specbench report PATH...`: tables and plots from result folders (terminal, Markdown, HTML, CSV, JSON); two
folders are also compared point by point. Reads parquet and JSON only: no torch."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from specbench.cli.common import fail
from specbench.ui.console import console, print_note
from specbench.report import Format, ReportError, build_report, default_html_path, render
from specbench.report.terminal import print_report


def report(
    paths: Annotated[list[str], typer.Argument(
        metavar="PATH", help="Result folders written by `specbench run`, or folders holding them.")],
    fmt: Annotated[Format, typer.Option(
        "--format", help="terminal: rich tables. md, csv, json: to --out or stdout. html: one self-contained file "
                         "with plots, to --out or else report.html in the first PATH.")] = Format.terminal,
    out: Annotated[Optional[Path], typer.Option(help="Write the report to this file (md, html, csv, json).")] = None,
    sort: Annotated[str, typer.Option(
        help="Point column to sort by: descending for speedup, tokens/s and acceptance, ascending otherwise "
             "(latency, memory).")] = "speedup",
    filters: Annotated[Optional[list[str]], typer.Option(
        "--filter", help="KEY=VALUE, repeatable (method=draft, temperature=0, draft=ngram): one key repeated "
                         "matches any of its values; different keys must all match.")] = None,
    top: Annotated[Optional[int], typer.Option(help="Show the first N points per temperature.")] = None,
    acceptance_from: Annotated[Optional[Path], typer.Option(
        "--acceptance-from", help="A result folder where the drafts' per-position acceptance was measured (another "
                                  "backend, machine or workload; same target): predict their speedup on the "
                                  "surface that PATH measured with imposed acceptance.")] = None,
) -> None:
    """Tables and plots from result folders; exactly two folders are also compared point by point."""
    if out is not None and fmt == Format.terminal:
        fail("--out needs --format md, html, csv or json")
    try:
        built = build_report(paths, filters=filters or [], sort=sort, top=top, acceptance_from=acceptance_from)
    except ReportError as error:
        fail(str(error))
    notes = console(stderr=True)
    for skipped in built.skipped:
        print_note(notes, str(skipped))
    if fmt == Format.terminal:
        print_report(console(), built)
        return
    text = render(built, fmt)
    target = out or (default_html_path(paths) if fmt == Format.html else None)
    if target is None:
        sys.stdout.write(text)
        return
    try:
        target.write_text(text)
    except OSError as error:
        fail(f"cannot write {target}: {error.strerror}")
    print_note(notes, f"wrote {target}")

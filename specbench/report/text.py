"""Markdown, CSV and JSON renderings of a report."""

from __future__ import annotations

import base64
import json
from dataclasses import asdict
from typing import Any

import pandas as pd

from specbench.core.summary import mismatch_warning
from specbench.report import capacity, trials, workload
from specbench.report.build import Report, RunReport
from specbench.report.sections import (Block, Figures, Section, Table, Alert, options_line, run_sections,
                                       tail_sections, unstable_warning)


# --- markdown ------------------------------------------------------------------------------------


def to_markdown(report: Report) -> str:
    lines = ["# specbench report", "", options_line(report), ""]
    for run_report in report.runs:
        lines += [f"## {run_report.run.name}", "", f"`{run_report.run.path}`: {run_report.summary}", ""]
        if run_report.launches:
            lines += ["Server launches:", ""] + [f"- `{launch['point']}`: `{launch['command']}` (log "
                                                 f"`{launch['log']}`)" for launch in run_report.launches] + [""]
        for section in run_sections(run_report):
            lines += _section(section, level=3)
    for section in tail_sections(report):
        lines += _section(section, level=2)
    return "\n".join(lines)


def _section(section: Section, *, level: int) -> list[str]:
    lines = [f"{'#' * level} {section.title}", ""] if section.title else []
    for block in section.blocks:
        lines += _block(block, level=level)
    return lines


def _block(block: Block, *, level: int) -> list[str]:
    if isinstance(block, Table):
        lines = [f"{'#' * level} {block.title}", ""] if block.title else []
        lines += markdown_table(_emphasised(block)) + [""]
        return lines + ([block.caption, ""] if block.caption else [])
    if isinstance(block, Alert):
        return [f"> **{block.text}**"] + ([">"] + [f"> - {_cell(line)}" for line in block.details]
                                          if block.details else []) + [""]
    if isinstance(block, Figures):
        return [line for plot in block.make() for line in _figure(plot, level=level)] if block.in_markdown else []
    head = ([f"{'#' * level} {block.title}", ""] if block.style != "failed" else [f"{block.title}:", ""]) \
        if block.title else []
    if not block.lines:
        return head
    if block.style == "code":
        return head + ["```sh", *block.lines, "```", ""]
    if block.style == "strong":
        return head + [f"**{_cell(line)}**" for line in block.lines] + [""]
    if block.style in ("list", "failed"):
        return head + [f"- {_cell(line)}" for line in block.lines] + [""]
    return head + [_cell(line) for line in block.lines] + [""]


def _emphasised(table: Table) -> pd.DataFrame:
    """Markdown has no row colours: the best point's name in bold with "(best)", a status that voids the speed in
    bold, the best-per-level row and a lost verification level in bold."""
    frame = table.frame.copy()
    if table.roles and "status" in frame.columns:
        frame["status"] = frame["status"].replace({"mismatch": "**MISMATCH**", "failed": "**failed**",
                                                   "unstable": "**unstable**"})
    for index, role in enumerate(table.roles):
        if role == "best":
            frame.iloc[index, 0] = f"**{frame.iloc[index, 0]}** (best)"
        elif role == "summary":
            frame.iloc[index] = [f"**{cell}**" for cell in frame.iloc[index]]
        elif role == "worse":
            frame.iloc[index] = [f"**{cell}**" if cell == "WORSE" else cell for cell in frame.iloc[index]]
    return frame


def _figure(plot, *, level: int) -> list[str]:
    """Inline, as in the HTML: renderers that allow data URIs show it (GitHub's does not)."""
    if isinstance(plot, tuple):
        title, reason = plot
        return [f"{'#' * level} {title}", "", f"_{reason}_", ""]
    data = base64.b64encode(plot.png).decode("ascii")
    return [f"{'#' * level} {plot.title}", "", f"![{plot.title}](data:image/png;base64,{data})", "", plot.caption, ""]


def markdown_table(frame: pd.DataFrame) -> list[str]:
    """A GitHub table; the first column left-aligned, the others right-aligned."""
    header = "| " + " | ".join(_cell(str(c)) for c in frame.columns) + " |"
    rule = "|" + "|".join(":--" if i == 0 else "--:" for i in range(len(frame.columns))) + "|"
    body = ["| " + " | ".join(_cell(str(v)) for v in row) + " |" for row in frame.itertuples(index=False)]
    return [header, rule, *body]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# --- csv and json --------------------------------------------------------------------------------


def to_csv(report: Report) -> str:
    """The point tables, one row per shown point, a `run` column first."""
    return report.points_table().to_csv(index=False)


def to_json(report: Report) -> str:
    document: dict[str, Any] = {
        "sort": report.sort,
        "filters": [f"{f.key}={f.value}" for f in report.filters],
        "runs": [{"run": r.run.name, "path": str(r.run.path), "summary": r.summary,
                  "workload": _workload_json(r.workload), "mismatched": [row["point_id"] for row in r.mismatched],
                  "warnings": _warnings(r),
                  "unstable": [{"reason": reason, "points": points} for reason, points in r.unstable_reasons]}
                 for r in report.runs],
        "points": _records(report.points_table()),
        "category_speedups": _records(pd.concat(
            [r.categories.assign(run=r.run.name) for r in report.runs], ignore_index=True)),
        "comparison": _records(report.comparison) if report.comparison is not None else None,
        "tune": [_study_json(r.run.name, study) for r in report.runs for study in r.studies],
        "skipped": [{"path": str(s.path), "reason": s.reason} for s in report.skipped],
    }
    if any(len(r.across_gamma) for r in report.runs):
        document["across_gamma"] = _records(pd.concat([r.across_gamma.assign(run=r.run.name) for r in report.runs
                                                       if len(r.across_gamma)], ignore_index=True))
    if any(r.whatif is not None for r in report.runs):  # acceptance what-ifs: surface, break-even, predictions
        document["whatif"] = [{"run": r.run.name, "source": r.whatif.source,
                               "surface": _records(r.whatif.surface.drop(columns=[c for c in r.whatif.surface
                                                                                    if c.startswith("series_")])),
                               "break_even": _records(r.whatif.break_even),
                               "predictions": _records(r.whatif.predictions)}
                              for r in report.runs if r.whatif is not None]
    if any(r.capacity is not None for r in report.runs):  # without capacity.json, nothing changes
        document["capacity"] = [_capacity_json(r.run.name, r.capacity) for r in report.runs if r.capacity is not None]
    return json.dumps(document, indent=2) + "\n"


def _warnings(run_report: RunReport) -> list[str]:
    unstable = unstable_warning(run_report)
    return [mismatch_warning(row) for row in run_report.mismatched] + ([unstable] if unstable else [])


def _capacity_json(run: str, report: capacity.CapacityReport) -> dict[str, Any]:
    return {"run": run, "target_attainment": report.target_attainment, "confidence": report.confidence,
            "slo": report.slo, "resolution": report.resolution, "resolution_unit": report.resolution_unit,
            "usd_per_hour": report.usd_per_hour, "traffic_rps": report.traffic_rps,
            "headlines": [line for group in capacity.groups(report)
                          for line in capacity.headlines(report, group.configurations)],
            "configurations": [asdict(entry) for entry in report.entries]}  # as capacity.json holds them, probes included


def _workload_json(report: workload.WorkloadReport | None) -> dict[str, Any] | None:
    if report is None:
        return None
    return {"stats": report.stats, "lengths": _records(report.lengths), "generated_by": report.generated_by,
            "generated_requests": report.generated_requests}


def _study_json(run: str, study: trials.StudyReport) -> dict[str, Any]:
    return {"run": run, "study": study.study, "temperature": study.temperature, "top_p": study.top_p,
            "objective": study.objective, "direction": study.direction, "recommendation": study.recommendation,
            "importances": study.importances, "importance_note": study.importance_note,
            "trials_not_run": study.not_run, "trials": _records(study.trials)}


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return json.loads(frame.to_json(orient="records"))

"""Markdown, CSV and JSON renderings of a report."""

from __future__ import annotations

import base64
import json
from dataclasses import asdict
from typing import Any

import pandas as pd

from specbench.core.contention import ADVICE
from specbench.report import capacity, load_tables, predictions, schedule, tables, trials, workload
from specbench.report.build import Report, RunReport
from specbench.core.summary import mismatch_warning


def unstable_warning(run_report: RunReport) -> str | None:
    """One warning for every point whose timing is not trusted (unstable_lines says which and why); None when
    there is none."""
    if not run_report.unstable:
        return None
    return (f"unstable timing at {len(run_report.unstable)} of {len(run_report.points)} points: their speedups "
            f"cannot be trusted; {ADVICE}")


def unstable_lines(run_report: RunReport) -> list[str]:
    """`ngram-g3-t0-p1-c4, self-g1-t0-p1-r1: other processes used 40% of the CPU`: a line per reason."""
    return [f"{', '.join(points)}: {reason}" for reason, points in run_report.unstable_reasons]


def options_line(report: Report) -> str:
    filters = ", ".join(f"{f.key}={f.value}" for f in report.filters)
    return (f"sorted by {report.sort}" + (f"; top {report.top} per temperature" if report.top else "")
            + (f"; filters: {filters}" if filters else ""))


# --- markdown ------------------------------------------------------------------------------------


def to_markdown(report: Report) -> str:
    lines = ["# specbench report", "", options_line(report), ""]
    for run_report in report.runs:
        lines += _run_markdown(run_report)
    if report.comparison is not None:
        first, second = (r.run.name for r in report.runs)
        lines += [f"## Comparison: {first} -> {second}", "",
                  f"change = speedup in {second} - speedup in {first}; faster / slower when the 95 % CIs do not "
                  "overlap.", ""]
        lines += markdown_table(display_comparison(report.comparison, first, second)) + [""]
    if report.skipped:
        lines += ["## Skipped", ""] + [f"- {_cell(str(s))}" for s in report.skipped] + [""]
    return "\n".join(lines)


def _run_markdown(run_report: RunReport) -> list[str]:
    lines = [f"## {run_report.run.name}", "", f"`{run_report.run.path}`: {run_report.summary}", ""]
    if run_report.launches:
        lines += ["Server launches:", ""] + [f"- `{launch['point']}`: `{launch['command']}` (log `{launch['log']}`)"
                                             for launch in run_report.launches] + [""]
    if not len(run_report.table):
        lines += ["No points match the filters.", ""]
    for (temperature, top_p), group in run_report.table.groupby(["temperature", "top_p"], sort=True):
        display = tables.display_points(group)
        display["point"] = [f"**{p}** (best)" if best else p for p, best in zip(display["point"], group["best"])]
        display["status"] = display["status"].replace({"mismatch": "**MISMATCH**", "failed": "**failed**",
                                                       "unstable": "**unstable**"})
        lines += [f"### {tables.group_title(temperature, top_p)}", ""] + markdown_table(display) + [""]
    lines += _load_markdown(run_report)
    if run_report.capacity is not None:
        lines += _capacity_markdown(run_report.capacity)
    if len(run_report.failed):
        lines += ["Failed points:", ""]
        lines += [f"- `{row['point_id']}`: {_cell(str(row['error']))}" for row in run_report.failed.to_dict("records")]
        lines += [""]
    for row in run_report.mismatched:
        lines += [f"> **WARNING: {mismatch_warning(row)}.**", ""]
    warning = unstable_warning(run_report)
    if warning:
        lines += [f"> **{warning}.**", ">"] + [f"> - {_cell(line)}" for line in unstable_lines(run_report)] + [""]
    if run_report.workload is not None:
        lines += _workload_markdown(run_report.workload)
    if len(run_report.across_gamma):
        lines += ["### Predicted from the largest gamma", "", predictions.caption(run_report.across_gamma), ""]
        lines += markdown_table(predictions.display(run_report.across_gamma)) + [""]
    matrix = tables.category_matrix(run_report.categories)
    if len(matrix):
        lines += ["### Speedup per workload category", ""]
        lines += markdown_table(display_matrix(matrix)) + [""]
    for study in run_report.studies:
        lines += _study_markdown(study)
    return lines


def _load_markdown(run_report: RunReport) -> list[str]:
    """Speedup against load, a table per temperature with its crossover lines; goodput per temperature; their
    plots. Nothing for a run at one level without an SLO."""
    lines = []
    speedups = run_report.speedups_by_load
    for (temperature, top_p), group in speedups.groupby(["temperature", "top_p"], sort=True):
        display = tables.display_load(group)
        display.iloc[-1] = [f"**{cell}**" for cell in display.iloc[-1]]  # the best at each level
        lines += [f"### {tables.load_title(group)}", ""] + markdown_table(display) + [""]
        crossover = load_tables.crossover_lines(run_report.crossover, temperature, top_p)
        lines += [f"- {_cell(line)}" for line in crossover] + ([""] if crossover else [])
    if len(speedups):
        lines += [tables.load_note(tables.level_columns(speedups)), ""]
    for _, group in run_report.goodput.groupby(["temperature", "top_p"], sort=True):
        lines += [f"### {load_tables.goodput_title(group)}", ""]
        lines += markdown_table(load_tables.display_goodput(group)) + ["", load_tables.goodput_caption(group), ""]
    if not len(speedups) and not len(run_report.goodput):
        return lines
    from specbench.report import load_plots  # matplotlib loads only when there is a plot to draw

    for plot in load_plots.load_plots(run_report.points):
        if isinstance(plot, tuple):
            title, reason = plot
            lines += [f"### {title}", "", f"_{reason}_", ""]
        else:  # inline, as in the HTML: renderers that allow data URIs show it (GitHub's does not)
            data = base64.b64encode(plot.png).decode("ascii")
            lines += [f"### {plot.title}", "", f"![{plot.title}](data:image/png;base64,{data})", "", plot.caption, ""]
    return lines


def _capacity_markdown(report: capacity.CapacityReport) -> list[str]:
    """Per temperature: the headline per speculative configuration, the capacity table, what it means, the probes."""
    lines = []
    for group in capacity.groups(report):
        lines += [f"### {group.title}", ""]
        lines += [f"- {_cell(line)}" for line in capacity.headlines(report, group.configurations)] + [""]
        lines += markdown_table(capacity.display_capacity(report, group.configurations))
        lines += ["", capacity.caption(report, group.axis), ""]
        if len(group.probes):
            lines += [f"### {group.probes_title}", ""] + markdown_table(capacity.display_probes(group.probes)) + [""]
    return lines


def _workload_markdown(report: workload.WorkloadReport) -> list[str]:
    facts = [f"- {_cell(line)}" for line in workload.workload_lines(report)]
    lines = ["### Workload", ""] + facts + ([""] if facts else []) + markdown_table(workload.display_lengths(report))
    return lines + ["", workload.lengths_caption(report), ""]


def _study_markdown(study: trials.StudyReport) -> list[str]:
    lines = [f"### Tune: {study.title}", "", f"**{_cell(trials.recommendation_line(study))}**", "",
             _cell(trials.importance_line(study)), ""]
    if study.not_run:
        lines += [study.not_run_line, ""]
    lines += markdown_table(trials.display_trials(study)) + [""]
    if study.failed:
        lines += ["Failed trials:", ""] + [f"- {_cell(line)}" for line in study.failed] + [""]
    return lines + (_schedule_markdown(study, study.load) if study.load is not None else [])


def _schedule_markdown(study: trials.StudyReport, load: dict[str, Any]) -> list[str]:
    """A tune under load: the best per level, the crossover, the schedule to paste, its verification."""
    lines = [f"### {schedule.levels_title(study)}", ""] + markdown_table(schedule.display_levels(load)) + [""]
    lines += [f"- {_cell(line)}" for line in (schedule.crossover_line(load), schedule.single_line(load)) if line]
    lines += ["", f"### {schedule.schedule_title(study)}", ""]
    gammas = schedule.display_schedule(load)
    if gammas is not None:
        lines += markdown_table(gammas) + [""]
    lines += [f"- {_cell(line)}" for line in schedule.schedule_lines(load)] + [""]
    argument = schedule.speculative_config_arg(load)
    if argument:
        lines += ["```sh", argument, "```", ""]
    verification = schedule.display_verification(load)
    if verification is not None:
        verification["worse"] = verification["worse"].replace({"WORSE": "**WORSE**"})
        lines += [f"### {schedule.verification_title(study)}", ""] + markdown_table(verification) + [""]
    verdict = schedule.verification_line(load)
    return lines + ([f"**{_cell(verdict)}**", ""] if verdict else [])


def markdown_table(frame: pd.DataFrame) -> list[str]:
    """A GitHub table; the first column left-aligned, the others right-aligned."""
    header = "| " + " | ".join(_cell(str(c)) for c in frame.columns) + " |"
    rule = "|" + "|".join(":--" if i == 0 else "--:" for i in range(len(frame.columns))) + "|"
    body = ["| " + " | ".join(_cell(str(v)) for v in row) + " |" for row in frame.itertuples(index=False)]
    return [header, rule, *body]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def display_matrix(matrix: pd.DataFrame) -> pd.DataFrame:
    """The category matrix as strings, the point as the first column."""
    shown = matrix.map(lambda v: tables.fmt(v, ".2f", "x"))
    return shown.reset_index()


def display_comparison(comparison: pd.DataFrame, name_a: str, name_b: str) -> pd.DataFrame:
    """One row per compared point; a concurrency column after the point when the runs have several concurrency
    levels, a load column ("2 requests/s") once a request rate is among them."""
    rows = [(
        row["point_id"],
        tables.fmt(row["speedup_a"], ".2f", "x"),
        tables.fmt_ci(row["speedup_ci_low_a"], row["speedup_ci_high_a"]),
        tables.fmt(row["speedup_b"], ".2f", "x"),
        tables.fmt_ci(row["speedup_ci_low_b"], row["speedup_ci_high_b"]),
        tables.fmt(row["change"], "+.2f"),
        row["verdict"],
    ) for row in comparison.to_dict("records")]
    shown = pd.DataFrame(rows, columns=["point", f"speedup {name_a}", f"95% CI {name_a}", f"speedup {name_b}",
                                        f"95% CI {name_b}", "change", "verdict"])
    if comparison["concurrency"].isna().any():
        shown.insert(1, "load", list(comparison["load"]))
    elif comparison["concurrency"].nunique() > 1:
        shown.insert(1, "concurrency", [str(level) for level in comparison["concurrency"]])
    return shown


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

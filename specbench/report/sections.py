"""The report as format-free sections: what each part of a run's report shows, in order, once — tables of strings
with a role per row, lines with a style, warnings, figures. The terminal, Markdown and HTML render the same sections
(terminal.py, text.py, html.py); none of them decides what a section holds.

Row roles: `best` (the best point of its group), `summary` (the best-per-level row of a load table), `chosen` (the
tune's chosen trial), `failed`, `mismatch`, `unstable`, `worse` (a verification level the schedule lost), `dim` (a
trial that did not complete)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import pandas as pd

from specbench.core.contention import ADVICE
from specbench.core.summary import mismatch_warning
from specbench.report import capacity, load_tables, predictions, schedule, tables, trials, whatif, workload
from specbench.report.build import Report, RunReport

if TYPE_CHECKING:
    from specbench.report.figures import Plot  # matplotlib: loaded only where figures are drawn

Role = Literal["best", "summary", "chosen", "failed", "mismatch", "unstable", "worse", "dim"]


@dataclass(frozen=True)
class Table:
    frame: pd.DataFrame  # every cell a string, as shown ("\n" splits a cell in two lines where a format can)
    title: str | None = None
    roles: tuple[Role | None, ...] = ()  # per row
    caption: str | None = None  # what the table means, under it
    folded: bool = False  # folded away where a format can (the probes behind a capacity)
    legend: str | None = None  # what the `best` rows are, where a format marks them by colour alone
    split: bool = False  # a column per load level or probe figure: split into several where the width is fixed


@dataclass(frozen=True)
class Lines:
    lines: tuple[str, ...]
    style: Literal["list", "strong", "plain", "note", "failed", "code"] = "list"
    title: str | None = None


@dataclass(frozen=True)
class Alert:
    text: str
    details: tuple[str, ...] = ()  # a line each (which points, why)
    kind: Literal["mismatch", "unstable"] = "mismatch"


@dataclass(frozen=True)
class Figures:
    """Plots, drawn only by the formats that show them (matplotlib loads then); a (title, why not drawn) pair where
    there was nothing to draw."""

    make: Callable[[], list[Plot | tuple[str, str]]]
    in_markdown: bool = False  # Markdown inlines only the plots its tables need (those against load)


Block = Table | Lines | Alert | Figures


@dataclass(frozen=True)
class Section:
    title: str | None
    blocks: tuple[Block, ...]


def run_sections(run_report: RunReport) -> list[Section]:
    """One run's report, in order: warnings, the points per temperature, under load, capacity, failures, the
    workload, predictions, categories, the figures, the tune."""
    found = [Section(None, tuple(_warnings(run_report)))]
    if not len(run_report.table):
        found.append(Section(None, (Lines(("No points match the filters.",), "plain"),)))
    found += _points(run_report)
    found += _load(run_report)
    if run_report.capacity is not None:
        found += _capacity(run_report.capacity)
    if len(run_report.failed):
        found.append(Section(None, (Lines(tuple(f"{row['point_id']}: {row['error']}" for row in
                                               run_report.failed.to_dict("records")), "failed", "Failed points"),)))
    if run_report.workload is not None:
        found.append(_workload(run_report.workload))
    if len(run_report.across_gamma):
        found.append(Section("Predicted from the largest gamma", (
            Lines((predictions.caption(run_report.across_gamma),), "plain"),
            Table(predictions.display(run_report.across_gamma)))))
    if run_report.whatif is not None:
        found += _whatif(run_report.whatif)
    matrix = tables.category_matrix(run_report.categories)
    if len(matrix):
        found.append(Section(None, (Table(display_matrix(matrix), "Speedup per workload category"),)))
    found.append(Section(None, (Figures(lambda: _plots().all_plots(run_report.points, run_report.categories,
                                                                  load=False)),)))
    if run_report.studies:
        found += [_study(study) for study in run_report.studies]
        found.append(Section(None, (Figures(lambda: _plots().tune_plots(run_report.studies)),)))
    return [section for section in found if section.blocks]


def _whatif(what) -> list[Section]:
    found = [Section("What-if: speedup against imposed acceptance", (
        Table(whatif.display_surface(what.surface), caption=whatif.SURFACE_CAPTION),))]
    if len(what.break_even):
        found.append(Section("Break-even acceptance", (
            Table(whatif.display_break_even(what.break_even), caption=whatif.BREAK_EVEN_CAPTION),)))
    if len(what.predictions):
        found.append(Section("Predicted from measured acceptance", (
            Table(whatif.display_predictions(what.predictions), caption=whatif.prediction_caption(what)),)))
    found.append(Section(None, (Figures(lambda: [whatif.surface_plot(what) or
                                                 ("Speedup against acceptance", "Not drawn: no surface.")]),)))
    return found


def tail_sections(report: Report) -> list[Section]:
    """After the runs: the comparison of two runs, the folders skipped."""
    found = []
    if report.comparison is not None:
        first, second = (r.run.name for r in report.runs)
        found.append(Section(f"Comparison: {first} -> {second}", (
            Lines((f"change = speedup in {second} - speedup in {first}; faster / slower when the 95 % CIs do not "
                   "overlap.",), "plain"),
            Table(display_comparison(report.comparison, first, second)))))
    if report.skipped:
        found.append(Section("Skipped", (Lines(tuple(str(s) for s in report.skipped), "list"),)))
    return found


def options_line(report: Report) -> str:
    filters = ", ".join(f"{f.key}={f.value}" for f in report.filters)
    return (f"sorted by {report.sort}" + (f"; top {report.top} per temperature" if report.top else "")
            + (f"; filters: {filters}" if filters else ""))


def unstable_warning(run_report: RunReport) -> str | None:
    """One warning for every point whose timing is not trusted (its details say which and why); None when there is
    none."""
    if not run_report.unstable:
        return None
    return (f"unstable timing at {len(run_report.unstable)} of {len(run_report.points)} points: their speedups "
            f"cannot be trusted; {ADVICE}")


# --- the sections --------------------------------------------------------------------------------


def _warnings(run_report: RunReport) -> list[Alert]:
    found = [Alert(f"WARNING: {mismatch_warning(row)}.") for row in run_report.mismatched]
    text = unstable_warning(run_report)
    if text:
        found.append(Alert(f"{text}.", tuple(f"{', '.join(points)}: {reason}"
                                               for reason, points in run_report.unstable_reasons), "unstable"))
    return found


def _points(run_report: RunReport) -> list[Section]:
    speedups = run_report.speedups_by_load
    best = f"best per {tables.load_axis(tables.level_columns(speedups))} level" if len(speedups) else "best"
    found = []
    for (temperature, top_p), group in run_report.table.groupby(["temperature", "top_p"], sort=True):
        roles = tuple("best" if is_best else status if status != "ok" else None
                      for is_best, status in zip(group["best"], group["status"]))
        found.append(Section(None, (Table(tables.display_points(group), tables.group_title(temperature, top_p), roles,
                                          legend=best),)))
    return found


def _load(run_report: RunReport) -> list[Section]:
    """Speedup against load per temperature with its crossover lines, goodput per temperature, their figures."""
    found = []
    speedups = run_report.speedups_by_load
    for (temperature, top_p), group in speedups.groupby(["temperature", "top_p"], sort=True):
        display = tables.display_load(group, sep="\n")  # acceptance below the speedup where a cell has two lines
        crossover = load_tables.crossover_lines(run_report.crossover, temperature, top_p)
        found.append(Section(None, (Table(display, tables.load_title(group), (None,) * (len(display) - 1) + ("summary",),
                                          split=True),
                                    *([Lines(tuple(crossover))] if crossover else []))))
    if len(speedups):
        found.append(Section(None, (Lines((tables.load_note(tables.level_columns(speedups)),), "note"),)))
    for _, group in run_report.goodput.groupby(["temperature", "top_p"], sort=True):
        found.append(Section(None, (Table(load_tables.display_goodput(group), load_tables.goodput_title(group),
                                          caption=load_tables.goodput_caption(group), split=True),)))
    if len(speedups) or len(run_report.goodput):
        found.append(Section(None, (Figures(lambda: _load_plots().load_plots(run_report.points), in_markdown=True),)))
    return found


def _capacity(report: capacity.CapacityReport) -> list[Section]:
    """Per temperature and load axis: the sentence per speculative configuration, the table and what it means, the
    figure, the probes behind it."""
    found = []
    for group in capacity.groups(report):
        blocks: list[Block] = [Lines(tuple(capacity.headlines(report, group.configurations)), "list"),
                               Table(capacity.display_capacity(report, group.configurations),
                                     caption=capacity.caption(report, group.axis), split=True),
                               Figures(lambda group=group: _capacity_plot(report, group))]
        if len(group.probes):
            blocks.append(Table(capacity.display_probes(group.probes), group.probes_title, folded=True, split=True))
        found.append(Section(group.title, tuple(blocks)))
    return found


def _capacity_plot(report: capacity.CapacityReport, group: capacity.CapacityGroup) -> list[Plot]:
    from specbench.report import load_plots  # matplotlib loads only where figures are drawn

    plot = load_plots.capacity_plot(report, group)
    return [plot] if plot is not None else []


def _plots():
    from specbench.report import plots  # matplotlib loads only where figures are drawn

    return plots


def _load_plots():
    from specbench.report import load_plots

    return load_plots


def _workload(report: workload.WorkloadReport) -> Section:
    return Section("Workload", (Lines(tuple(workload.workload_lines(report)), "list"),
                                Table(workload.display_lengths(report), caption=workload.lengths_caption(report))))


def _study(study: trials.StudyReport) -> Section:
    chosen = (study.recommendation or {}).get("trial")
    roles = tuple("chosen" if number == chosen else "dim" if state != "COMPLETE" else None
                  for number, state in zip(study.trials["number"], study.trials["state"]))
    blocks: list[Block] = [Lines((trials.recommendation_line(study),), "strong"),
                           Lines((trials.importance_line(study),), "plain")]
    if study.not_run:
        blocks.append(Lines((study.not_run_line,), "note"))
    blocks.append(Table(trials.display_trials(study), roles=roles))
    if study.failed:
        blocks.append(Lines(tuple(study.failed), "failed", "Failed trials"))
    if study.load is not None:
        blocks += _schedule(study, study.load)
    return Section(f"Tune: {study.title}", tuple(blocks))


def _schedule(study: trials.StudyReport, load: dict) -> list[Block]:
    """A tune under load: the best per level, the crossover, the schedule to paste, its verification."""
    notes = tuple(line for line in (schedule.crossover_line(load), schedule.single_line(load)) if line)
    blocks: list[Block] = [Table(schedule.display_levels(load), schedule.levels_title(study)),
                           *([Lines(notes)] if notes else [])]
    gammas = schedule.display_schedule(load)
    title = schedule.schedule_title(study)
    blocks.append(Table(gammas, title) if gammas is not None else Lines((), "list", title))
    blocks.append(Lines(tuple(schedule.schedule_lines(load)), "list"))
    argument = schedule.speculative_config_arg(load)
    if argument:
        blocks.append(Lines((argument,), "code"))
    verification = schedule.display_verification(load)
    if verification is not None:
        roles = tuple("worse" if worse else None for worse in schedule.worse_rows(verification))
        blocks.append(Table(verification, schedule.verification_title(study), roles))
    verdict = schedule.verification_line(load)
    if verdict:
        blocks.append(Lines((verdict,), "strong"))
    return blocks


# --- tables of strings ---------------------------------------------------------------------------


def display_matrix(matrix: pd.DataFrame) -> pd.DataFrame:
    """The category matrix as strings, the point as the first column."""
    return matrix.map(lambda v: tables.fmt(v, ".2f", "x")).reset_index()


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

"""The HTML report: one self-contained file (inline CSS, plots as base64 PNG data URIs, no network)."""

from __future__ import annotations

import base64
from html import escape

import pandas as pd

from specbench.report import (capacity, figures, load_plots, load_tables, plots, predictions, schedule, tables, trials,
                              workload)
from specbench.report.build import Report, RunReport
from specbench.report.text import (display_comparison, display_matrix, mismatch_warning, options_line, unstable_lines,
                                   unstable_warning)

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 2em; }
.meta { color: #666; }
.table-scroll { overflow-x: auto; max-width: 100%; margin: 0.5em 0 1.5em; }  /* a wide table scrolls in its box */
table { border-collapse: collapse; font-size: 0.9em; }
th, td { padding: 0.3em 0.7em; border-bottom: 1px solid #e3e3e3; text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
th { background: #f4f4f4; }
tr.best td { background: #e3f5e6; font-weight: bold; }
tr.failed td { color: #999; }
tr.mismatch td { background: #fde2e2; color: #a00; font-weight: bold; }
tr.unstable td { background: #fff6d6; }
tr.worse td { background: #fde2e2; color: #a00; }
.warning { background: #fde2e2; border-left: 6px solid #c00; padding: 0.6em 1em; color: #900; font-weight: bold; }
.warning ul { margin: 0.4em 0 0; font-weight: normal; }
details.launches code { white-space: pre-wrap; word-break: break-all; }
figure { margin: 1em 0 2em; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
.missing { color: #888; font-style: italic; }
"""

# Records, for automated checks, whether each image decoded, any error the page raised, the page's width
# against the window's and how many tables scroll sideways in their own box.
SCRIPT = """
window.addEventListener("error", function (event) {
  var root = document.documentElement, what = event.message || ("failed to load " + (event.target.tagName || "?"));
  root.dataset.errors = (root.dataset.errors || "") + what + "; ";
}, true);
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images), decoded = 0;
  images.forEach(function (image) {
    image.dataset.naturalWidth = image.naturalWidth;
    image.dataset.naturalHeight = image.naturalHeight;
    if (image.complete && image.naturalWidth > 0) { decoded += 1; }
  });
  var root = document.documentElement, boxes = document.querySelectorAll(".table-scroll"), scrolling = 0;
  root.dataset.imagesDecoded = decoded + "/" + images.length;
  boxes.forEach(function (box) { if (box.scrollWidth > box.clientWidth) { scrolling += 1; } });
  root.dataset.pageWidth = root.scrollWidth + "/" + root.clientWidth;  // wider than the window: it scrolls sideways
  root.dataset.scrollingTables = scrolling;
});
"""


def to_html(report: Report) -> str:
    body = ["<h1>specbench report</h1>", f'<p class="meta">{escape(options_line(report))}</p>']
    for run_report in report.runs:
        body += _run_section(run_report)
    if report.comparison is not None:
        first, second = (r.run.name for r in report.runs)
        body += [f"<h2>Comparison: {escape(first)} &rarr; {escape(second)}</h2>",
                 f"<p>change = speedup in {escape(second)} &minus; speedup in {escape(first)}; faster / slower when "
                 "the 95 % CIs do not overlap.</p>",
                 _table(display_comparison(report.comparison, first, second))]
    if report.skipped:
        body += ["<h2>Skipped</h2>", "<ul>"] + [f"<li>{escape(str(s))}</li>" for s in report.skipped] + ["</ul>"]
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        "<title>specbench report</title>", f"<style>{CSS}</style>", f"<script>{SCRIPT}</script>", "</head>",
        "<body>", *body, "</body>", "</html>", "",
    ])


def _run_section(run_report: RunReport) -> list[str]:
    section = [f"<h2>{escape(run_report.run.name)}</h2>",
               f'<p class="meta"><code>{escape(str(run_report.run.path))}</code>: {escape(run_report.summary)}</p>']
    if run_report.launches:
        section.append(f'<details class="launches"><summary>{len(run_report.launches)} server launch'
                       f'{"" if len(run_report.launches) == 1 else "es"}: the command lines and logs</summary><ul>'
                       + "".join(f"<li><code>{escape(launch['point'])}</code>: <code>{escape(launch['command'])}"
                                 f"</code> (log <code>{escape(launch['log'])}</code>)</li>"
                                 for launch in run_report.launches) + "</ul></details>")
    for row in run_report.mismatched:
        section.append(f'<p class="warning">WARNING: {escape(mismatch_warning(row))}.</p>')
    warning = unstable_warning(run_report)
    if warning:
        section.append(f'<div class="warning unstable">{escape(warning)}.<ul>'
                       + "".join(f"<li>{escape(line)}</li>" for line in unstable_lines(run_report)) + "</ul></div>")
    if not len(run_report.table):
        section.append("<p>No points match the filters.</p>")
    for (temperature, top_p), group in run_report.table.groupby(["temperature", "top_p"], sort=True):
        classes = ["best" if best else status if status != "ok" else "" for best, status in
                   zip(group["best"], group["status"])]
        section += [f"<h3>{escape(tables.group_title(temperature, top_p))}</h3>",
                    _table(tables.display_points(group), row_classes=classes)]
    section += _load_section(run_report)
    if run_report.capacity is not None:
        section += _capacity_section(run_report.capacity)
    if len(run_report.failed):
        section += ["<h3>Failed points</h3>", "<ul>"]
        section += [f"<li><code>{escape(row['point_id'])}</code>: {escape(str(row['error']))}</li>"
                    for row in run_report.failed.to_dict("records")]
        section.append("</ul>")
    if run_report.workload is not None:
        section += _workload_section(run_report.workload)
    if len(run_report.across_gamma):
        section += ["<h3>Predicted from the largest gamma</h3>",
                    f"<p>{escape(predictions.caption(run_report.across_gamma))}</p>",
                    _table(predictions.display(run_report.across_gamma))]
    matrix = tables.category_matrix(run_report.categories)
    if len(matrix):
        section += ["<h3>Speedup per workload category</h3>", _table(display_matrix(matrix))]
    for plot in plots.all_plots(run_report.points, run_report.categories):
        section.append(_figure(plot))
    if run_report.studies:
        section += _tune_section(run_report.studies)
    return section


def _load_section(run_report: RunReport) -> list[str]:
    """Speedup against load per temperature with its crossover lines, and goodput per temperature."""
    section = []
    speedups = run_report.speedups_by_load
    for (temperature, top_p), group in speedups.groupby(["temperature", "top_p"], sort=True):
        display = tables.display_load(group, sep="\n")  # acceptance below the speedup: narrower columns
        section += [f"<h3>{escape(tables.load_title(group))}</h3>",
                    _table(display, row_classes=[""] * (len(display) - 1) + ["best"])]
        crossover = load_tables.crossover_lines(run_report.crossover, temperature, top_p)
        if crossover:
            section.append('<ul class="crossover">' + "".join(f"<li>{escape(line)}</li>" for line in crossover)
                           + "</ul>")
    if len(speedups):
        section.append(f'<p class="meta">{escape(tables.load_note(tables.level_columns(speedups)))}</p>')
    for _, group in run_report.goodput.groupby(["temperature", "top_p"], sort=True):
        section += [f"<h3>{escape(load_tables.goodput_title(group))}</h3>",
                    _table(load_tables.display_goodput(group)),
                    f'<p class="meta">{escape(load_tables.goodput_caption(group))}</p>']
    return section


def _capacity_section(report: capacity.CapacityReport) -> list[str]:
    """Per temperature: the headlines, the capacity table, what it means, the plot, the probes (folded)."""
    section = []
    for group in capacity.groups(report):
        headlines = capacity.headlines(report, group.configurations)
        section += [f"<h3>{escape(group.title)}</h3>",
                    '<ul class="capacity">' + "".join(f"<li>{escape(line)}</li>" for line in headlines) + "</ul>",
                    _table(capacity.display_capacity(report, group.configurations)),
                    f'<p class="meta">{escape(capacity.caption(report, group.axis))}</p>']
        plot = load_plots.capacity_plot(report, group)
        if plot is not None:
            section.append(_figure(plot))
        if len(group.probes):
            section.append(f"<details><summary>{escape(group.probes_title)}</summary>"
                           f"{_table(capacity.display_probes(group.probes))}</details>")
    return section


def _workload_section(report: workload.WorkloadReport) -> list[str]:
    lines = workload.workload_lines(report)
    return ["<h3>Workload</h3>", *(["<ul>" + "".join(f"<li>{escape(line)}</li>" for line in lines) + "</ul>"]
                                   if lines else []),
            _table(workload.display_lengths(report)), f'<p class="meta">{escape(workload.lengths_caption(report))}</p>']


def _tune_section(studies: list[trials.StudyReport]) -> list[str]:
    section = ["<h3>Tune</h3>"]
    for study in studies:
        section += [f"<h4>{escape(study.title)}</h4>", f"<p><strong>{escape(trials.recommendation_line(study))}"
                    f"</strong><br>{escape(trials.importance_line(study))}</p>"]
        if study.not_run:
            section.append(f'<p class="meta">{escape(study.not_run_line)}</p>')
        chosen = (study.recommendation or {}).get("trial")
        classes = ["best" if number == chosen else "failed" if state == "FAIL" else ""
                   for number, state in zip(study.trials["number"], study.trials["state"])]
        section.append(_table(trials.display_trials(study), row_classes=classes))
        if study.failed:
            section += ["<p>Failed trials:</p>", "<ul>"] + [f"<li>{escape(line)}</li>" for line in study.failed]
            section.append("</ul>")
        if study.load is not None:
            section += _schedule_section(study, study.load)
    for plot in plots.tune_plots(studies):
        section.append(_figure(plot))
    return section


def _schedule_section(study: trials.StudyReport, load: dict) -> list[str]:
    """A tune under load: the best per level, the crossover, the schedule to paste, its verification."""
    notes = [line for line in (schedule.crossover_line(load), schedule.single_line(load)) if line]
    section = [f"<h4>{escape(schedule.levels_title(study))}</h4>", _table(schedule.display_levels(load)),
               "<ul>" + "".join(f"<li>{escape(line)}</li>" for line in notes) + "</ul>",
               f"<h4>{escape(schedule.schedule_title(study))}</h4>"]
    gammas = schedule.display_schedule(load)
    if gammas is not None:
        section.append(_table(gammas))
    section.append("<ul>" + "".join(f"<li>{escape(line)}</li>" for line in schedule.schedule_lines(load)) + "</ul>")
    argument = schedule.speculative_config_arg(load)
    if argument:
        section.append(f"<pre><code>{escape(argument)}</code></pre>")
    verification = schedule.display_verification(load)
    if verification is not None:
        classes = ["worse" if worse else "" for worse in schedule.worse_rows(verification)]
        section += [f"<h4>{escape(schedule.verification_title(study))}</h4>",
                    _table(verification, row_classes=classes)]
    verdict = schedule.verification_line(load)
    if verdict:
        section.append(f"<p><strong>{escape(verdict)}</strong></p>")
    return section


def _figure(plot: figures.Plot | tuple[str, str]) -> str:
    if isinstance(plot, tuple):
        title, reason = plot
        return f'<h3>{escape(title)}</h3><p class="missing">{escape(reason)}</p>'
    data = base64.b64encode(plot.png).decode("ascii")
    return (f"<h3>{escape(plot.title)}</h3><figure><img src=\"data:image/png;base64,{data}\" "
            f"alt=\"{escape(plot.title)}\"><figcaption>{escape(plot.caption)}</figcaption></figure>")


def _table(frame: pd.DataFrame, *, row_classes: list[str] | None = None) -> str:
    classes = row_classes or [""] * len(frame)
    head = "".join(f"<th>{escape(str(c))}</th>" for c in frame.columns)
    rows = [(f'<tr class="{c}">' if c else "<tr>")
            + "".join(f"<td>{_cell(value)}</td>" for value in row) + "</tr>"
            for c, row in zip(classes, frame.itertuples(index=False))]
    return ('<div class="table-scroll"><table><thead><tr>' + head + "</tr></thead><tbody>" + "".join(rows)
            + "</tbody></table></div>")


def _cell(value: object) -> str:
    """A table cell's text, escaped; a cell of two lines (speedup, then acceptance) keeps them."""
    return escape(str(value)).replace("\n", "<br>")

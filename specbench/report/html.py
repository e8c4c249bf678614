"""The HTML report: one self-contained file (inline CSS, plots as base64 PNG data URIs, no network)."""

from __future__ import annotations

import base64
from html import escape

import pandas as pd

from specbench.report.build import Report
from specbench.report.sections import (Block, Figures, Section, Table, Alert, options_line, run_sections,
                                       tail_sections)

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
        body += [f"<h2>{escape(run_report.run.name)}</h2>",
                 f'<p class="meta"><code>{escape(str(run_report.run.path))}</code>: {escape(run_report.summary)}</p>']
        if run_report.launches:
            body.append(f'<details class="launches"><summary>{len(run_report.launches)} server launch'
                        f'{"" if len(run_report.launches) == 1 else "es"}: the command lines and logs</summary><ul>'
                        + "".join(f"<li><code>{escape(launch['point'])}</code>: <code>{escape(launch['command'])}"
                                  f"</code> (log <code>{escape(launch['log'])}</code>)</li>"
                                  for launch in run_report.launches) + "</ul></details>")
        for section in run_sections(run_report):
            body += _section(section, level=3)
    for section in tail_sections(report):
        body += _section(section, level=2)
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        "<title>specbench report</title>", f"<style>{CSS}</style>", f"<script>{SCRIPT}</script>", "</head>",
        "<body>", *body, "</body>", "</html>", "",
    ])


ROW_CLASS = {"best": "best", "summary": "best", "chosen": "best", "failed": "failed", "dim": "failed",
             "mismatch": "mismatch", "unstable": "unstable", "worse": "worse"}


def _section(section: Section, *, level: int) -> list[str]:
    html = [f"<h{level}>{escape(section.title)}</h{level}>"] if section.title else []
    for block in section.blocks:
        html += _block(block, level=level if not section.title else level + 1)
    return html


def _block(block: Block, *, level: int) -> list[str]:
    if isinstance(block, Table):
        table = _table(block.frame, row_classes=[ROW_CLASS.get(role, "") for role in block.roles] or None)
        heading = f"<h{level}>{escape(block.title)}</h{level}>" if block.title else None
        if block.folded:
            return [f"<details><summary>{escape(block.title or '')}</summary>{table}</details>"]
        caption = [f'<p class="meta">{escape(block.caption)}</p>'] if block.caption else []
        return ([heading] if heading else []) + [table] + caption
    if isinstance(block, Alert):
        if block.details:
            return [f'<div class="warning {block.kind}">{escape(block.text)}<ul>'
                    + "".join(f"<li>{escape(line)}</li>" for line in block.details) + "</ul></div>"]
        return [f'<p class="warning">{escape(block.text)}</p>']
    if isinstance(block, Figures):  # a figure is a heading of its own, under the run's
        return [_figure(plot, level=3) for plot in block.make()]
    heading = [f"<h{level}>{escape(block.title)}</h{level}>"] if block.title else []
    if not block.lines:
        return heading
    if block.style == "code":
        return heading + [f"<pre><code>{escape(chr(10).join(block.lines))}</code></pre>"]
    if block.style == "strong":
        return heading + [f"<p><strong>{escape(line)}</strong></p>" for line in block.lines]
    if block.style == "note":
        return heading + [f'<p class="meta">{escape(line)}</p>' for line in block.lines]
    if block.style == "plain":
        return heading + [f"<p>{escape(line)}</p>" for line in block.lines]
    return heading + ["<ul>" + "".join(f"<li>{escape(line)}</li>" for line in block.lines) + "</ul>"]


def _figure(plot, *, level: int) -> str:
    if isinstance(plot, tuple):
        title, reason = plot
        return f'<h{level}>{escape(title)}</h{level}><p class="missing">{escape(reason)}</p>'
    data = base64.b64encode(plot.png).decode("ascii")
    return (f"<h{level}>{escape(plot.title)}</h{level}><figure><img src=\"data:image/png;base64,{data}\" "
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

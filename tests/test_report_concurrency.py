"""`specbench report` on a run at several concurrency levels (the server backend's axis): the speedup-by-
concurrency table per temperature in every format, its plot, the comparison of two runs level by level, and a
run at one level looking exactly as before."""

from __future__ import annotations

import io
import re
from pathlib import Path

import matplotlib.image
import numpy as np
import pandas as pd
import pytest

from specbench.report import Format, build_report, render, tables
from specbench.report.load_plots import load_figure
from test_report import PNG_TAG, RUN_A, RUN_B, embedded_pngs, markdown_tables, point, report_cli, write_run


def at(point_id: str, level: int, **values) -> dict:
    """A point of test_report's kind at a concurrency level (`-c<level>` ends its id above 1)."""
    return {**point(point_id, **values), "point_id": point_id + (f"-c{level}" if level > 1 else ""),
            "concurrency": level}


def ok(speedup: float, half: float = 0.1, acceptance: float | None = None, **values) -> dict:
    return {"speedup": speedup, "ci": (speedup - half, speedup + half), "tokens_per_s": 10.0 * speedup,
            "acceptance": acceptance, "outputs_match_baseline": True, **values}


BASE = {"speedup": 1.0, "ci": (1.0, 1.0), "tokens_per_s": 10.0, "mal": 1.0, "outputs_match_baseline": True}
NGRAM = {"ngram_min": 1, "ngram_max": 3}
FAILED = {"status": "failed", "error": "server died", "outputs_match_baseline": None}
UNSTABLE = {"unstable": True, "unstable_reason": "other processes used 40 % of the cpu"}
LEVELS = [
    *(at("baseline-t0-p1", level, **BASE) for level in (1, 4, 16)),
    at("close-g2-t0-p1", 1, **ok(1.5, acceptance=0.8)),
    at("close-g2-t0-p1", 4, **ok(1.2, acceptance=0.8)),
    at("close-g2-t0-p1", 16, **ok(0.9, acceptance=0.79)),
    at("close-g4-t0-p1", 1, **ok(1.7, acceptance=0.7, outputs_match_baseline=False)),  # fastest, but broken
    at("close-g4-t0-p1", 4, **ok(1.4, acceptance=0.7, **UNSTABLE)),  # fastest at 4, but not to be trusted
    at("close-g4-t0-p1", 16, **FAILED),
    at("ngram-g2-t0-p1", 1, **ok(1.3, acceptance=0.5, **NGRAM)),
    at("ngram-g2-t0-p1", 4, **ok(1.25, half=0.05, **NGRAM)),  # the engine reported no acceptance
    at("ngram-g2-t0-p1", 16, **ok(0.95, half=0.05, acceptance=0.4, **NGRAM)),
    *(at("baseline-t0.8-p1", level, **{**BASE, "outputs_match_baseline": None}) for level in (1, 4)),
    at("close-g2-t0.8-p1", 1, **ok(1.1, half=0.2, acceptance=0.6, outputs_match_baseline=None)),
    at("close-g2-t0.8-p1", 4, **ok(0.9, acceptance=0.55, outputs_match_baseline=None)),
    at("ngram-g2-t0.8-p1", 1, **ok(1.05, outputs_match_baseline=None, **NGRAM)),  # not run at 4
]
LEVEL_HEADER = "| configuration | concurrency 1 | concurrency 4 | concurrency 16 |"
GREEDY_LEVEL_ROWS = [
    "| close g=2 | 1.50× [1.40, 1.60] accept 80% | 1.20× [1.10, 1.30] accept 80% | 0.90× [0.80, 1.00] accept 79% |",
    "| close g=4 | mismatch | 1.40× [1.30, 1.50] accept 70% (unstable) | failed |",
    "| ngram n=3 g=2 | 1.30× [1.20, 1.40] accept 50% | 1.25× [1.20, 1.30] | 0.95× [0.90, 1.00] accept 40% |",
    "| **best** | **close g=2** | **ngram n=3 g=2** | **baseline** |",
]
SAMPLED_LEVEL_ROWS = [
    "| configuration | concurrency 1 | concurrency 4 |",
    "|:--|--:|--:|",
    "| close g=2 | 1.10× [0.90, 1.30] accept 60% | 0.90× [0.80, 1.00] accept 55% |",
    "| ngram n=3 g=2 | 1.05× [0.95, 1.15] | - |",
    "| **best** | **close g=2** | **baseline** |",
]


@pytest.fixture
def levels_run(tmp_path: Path) -> Path:
    return write_run(tmp_path / "levels", LEVELS)


# --- the table ------------------------------------------------------------------------------------


def test_markdown_has_a_speedup_by_concurrency_table_per_temperature(levels_run):
    text = render(build_report([levels_run]), Format.md)
    found = markdown_tables(text)
    assert found["Speedup by concurrency, temperature 0"] == [LEVEL_HEADER, "|:--|--:|--:|--:|", *GREEDY_LEVEL_ROWS]
    assert found["Speedup by concurrency, temperature 0.8"] == SAMPLED_LEVEL_ROWS
    assert tables.load_note(["concurrency 1"]) in text


def test_best_is_decided_per_level_among_trusted_points(levels_run):
    table = build_report([levels_run]).points_table()
    # one best per temperature and level; close-g4 (a mismatch at 1, unstable at 4) never is
    assert sorted(table.loc[table["best"], "point_id"]) == [
        "baseline-t0-p1-c16", "baseline-t0.8-p1-c4", "close-g2-t0-p1", "close-g2-t0.8-p1", "ngram-g2-t0-p1-c4"]


def test_the_terminal_shows_the_table_per_temperature(levels_run):
    result = report_cli(levels_run)
    assert result.exit_code == 0, result.output
    lines = [" ".join(line.split()) for line in result.stdout.splitlines()]
    assert "temperature 0 (best per concurrency level in bold green)" in lines
    start = lines.index("Speedup by concurrency, temperature 0")
    assert lines[start + 2:start + 11] == [  # acceptance on a second line, so that five levels fit 120 columns
        "configuration concurrency 1 concurrency 4 concurrency 16", "─" * 76,
        "close g=2 1.50× [1.40, 1.60] 1.20× [1.10, 1.30] 0.90× [0.80, 1.00]", "accept 80% accept 80% accept 79%",
        "close g=4 mismatch 1.40× [1.30, 1.50] failed", "accept 70% (unstable)",
        "ngram n=3 g=2 1.30× [1.20, 1.40] 1.25× [1.20, 1.30] 0.95× [0.90, 1.00]", "accept 50% accept 40%",
        "best close g=2 ngram n=3 g=2 baseline"]
    assert "Speedup by concurrency, temperature 0.8" in lines and tables.load_note(["concurrency 1"]) in result.stdout


def test_the_terminal_splits_a_table_with_many_levels(tmp_path):
    many = [at(point_id, 2 ** i, **values) for i in range(8) for point_id, values in
            (("baseline-t0-p1", BASE), ("close-g2-t0-p1", ok(1.5 - i / 20, acceptance=0.8)))]
    result = report_cli(write_run(tmp_path / "many", many))
    lines = [" ".join(line.split()) for line in result.stdout.splitlines()]
    first, second = (lines.index(title) for title in ("Speedup by concurrency, temperature 0",
                                                       "Speedup by concurrency, temperature 0 (continued)"))
    assert lines[first + 2] == "configuration concurrency 1 concurrency 2 concurrency 4 concurrency 8 concurrency 16"
    assert lines[second + 2] == "configuration concurrency 32 concurrency 64 concurrency 128"
    assert lines[second + 4] == "close g=2 1.25× [1.15, 1.35] 1.20× [1.10, 1.30] 1.15× [1.05, 1.25]"
    raw = result.stdout.splitlines()
    assert max(len(line.rstrip()) for line in raw[first:second + 8]) <= 120  # the tables (notes wrap softly)


def test_html_has_the_table_with_the_best_row_marked(levels_run):
    html = render(build_report([levels_run]), Format.html)
    assert '<h3>Speedup by concurrency, temperature 0</h3><div class="table-scroll"><table>' in html.replace("\n", "")
    assert ('<tr class="best"><td>best</td><td>close g=2</td><td>ngram n=3 g=2</td><td>baseline</td></tr>'
            in html)
    assert "<td>1.25× [1.20, 1.30]</td>" in html


def test_top_keeps_every_level_of_the_configurations_it_shows_and_the_best(levels_run):
    report = build_report([levels_run], filters=["temperature=0"], sort="acceptance_rate", top=1)
    assert list(report.points_table()["point_id"]) == ["close-g2-t0-p1"]
    found = markdown_tables(render(report, Format.md))["Speedup by concurrency, temperature 0"]
    assert found[2:] == [GREEDY_LEVEL_ROWS[0], GREEDY_LEVEL_ROWS[2], GREEDY_LEVEL_ROWS[3]]  # ngram: best at 4


# --- the plot -------------------------------------------------------------------------------------


def test_the_plot_has_a_line_and_band_per_configuration_on_a_log2_axis(levels_run):
    points = build_report([levels_run]).runs[0].points
    figure = load_figure(points)
    greedy, sampled = figure.axes
    assert greedy.get_title() == "temperature 0" and sampled.get_title() == "temperature 0.8"
    assert greedy.get_xscale() == "log" and list(greedy.get_xticks()) == [1, 4, 16]
    assert [label.get_text() for label in greedy.get_xticklabels()] == ["1", "4", "16"]
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in greedy.get_lines()}
    assert lines.pop("baseline")[1] == [1.0, 1.0]  # axhline: the baseline at every level
    assert lines == {  # close g=4: unstable at 4 is drawn, the mismatch and the failure are not
        "close g=2": ([1, 4, 16], [1.5, 1.2, 0.9]),
        "close g=4": ([4], [1.4]),
        "ngram n=3 g=2": ([1, 4, 16], [1.3, 1.25, 0.95]),
        "_crossover close g=2": ([4], [1.2]),  # a star where the CI last lies above 1.0
        "_crossover ngram n=3 g=2": ([4], [1.25]),
    }
    assert len(greedy.collections) == 3  # a CI band per configuration
    band = greedy.collections[0].get_paths()[0].vertices  # close g=2: low edge then high edge
    assert np.allclose(sorted(set(band[:, 1].round(6))), [0.8, 1.0, 1.1, 1.3, 1.4, 1.6])
    assert {line.get_label() for line in sampled.get_lines()} == {"close g=2", "ngram n=3 g=2", "baseline"}


def test_html_and_markdown_embed_the_plot(levels_run):
    report = build_report([levels_run])
    html = render(report, Format.html)
    assert '<h3>Speedup vs concurrency</h3><figure><img src="data:image/png;base64,' in html
    titles = re.findall(r'<img src="data:image/png;base64,[A-Za-z0-9+/=]+" alt="([^"]+)"', html)
    assert titles == ["Speedup vs concurrency", "Speedup vs gamma", "Speedup per workload category"]  # load first
    markdown = render(report, Format.md)
    images = re.findall(r"!\[Speedup vs concurrency\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", markdown)
    assert len(images) == 1 and images[0] in html
    image = matplotlib.image.imread(io.BytesIO(embedded_pngs(html)[1]), format="png")
    assert image.shape[0] > 100 and image.shape[1] > 100


def test_a_plot_with_nothing_to_draw_says_why(tmp_path):
    baselines = write_run(tmp_path / "baselines", [at("baseline-t0-p1", level, **BASE) for level in (1, 4)]
                          + [at("close-g2-t0-p1", 4, **FAILED)])
    text = render(build_report([baselines]), Format.md)
    assert "### Speedup vs concurrency\n\n_Not drawn: no trusted speculative point has a speedup._" in text
    assert markdown_tables(text)["Speedup by concurrency, temperature 0"][2:] == [
        "| close g=2 | - | failed |", "| **best** | **baseline** | **baseline** |"]


# --- two runs -------------------------------------------------------------------------------------


def test_comparison_matches_points_level_by_level(tmp_path, levels_run):
    # run b: close-g2 faster at 4, slower at 16, alike at 1; no ngram at 1; a level (8) that a did not run
    changed = {"close-g2-t0-p1-c4": at("close-g2-t0-p1", 4, **ok(1.6, acceptance=0.8)),
               "close-g2-t0-p1-c16": at("close-g2-t0-p1", 16, **ok(0.5, acceptance=0.79))}
    after = [changed.get(row["point_id"], row) for row in LEVELS if row["point_id"] != "ngram-g2-t0-p1"]
    after += [at("baseline-t0-p1", 8, **BASE), at("close-g2-t0-p1", 8, **ok(1.1))]
    report = build_report([levels_run, write_run(tmp_path / "after", after)], filters=["temperature=0"])
    comparison = report.comparison
    assert list(comparison["concurrency"]) == [1] * 4 + [4] * 4 + [8] * 2 + [16] * 4  # grouped by level
    verdicts = comparison.set_index("point_id")["verdict"].to_dict()
    assert verdicts == {
        "baseline-t0-p1": "no clear change", "close-g2-t0-p1": "no clear change",
        "close-g4-t0-p1": "mismatch in levels", "ngram-g2-t0-p1": "only in levels",
        "baseline-t0-p1-c4": "no clear change", "close-g2-t0-p1-c4": "faster",
        "close-g4-t0-p1-c4": "unstable in levels", "ngram-g2-t0-p1-c4": "no clear change",
        "baseline-t0-p1-c8": "only in after", "close-g2-t0-p1-c8": "only in after",
        "baseline-t0-p1-c16": "no clear change", "close-g2-t0-p1-c16": "slower",
        "close-g4-t0-p1-c16": "failed in levels", "ngram-g2-t0-p1-c16": "no clear change",
    }
    assert comparison.set_index("point_id").at["close-g2-t0-p1-c4", "change"] == pytest.approx(0.4)
    rows = comparison_rows(render(report, Format.md))
    assert rows[0] == ("| point | concurrency | speedup levels | 95% CI levels | speedup after | 95% CI after | "
                       "change | verdict |")
    assert rows[2:4] == ["| baseline-t0-p1 | 1 | 1.00x | 1.00-1.00 | 1.00x | 1.00-1.00 | +0.00 | no clear change |",
                         "| close-g2-t0-p1 | 1 | 1.50x | 1.40-1.60 | 1.50x | 1.40-1.60 | +0.00 | no clear change |"]
    assert "| close-g2-t0-p1-c4 | 4 | 1.20x | 1.10-1.30 | 1.60x | 1.50-1.70 | +0.40 | faster |" in rows


def comparison_rows(markdown: str) -> list[str]:
    comparison = markdown.split("## Comparison", 1)[1]
    return [line for line in comparison.splitlines() if line.startswith("|")]


def test_comparison_never_matches_a_point_with_another_level(tmp_path):
    """Two ids alike at different levels (a file from before the axis holds no concurrency: it ran at 1)."""
    one = write_run(tmp_path / "one", [at("close-g2-t0-p1", 1, **ok(1.5))])
    other = write_run(tmp_path / "other", [{**at("close-g2-t0-p1", 4, **ok(1.2)), "point_id": "close-g2-t0-p1"}])
    old = write_run(tmp_path / "old", [{**at("close-g2-t0-p1", 1, **ok(1.4)), "concurrency": None}])
    mixed = build_report([one, other]).comparison
    assert list(zip(mixed["concurrency"], mixed["verdict"])) == [(1, "only in one"), (4, "only in other")]
    same = build_report([old, one]).comparison
    assert list(zip(same["concurrency"], same["verdict"])) == [(1, "no clear change")]


# --- one level: as before -------------------------------------------------------------------------


def test_a_run_at_one_level_renders_exactly_as_without_the_axis(tmp_path):
    without = write_run(tmp_path / "a", RUN_A)  # points from before the axis: no concurrency column
    points = pd.read_parquet(without / "points.parquet").drop(columns=["concurrency"])
    points.to_parquet(without / "points.parquet", index=False)
    at_one = write_run(tmp_path / "one" / "a", [{**row, "concurrency": 1} for row in RUN_A])
    b = write_run(tmp_path / "b", RUN_B)
    for fmt in (Format.md, Format.html, Format.json, Format.csv):
        expected = render(build_report([without, b]), fmt).replace(str(without), "A")
        assert render(build_report([at_one, b]), fmt).replace(str(at_one), "A") == expected
    text = render(build_report([at_one, b]), Format.md)
    assert "concurrency" not in text.lower() and "×" not in text
    html = render(build_report([at_one]), Format.html)
    assert "Speedup vs concurrency" not in html and html.count(PNG_TAG) == 5
    terminal = report_cli(at_one).stdout
    assert "Speedup by concurrency" not in terminal and "temperature 0  (best in bold green)" in terminal
    assert build_report([at_one]).runs[0].speedups_by_load.empty
    assert load_figure(build_report([at_one]).runs[0].points) is None

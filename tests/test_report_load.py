"""`specbench report` on a run at concurrency levels and open-loop request rates: rate points as their own levels
(never concurrency 1), the crossover line per configuration and its star on the plot, the goodput table and plot,
the p99 latency plot, the comparison level by level, and a run at one level without an SLO looking as before."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from specbench.report import Format, build_report, render, tables
from specbench.report.load_plots import goodput_figure, latency_figure, load_figure
from test_report import RUN_A, RUN_B, markdown_tables, point, report_cli, write_run
from test_report_concurrency import BASE, at, ok

SLO = "ttft_ms <= 500, tpot_ms <= 50"


def rate(point_id: str, requests_per_s: float, **values) -> dict:
    """A point at an open-loop request rate (`-r<rate>` ends its id; no concurrency)."""
    return {**point(point_id, **values), "point_id": f"{point_id}-r{requests_per_s:g}", "concurrency": None,
            "request_rate": requests_per_s}


def served(goodput: float, met: float, ttft: float, tpot: float) -> dict:
    return {"goodput": goodput, "slo_met_fraction": met, "slo": SLO, "ttft_ms_p99": ttft, "tpot_ms_p99": tpot}


NGRAM = "ngram-g3-t0-p1"
CLOSE = "close-g2-t0-p1"
LOAD = [
    at("baseline-t0-p1", 1, **BASE, ttft_ms_p99=40.0, tpot_ms_p99=20.0),
    at("baseline-t0-p1", 4, **BASE, ttft_ms_p99=60.0, tpot_ms_p99=22.0),
    rate("baseline-t0-p1", 2, **BASE, **served(1.9, 0.95, 80.0, 25.0)),
    rate("baseline-t0-p1", 4, **BASE, **served(2.0, 0.5, 900.0, 60.0)),
    at(NGRAM, 1, **ok(1.3, acceptance=0.6), ttft_ms_p99=45.0, tpot_ms_p99=15.0),
    at(NGRAM, 4, **ok(1.12, half=0.07, acceptance=0.6), ttft_ms_p99=70.0, tpot_ms_p99=19.0),
    rate(NGRAM, 2, **ok(1.05, acceptance=0.55), **served(1.95, 0.97, 85.0, 21.0)),
    rate(NGRAM, 4, **ok(0.9, acceptance=0.5), **served(1.5, 0.4, 1200.0, 70.0)),
    at(CLOSE, 1, **ok(1.5, acceptance=0.8), ttft_ms_p99=50.0, tpot_ms_p99=12.0),
    at(CLOSE, 4, **ok(1.3, acceptance=0.8), ttft_ms_p99=75.0, tpot_ms_p99=14.0),
    rate(CLOSE, 2, **ok(1.2, acceptance=0.8), **served(2.0, 1.0, 90.0, 16.0)),
    rate(CLOSE, 4, **ok(1.1, half=0.08, acceptance=0.8), **served(3.0, 0.75, 400.0, 30.0)),
]
LEVELS = ["concurrency 1", "concurrency 4", "2 requests/s", "4 requests/s"]


@pytest.fixture
def load_run(tmp_path: Path) -> Path:
    return write_run(tmp_path / "load", LOAD)


# --- levels ---------------------------------------------------------------------------------------


def test_rate_points_are_their_own_levels_never_concurrency_1(load_run):
    points = build_report([load_run]).runs[0].points
    by_id = dict(zip(points["point_id"], tables.levels(points)))
    assert by_id[f"{NGRAM}-r2"] == "2 requests/s" and by_id[NGRAM] == "concurrency 1"
    assert tables.load_levels(points) == LEVELS and tables.concurrency_levels(points) == [1, 4]
    baselines = dict(zip(points["point_id"], tables.baseline_ids(points)))
    assert baselines[f"{NGRAM}-r2"] == "baseline-t0-p1-r2" and baselines[f"{CLOSE}-c4"] == "baseline-t0-p1-c4"
    # one best per level: close g=2 everywhere (were rates level 1, one best would cover five points)
    assert sorted(build_report([load_run]).points_table().query("best")["point_id"]) == [
        CLOSE, f"{CLOSE}-c4", f"{CLOSE}-r2", f"{CLOSE}-r4"]


def test_markdown_table_has_a_column_per_level_in_load_order(load_run):
    found = markdown_tables(render(build_report([load_run]), Format.md))
    assert found["Speedup by load, temperature 0"] == [
        "| configuration | concurrency 1 | concurrency 4 | 2 requests/s | 4 requests/s |",
        "|:--|--:|--:|--:|--:|",
        "| close g=2 | 1.50× [1.40, 1.60] accept 80% | 1.30× [1.20, 1.40] accept 80% | 1.20× [1.10, 1.30] accept 80% "
        "| 1.10× [1.02, 1.18] accept 80% |",
        "| ngram g=3 | 1.30× [1.20, 1.40] accept 60% | 1.12× [1.05, 1.19] accept 60% | 1.05× [0.95, 1.15] accept 55% "
        "| 0.90× [0.80, 1.00] accept 50% |",
        "| **best** | **close g=2** | **close g=2** | **close g=2** | **close g=2** |",
    ]


# --- the crossover --------------------------------------------------------------------------------

CROSSOVER = [  # per load axis: a concurrency and a request rate are not one scale (concurrency 4 < 2 requests/s?)
    "close g=2 beats the baseline up to concurrency 4 (1.30× [1.20, 1.40]); at every concurrency level it ran",
    "ngram g=3 beats the baseline up to concurrency 4 (1.12× [1.05, 1.19]); at every concurrency level it ran",
    "close g=2 beats the baseline up to 4 requests/s (1.10× [1.02, 1.18]); at every request rate it ran",
    "ngram g=3 beats the baseline at no request rate (no 95 % CI wholly above 1.0)",
]


def test_the_crossover_is_said_under_the_table_in_every_format(load_run):
    report = build_report([load_run])
    markdown = render(report, Format.md)
    assert "\n".join(f"- {line}" for line in CROSSOVER) in markdown
    assert markdown.index(CROSSOVER[0]) > markdown.index("### Speedup by load, temperature 0")
    html = render(report, Format.html)
    assert '<ul><li>' + "</li><li>".join(CROSSOVER) + "</li></ul>" in html
    lines = [" ".join(line.split()) for line in report_cli(load_run).stdout.splitlines()]
    assert all(line in lines for line in CROSSOVER)
    assert "temperature 0 (best per load level in bold green)" in lines


def test_an_unstable_or_failed_point_is_no_crossover(tmp_path):
    rows = [*LOAD[:4], at(CLOSE, 1, **ok(1.5)), at(CLOSE, 4, **ok(1.4, unstable=True, unstable_reason="busy")),
            rate(CLOSE, 2, **ok(0.8)), at(NGRAM, 1, **ok(1.05, half=0.1))]
    report = build_report([write_run(tmp_path / "run", rows)])
    crossover = report.runs[0].crossover  # close g=2: unstable at concurrency 4 does not count
    assert list(zip(crossover["configuration"], crossover["axis"])) == [
        ("close g=2", "concurrency"), ("ngram g=3", "concurrency"), ("close g=2", "request_rate")]
    assert list(crossover["load"].fillna("none")) == ["concurrency 1", "none", "none"]
    assert crossover["next_load"].iloc[0] == "concurrency 4"
    markdown = render(report, Format.md)
    assert "- close g=2 beats the baseline up to concurrency 1 (1.50× [1.40, 1.60]); not at concurrency 4" in markdown
    assert "- ngram g=3 beats the baseline at no concurrency level (no 95 % CI wholly above 1.0)" in markdown
    assert "- close g=2 beats the baseline at no request rate (no 95 % CI wholly above 1.0)" in markdown


# --- goodput --------------------------------------------------------------------------------------


def test_goodput_table_per_temperature_with_the_slo_in_the_caption(load_run):
    markdown = render(build_report([load_run]), Format.md)
    assert markdown_tables(markdown)["Goodput, temperature 0"] == [
        "| configuration | 2 requests/s | 4 requests/s |", "|:--|--:|--:|",
        "| baseline | 1.90 req/s (95%) | 2.00 req/s (50%) |",
        "| close g=2 | 2.00 req/s (100%) | 3.00 req/s (75%) |",
        "| ngram g=3 | 1.95 req/s (97%) | 1.50 req/s (40%) |",
    ]
    caption = ("Goodput: requests per second that met every SLO (ttft_ms <= 500, tpot_ms <= 50); in brackets, the "
               "fraction of requests that met it.")
    assert caption in markdown
    html = render(build_report([load_run]), Format.html)
    assert "<td>3.00 req/s (75%)</td>" in html and "ttft_ms &lt;= 500, tpot_ms &lt;= 50" in html
    assert "Goodput, temperature 0" in report_cli(load_run).stdout


def test_goodput_plot_has_a_line_per_configuration_and_the_baseline(load_run):
    (ax,) = goodput_figure(build_report([load_run]).runs[0].points).axes
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
    assert lines == {"baseline": ([2.0, 4.0], [1.9, 2.0]), "close g=2": ([2.0, 4.0], [2.0, 3.0]),
                     "ngram g=3": ([2.0, 4.0], [1.95, 1.5]), "offered rate": ([2.0, 4.0], [2.0, 4.0])}
    assert ax.get_xlabel() == "request rate (requests/s)"


def test_one_rate_draws_no_goodput_plot_but_shows_the_table(tmp_path):
    run = write_run(tmp_path / "one", [row for row in LOAD if row["point_id"].endswith("-r2")])
    markdown = render(build_report([run]), Format.md)
    assert markdown_tables(markdown)["Goodput, temperature 0"][0] == "| configuration | 2 requests/s |"
    assert "Goodput vs request rate" not in markdown and "Latency p99 vs load" not in markdown


# --- the plots ------------------------------------------------------------------------------------


def lines_of(ax) -> dict[str, tuple[list, list]]:
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}


def test_speedup_plot_keeps_concurrency_and_request_rates_apart_and_stars_each_crossover(load_run):
    closed, opened = load_figure(build_report([load_run]).runs[0].points).axes  # a panel per loop, never one axis
    assert (closed.get_title(), opened.get_title()) == ("temperature 0, closed loop", "temperature 0, open loop")
    assert closed.get_xscale() == "log" and [t.get_text() for t in closed.get_xticklabels()] == ["1", "4"]
    assert closed.get_xlabel() == "concurrency (requests in flight)"
    assert opened.get_xscale() == "linear" and [t.get_text() for t in opened.get_xticklabels()] == ["2", "4"]
    assert opened.get_xlabel() == "request rate (requests/s)"
    assert lines_of(closed) == {"close g=2": ([1, 4], [1.5, 1.3]), "ngram g=3": ([1, 4], [1.3, 1.12]),
                                "_crossover close g=2": ([4], [1.3]), "_crossover ngram g=3": ([4], [1.12]),
                                "baseline": ([0, 1], [1.0, 1.0])}
    assert lines_of(opened) == {"close g=2": ([2, 4], [1.2, 1.1]), "ngram g=3": ([2, 4], [1.05, 0.9]),
                                "_crossover close g=2": ([4], [1.1]), "baseline": ([0, 1], [1.0, 1.0])}
    colors = [{line.get_label(): line.get_color() for line in ax.get_lines()} for ax in (closed, opened)]
    assert colors[0]["close g=2"] == colors[1]["close g=2"] != colors[0]["ngram g=3"] == colors[1]["ngram g=3"]


def test_latency_plot_has_ttft_and_tpot_p99_panels_per_temperature_and_loop(load_run):
    ttft, tpot, ttft_open, tpot_open = latency_figure(build_report([load_run]).runs[0].points).axes
    assert (ttft.get_ylabel(), tpot.get_ylabel(), ttft_open.get_ylabel()) == ("TTFT p99 (ms)", "TPOT p99 (ms)",
                                                                               "TTFT p99 (ms)")
    assert (ttft.get_title(), ttft_open.get_title()) == ("temperature 0, closed loop", "temperature 0, open loop")
    assert [t.get_text() for t in tpot.get_xticklabels()] == ["1", "4"]
    assert [t.get_text() for t in tpot_open.get_xticklabels()] == ["2", "4"]
    assert lines_of(ttft) == {"baseline": ([1, 4], [40.0, 60.0]), "close g=2": ([1, 4], [50.0, 75.0]),
                              "ngram g=3": ([1, 4], [45.0, 70.0])}
    assert lines_of(ttft_open) == {"baseline": ([2, 4], [80.0, 900.0]), "close g=2": ([2, 4], [90.0, 400.0]),
                                   "ngram g=3": ([2, 4], [85.0, 1200.0])}
    assert lines_of(tpot_open)["baseline"] == ([2, 4], [25.0, 60.0])


def test_html_embeds_the_load_plots(load_run):
    html = render(build_report([load_run]), Format.html)
    titles = re.findall(r'<img src="data:image/png;base64,[A-Za-z0-9+/=]+" alt="([^"]+)"', html)
    assert titles[:3] == ["Speedup vs load", "Latency p99 vs load", "Goodput vs request rate"]  # in the load section
    markdown = render(build_report([load_run]), Format.md)
    assert all(f"![{title}](data:image/png;base64," in markdown for title in titles[:3])


# --- two runs -------------------------------------------------------------------------------------


def test_comparison_keeps_a_rate_point_apart_from_concurrency_1(tmp_path):
    one = write_run(tmp_path / "one", [at(CLOSE, 1, **ok(1.5))])
    other = write_run(tmp_path / "other", [{**rate(CLOSE, 2, **ok(1.2)), "point_id": CLOSE}])  # an id alike
    comparison = build_report([one, other]).comparison
    assert list(zip(comparison["load"], comparison["verdict"])) == [("concurrency 1", "only in one"),
                                                                     ("2 requests/s", "only in other")]
    assert comparison["concurrency"].isna().tolist() == [False, True]
    rows = [line for line in render(build_report([one, other]), Format.md).split("## Comparison")[1].splitlines()
            if line.startswith("|")]
    assert rows[0].startswith("| point | load | speedup one |") and rows[3].startswith(f"| {CLOSE} | 2 requests/s |")


# --- one level, no SLO: as before -----------------------------------------------------------------


def test_a_run_at_one_level_without_an_slo_renders_exactly_as_before_the_load_columns(tmp_path):
    without = write_run(tmp_path / "a", RUN_A)  # a file from before rates and SLOs: none of their columns
    new = ["request_rate", "achieved_request_rate", "request_throughput", "goodput", "slo_met_fraction", "slo",
           "ttft_ms_p90", "ttft_ms_p99", "tpot_ms_p99", "itl_ms_p90", "e2e_ms_p90"]
    points = pd.read_parquet(without / "points.parquet")
    points.drop(columns=[c for c in new if c in points]).to_parquet(without / "points.parquet", index=False)
    empty = write_run(tmp_path / "one" / "a", RUN_A)  # the columns there, empty
    b = write_run(tmp_path / "b", RUN_B)
    for fmt in (Format.md, Format.html):
        expected = render(build_report([without, b]), fmt).replace(str(without), "A")
        assert render(build_report([empty, b]), fmt).replace(str(empty), "A") == expected
    assert report_cli(without).stdout.replace(str(without), "A") == report_cli(empty).stdout.replace(str(empty), "A")
    text = render(build_report([empty]), Format.md)
    assert "Goodput" not in text and "Latency p99" not in text and "beats the baseline" not in text


def test_the_reports_baseline_of_a_point_is_the_one_its_spec_names_on_both_axes_every_repeat_and_draw():
    from specbench.core.results import PointSpec

    ngram = PointSpec("ngram-g3-t0-p1", "ngram", "ngram", 3, 0.0, 1.0)
    specs = [ngram, ngram.at_load(concurrency=4).in_draw(1), ngram.at_load(request_rate=1.5).in_repeat(1).in_draw(2),
             ngram.at_load(concurrency=2).in_repeat(2)]
    frame = pd.DataFrame([{"temperature": s.temperature, "top_p": s.top_p, "concurrency": s.concurrency,
                           "request_rate": s.request_rate, "capacity_repeat": s.capacity_repeat,
                           "capacity_draw": s.capacity_draw} for s in specs])
    assert tables.baseline_ids(frame) == [s.baseline_id for s in specs] == [
        "baseline-t0-p1", "baseline-t0-p1-c4-d2", "baseline-t0-p1-rep2-r1.5-d3", "baseline-t0-p1-rep3-c2"]
    old = frame.drop(columns=["capacity_repeat", "capacity_draw"]).iloc[:1]  # files from before either column
    assert tables.baseline_ids(old) == ["baseline-t0-p1"]

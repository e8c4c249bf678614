"""`specbench report`: exact table rows (md, csv), plots in the HTML, comparison verdicts, skipped and
missing folders, filter/sort/top, and the command on a real tiny sweep."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import matplotlib.image
import pandas as pd
import pytest
from typer.testing import CliRunner

import specbench
from specbench.cli import app
from specbench.report import Format, ReportError, build_report, render, tables
from test_sweep import PROFILE, PROMPTS
from tiny import write_project

# --- synthetic results: exact values --------------------------------------------------------------

DEFAULTS = {
    "status": "ok", "error": None, "backend": "native", "n_requests": 4, "output_tokens": 40,
    "predicted_speedup": None, "acceptance_rate": None, "accepted_per_position": [], "drafted_per_position": None,
    "itl_ms_p50": 1.0, "itl_ms_p99": 2.0, "e2e_ms_p50": 1000.0, "e2e_ms_p99": 1100.0, "weight_mb": 500.0,
    "draft_ms_per_token": None, "verify_ms_per_step": None, "outputs_match_baseline": None,
    "target_model": "target", "draft_model": None, "draft_quantize": None, "ngram_min": None, "ngram_max": None,
    "point_key": "key",
}
FAILED = {name: None for name in ("tokens_per_s", "speedup", "speedup_ci_low", "speedup_ci_high",
                                  "mean_accepted_length", "ttft_ms_p50", "tpot_ms_p50", "tpot_ms_p90",
                                  "peak_memory_mb")}


def point(point_id: str, *, speedup=None, ci=(None, None), tokens_per_s=None, acceptance=None, mal=None,
          tpot=(None, None), ttft=None, peak=None, **extra) -> dict:
    draft, gamma, temperature = _parse_id(point_id)
    row = {**DEFAULTS, "point_id": point_id, "method": "baseline" if draft == "baseline" else
           ("ngram" if draft == "ngram" else "draft"), "draft": draft, "gamma": gamma, "temperature": temperature,
           "top_p": 1.0, "speedup": speedup, "speedup_ci_low": ci[0], "speedup_ci_high": ci[1],
           "tokens_per_s": tokens_per_s, "acceptance_rate": acceptance, "mean_accepted_length": mal,
           "tpot_ms_p50": tpot[0], "tpot_ms_p90": tpot[1], "ttft_ms_p50": ttft, "peak_memory_mb": peak}
    return {**row, **extra}


def _parse_id(point_id: str) -> tuple[str, int | None, float]:
    match = re.fullmatch(r"(\w+?)(?:-g(\d+))?-t([\d.]+)-p1", point_id)
    draft, gamma, temperature = match.groups()
    return draft, int(gamma) if gamma else None, float(temperature)


def points_frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=specbench.core.results.POINT_COLUMNS)
    return frame.astype({"gamma": "Int64", "outputs_match_baseline": "boolean", "error": "string",
                         **{c: "float64" for c in ("speedup", "speedup_ci_low", "speedup_ci_high", "tokens_per_s",
                                                   "acceptance_rate", "mean_accepted_length", "ttft_ms_p50",
                                                   "tpot_ms_p50", "tpot_ms_p90", "peak_memory_mb",
                                                   "predicted_speedup")}})


RUN_A = [
    point("baseline-t0-p1", speedup=1.0, ci=(1.0, 1.0), tokens_per_s=10.0, mal=1.0, tpot=(100.0, 120.0), ttft=50.0,
          peak=500.0, outputs_match_baseline=True),
    point("ngram-g2-t0-p1", speedup=1.5, ci=(1.4, 1.6), tokens_per_s=15.0, acceptance=0.5, mal=1.8, tpot=(60.0, 70.0),
          ttft=55.0, peak=510.0, outputs_match_baseline=True, predicted_speedup=1.6,
          accepted_per_position=[6, 3], drafted_per_position=[10, 6]),
    point("close-g2-t0-p1", speedup=1.2, ci=(1.1, 1.3), tokens_per_s=12.0, acceptance=0.8, mal=2.5, tpot=(80.0, 90.0),
          ttft=70.0, peak=800.0, outputs_match_baseline=True, predicted_speedup=1.1,
          accepted_per_position=[9, 7], drafted_per_position=[10, 9]),
    point("close-g3-t0-p1", status="failed", error="CUDA out of memory", **FAILED),
    point("close-g4-t0-p1", speedup=2.0, ci=(1.9, 2.1), tokens_per_s=20.0, acceptance=0.9, mal=3.0, tpot=(40.0, 50.0),
          ttft=80.0, peak=820.0, outputs_match_baseline=False, predicted_speedup=1.9,
          accepted_per_position=[9, 9, 8, 8], drafted_per_position=[10, 9, 9, 8]),
    point("baseline-t0.8-p1", speedup=1.0, ci=(1.0, 1.0), tokens_per_s=9.0, mal=1.0, tpot=(110.0, 130.0), ttft=52.0,
          peak=505.0),
    point("ngram-g2-t0.8-p1", speedup=1.1, ci=(0.9, 1.3), tokens_per_s=9.9, acceptance=0.3, mal=1.4,
          tpot=(95.0, 140.0), ttft=56.0, peak=515.0, predicted_speedup=1.0,
          accepted_per_position=[3, 1], drafted_per_position=[10, 3]),
    point("close-g2-t0.8-p1", speedup=0.9, ci=(0.8, 1.0), tokens_per_s=8.1, acceptance=0.6, mal=2.0,
          tpot=(120.0, 150.0), ttft=75.0, peak=805.0, predicted_speedup=1.2,
          accepted_per_position=[7, 5], drafted_per_position=[10, 7]),
]
RUN_B = [  # against RUN_A: ngram t0 faster, close-g2 t0 unchanged, ngram t0.8 slower, close-g3 failed in a
    point("baseline-t0-p1", speedup=1.0, ci=(1.0, 1.0), tokens_per_s=10.0, mal=1.0, outputs_match_baseline=True),
    point("ngram-g2-t0-p1", speedup=1.9, ci=(1.8, 2.0), tokens_per_s=19.0, outputs_match_baseline=True),
    point("close-g2-t0-p1", speedup=1.25, ci=(1.15, 1.35), tokens_per_s=12.5, outputs_match_baseline=True),
    point("close-g3-t0-p1", speedup=1.3, ci=(1.2, 1.4), tokens_per_s=13.0, outputs_match_baseline=True),
    point("ngram-g4-t0-p1", speedup=1.6, ci=(1.5, 1.7), tokens_per_s=16.0, outputs_match_baseline=True),
    point("baseline-t0.8-p1", speedup=1.0, ci=(1.0, 1.0), tokens_per_s=9.0, mal=1.0),
    point("ngram-g2-t0.8-p1", speedup=0.7, ci=(0.6, 0.8), tokens_per_s=6.3),
]
# per point: {category: [(output_tokens, e2e_ms) per request]}
CATEGORY_TIMES = {
    "baseline": {"chat": [(10, 1000.0), (10, 1000.0)], "code": [(10, 1000.0), (10, 1000.0)]},
    "ngram": {"chat": [(10, 1000.0), (10, 1000.0)], "code": [(10, 500.0), (10, 500.0)]},  # code 2x, chat 1x
    "close": {"chat": [(10, 800.0), (10, 800.0)], "code": [(10, 1000.0), (10, 1000.0)]},  # chat 1.25x, code 1x
}


def requests_frame(points: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for spec in points[points["status"] == "ok"].to_dict("records"):
        for category, measured in CATEGORY_TIMES[spec["draft"]].items():
            for index, (tokens, e2e_ms) in enumerate(measured):
                rows.append({"point_id": spec["point_id"], "request_id": f"{category}{index}#0",
                             "prompt_id": f"{category}{index}", "category": category, "output_tokens": tokens,
                             "e2e_ms": e2e_ms})
    return pd.DataFrame(rows)


def write_run(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True)
    points = points_frame(rows)
    points.to_parquet(folder / "points.parquet", index=False)
    requests_frame(points).to_parquet(folder / "requests.parquet", index=False)
    (folder / "manifest.json").write_text(json.dumps({
        "profile": {"backend": "native", "workload": {"prompts": "prompts.jsonl"}},
        "models": {"target": {"model": "tiny-target"}}, "environment": {"device": "cpu", "device_name": "test cpu"},
        "started_at": "2025-01-01T00:00:00", "status": "failed points"}))
    return folder


@pytest.fixture
def run_a(tmp_path: Path) -> Path:
    return write_run(tmp_path / "a", RUN_A)


@pytest.fixture
def run_b(tmp_path: Path) -> Path:
    return write_run(tmp_path / "b", RUN_B)


# --- tables ---------------------------------------------------------------------------------------

HEADER = ("| point | speedup | 95% CI | tok/s | accept | MAL | TPOT p50 ms | TPOT p90 ms | TTFT p50 ms | peak MB "
          "| status |")
GREEDY_ROWS = [
    "| close-g4-t0-p1 | 2.00x | 1.90-2.10 | 20.0 | 90% | 3.00 | 40.0 | 50.0 | 80.0 | 820 | **MISMATCH** |",
    "| **ngram-g2-t0-p1** (best) | 1.50x | 1.40-1.60 | 15.0 | 50% | 1.80 | 60.0 | 70.0 | 55.0 | 510 | ok |",
    "| close-g2-t0-p1 | 1.20x | 1.10-1.30 | 12.0 | 80% | 2.50 | 80.0 | 90.0 | 70.0 | 800 | ok |",
    "| baseline-t0-p1 | 1.00x | 1.00-1.00 | 10.0 | - | 1.00 | 100.0 | 120.0 | 50.0 | 500 | ok |",
    "| close-g3-t0-p1 | - | - | - | - | - | - | - | - | - | **failed** |",
]
SAMPLED_ROWS = [
    "| **ngram-g2-t0.8-p1** (best) | 1.10x | 0.90-1.30 | 9.9 | 30% | 1.40 | 95.0 | 140.0 | 56.0 | 515 | ok |",
    "| baseline-t0.8-p1 | 1.00x | 1.00-1.00 | 9.0 | - | 1.00 | 110.0 | 130.0 | 52.0 | 505 | ok |",
    "| close-g2-t0.8-p1 | 0.90x | 0.80-1.00 | 8.1 | 60% | 2.00 | 120.0 | 150.0 | 75.0 | 805 | ok |",
]


def markdown_tables(text: str) -> dict[str, list[str]]:
    """The rows of each table under a '### title' heading."""
    found, title = {}, None
    for line in text.splitlines():
        if line.startswith("### "):
            title = line[4:]
        elif line.startswith("|") and title is not None:
            found.setdefault(title, []).append(line)
    return found


def test_markdown_tables_have_exact_rows_per_temperature(run_a):
    text = render(build_report([run_a]), Format.md)
    found = markdown_tables(text)
    assert found["temperature 0"] == [HEADER, "|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|", *GREEDY_ROWS]
    assert found["temperature 0.8"][2:] == SAMPLED_ROWS
    assert "- close-g3-t0-p1: CUDA out of memory" in text
    assert ("> **WARNING: greedy outputs differ from the baseline at close-g4-t0-p1: the decoding is broken for this "
            "point, its speed means nothing.**") in text
    assert "`" + str(run_a) + "`: target tiny-target, backend native, device test cpu" in text


def test_markdown_category_speedups_come_from_the_requests(run_a):
    found = markdown_tables(render(build_report([run_a], filters=["temperature=0"]), Format.md))
    assert found["Speedup per workload category"] == [
        "| point | chat | code |", "|:--|--:|--:|",
        "| ngram-g2-t0-p1 | 1.00x | 2.00x |", "| close-g2-t0-p1 | 1.25x | 1.00x |",
    ]  # close-g4-t0-p1 is left out: its outputs do not match the baseline


def test_csv_has_one_exact_row_per_point(run_a):
    lines = render(build_report([run_a], filters=["temperature=0.8"]), Format.csv).splitlines()
    assert lines == [
        "run,temperature,top_p,point_id,method,draft,gamma,speedup,speedup_ci_low,speedup_ci_high,tokens_per_s,"
        "acceptance_rate,mean_accepted_length,tpot_ms_p50,tpot_ms_p90,ttft_ms_p50,peak_memory_mb,status,best,error",
        "a,0.8,1.0,ngram-g2-t0.8-p1,ngram,ngram,2,1.1,0.9,1.3,9.9,0.3,1.4,95.0,140.0,56.0,515.0,ok,True,",
        "a,0.8,1.0,baseline-t0.8-p1,baseline,baseline,,1.0,1.0,1.0,9.0,,1.0,110.0,130.0,52.0,505.0,ok,False,",
        "a,0.8,1.0,close-g2-t0.8-p1,draft,close,2,0.9,0.8,1.0,8.1,0.6,2.0,120.0,150.0,75.0,805.0,ok,False,",
    ]


def test_json_holds_points_categories_and_runs(run_a):
    document = json.loads(render(build_report([run_a]), Format.json))
    assert [p["point_id"] for p in document["points"]][:2] == ["close-g4-t0-p1", "ngram-g2-t0-p1"]
    assert document["points"][0]["status"] == "mismatch" and document["points"][1]["best"] is True
    assert document["runs"][0]["mismatched"] == ["close-g4-t0-p1"]
    assert document["comparison"] is None and document["skipped"] == []
    code = [c for c in document["category_speedups"] if c["point_id"] == "ngram-g2-t0-p1" and c["category"] == "code"]
    assert code == [{"point_id": "ngram-g2-t0-p1", "temperature": 0.0, "top_p": 1.0, "category": "code",
                     "tokens_per_s": 20.0, "baseline_tokens_per_s": 10.0, "speedup": 2.0, "run": "a"}]


# --- filter, sort, top ----------------------------------------------------------------------------


def shown(run: Path, **options) -> list[str]:
    return list(build_report([run], **options).points_table()["point_id"])


def test_filters_match_strings_and_numbers_and_or_within_a_key(run_a):
    assert shown(run_a, filters=["method=draft", "temperature=0"]) == ["close-g4-t0-p1", "close-g2-t0-p1",
                                                                        "close-g3-t0-p1"]
    assert shown(run_a, filters=["draft=ngram"]) == ["ngram-g2-t0-p1", "ngram-g2-t0.8-p1"]
    assert shown(run_a, filters=["gamma=2.0", "temperature=0.8"]) == ["ngram-g2-t0.8-p1", "close-g2-t0.8-p1"]
    assert shown(run_a, filters=["draft=ngram", "draft=baseline", "temperature=0"]) == ["ngram-g2-t0-p1",
                                                                                        "baseline-t0-p1"]
    assert shown(run_a, filters=["outputs_match_baseline=false"]) == ["close-g4-t0-p1"]


def test_sort_descends_for_speed_and_ascends_for_latency_and_memory(run_a):
    greedy = ["temperature=0"]
    assert shown(run_a, filters=greedy, sort="tokens_per_s")[:2] == ["close-g4-t0-p1", "ngram-g2-t0-p1"]
    assert shown(run_a, filters=greedy, sort="peak_memory_mb") == [
        "baseline-t0-p1", "ngram-g2-t0-p1", "close-g2-t0-p1", "close-g4-t0-p1", "close-g3-t0-p1"]
    assert shown(run_a, filters=greedy, sort="tpot_ms_p50")[0] == "close-g4-t0-p1"
    assert shown(run_a, filters=greedy, sort="acceptance_rate")[:3] == ["close-g4-t0-p1", "close-g2-t0-p1",
                                                                        "ngram-g2-t0-p1"]


def test_top_cuts_each_temperature_after_choosing_the_best(run_a):
    table = build_report([run_a], top=1, sort="peak_memory_mb").points_table()
    assert list(table["point_id"]) == ["baseline-t0-p1", "baseline-t0.8-p1"]
    assert not table["best"].any()  # the best points (the ngram ones) are decided before the cut
    shown = build_report([run_a], top=2)  # the per-category table keeps the shown points only
    assert set(shown.runs[0].categories["point_id"]) == {"ngram-g2-t0-p1", "ngram-g2-t0.8-p1"}


def test_bad_filter_sort_or_top_is_a_report_error_naming_the_known_keys(run_a):
    with pytest.raises(ReportError, match=r"unknown key 'colour'; known keys: point_id, status, error"):
        build_report([run_a], filters=["colour=red"])
    with pytest.raises(ReportError, match="expected KEY=VALUE"):
        build_report([run_a], filters=["method"])
    with pytest.raises(ReportError, match="temperature is numeric"):
        build_report([run_a], filters=["temperature=hot"])
    with pytest.raises(ReportError, match="--sort 'fastness': unknown column"):
        build_report([run_a], sort="fastness")
    with pytest.raises(ReportError, match="--top 0"):
        build_report([run_a], top=0)


# --- comparison -----------------------------------------------------------------------------------


def test_comparing_two_runs_gives_a_verdict_per_point(run_a, run_b):
    comparison = build_report([run_a, run_b]).comparison.set_index("point_id")
    assert comparison["verdict"].to_dict() == {
        "baseline-t0-p1": "no clear change",
        "ngram-g2-t0-p1": "faster",  # 1.8-2.0 vs 1.4-1.6: apart
        "close-g2-t0-p1": "no clear change",  # 1.15-1.35 vs 1.1-1.3: overlap
        "close-g3-t0-p1": "failed in a",
        "close-g4-t0-p1": "only in a",
        "baseline-t0.8-p1": "no clear change",
        "ngram-g2-t0.8-p1": "slower",  # 0.6-0.8 vs 0.9-1.3
        "close-g2-t0.8-p1": "only in a",
        "ngram-g4-t0-p1": "only in b",
    }
    assert comparison.at["ngram-g2-t0-p1", "change"] == pytest.approx(0.4)
    assert comparison["cis_overlap"].astype(object).where(comparison["cis_overlap"].notna(), None).to_dict() == {
        "baseline-t0-p1": True, "ngram-g2-t0-p1": False, "close-g2-t0-p1": True, "close-g3-t0-p1": None,
        "close-g4-t0-p1": None, "baseline-t0.8-p1": True, "ngram-g2-t0.8-p1": False, "close-g2-t0.8-p1": None,
        "ngram-g4-t0-p1": None}


def test_comparison_without_cis_says_so_and_renders_in_markdown(tmp_path, run_a):
    no_ci = write_run(tmp_path / "c", [point("ngram-g2-t0-p1", speedup=1.7, tokens_per_s=17.0,
                                             outputs_match_baseline=True)])
    report = build_report([run_a, no_ci], filters=["point_id=ngram-g2-t0-p1"])
    assert list(report.comparison["verdict"]) == ["no CI"]
    text = render(report, Format.md)
    assert "## Comparison: a -> c" in text
    assert "| ngram-g2-t0-p1 | 1.50x | 1.40-1.60 | 1.70x | - | +0.20 | no CI |" in text


# --- HTML -----------------------------------------------------------------------------------------

PNG_TAG = '<img src="data:image/png;base64,'


def embedded_pngs(html: str) -> list[bytes]:
    return [base64.b64decode(data) for data in re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)]


def test_html_is_self_contained_with_every_plot_as_a_decodable_png(run_a):
    html = render(build_report([run_a]), Format.html)
    assert html.count(PNG_TAG) == 5
    for png in embedded_pngs(html):
        image = matplotlib.image.imread(io.BytesIO(png), format="png")
        assert png.startswith(b"\x89PNG") and image.shape[0] > 100 and image.shape[1] > 100
    for title in ("Speedup vs gamma", "Acceptance by draft position", "Measured vs predicted speedup",
                  "Speedup per workload category", "Throughput vs peak memory"):
        assert f"<h3>{title}</h3><figure>" in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert '<tr class="best"><td>ngram-g2-t0-p1</td>' in html
    assert '<tr class="mismatch"><td>close-g4-t0-p1</td>' in html


def test_html_notes_a_plot_with_nothing_to_draw(tmp_path):
    baseline_only = write_run(tmp_path / "base", [RUN_A[0]])
    html = render(build_report([baseline_only]), Format.html)
    assert html.count(PNG_TAG) == 1  # throughput vs memory: the baseline alone
    assert html.count('<p class="missing">Not drawn: ') == 4
    assert "Not drawn: no per-position draft counts (the hf backend does not record them)." in html


def test_pareto_front_keeps_points_nobody_beats_on_speed_and_memory(run_a):
    points = pd.read_parquet(run_a / "points.parquet")
    front = points["point_id"][tables.pareto_front(points)]
    # t0: close-g4 is a mismatch (untrusted); close-g2 is slower and bigger than ngram-g2
    assert list(front) == ["baseline-t0-p1", "ngram-g2-t0-p1", "baseline-t0.8-p1", "ngram-g2-t0.8-p1"]


# --- folders --------------------------------------------------------------------------------------


def test_a_corrupt_folder_is_skipped_with_one_line_and_the_rest_renders(tmp_path, run_a):
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "points.parquet").write_bytes(b"not parquet at all")
    (corrupt / "requests.parquet").write_bytes(b"nor this")
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "manifest.json").write_text("{}")
    narrow = write_run(tmp_path / "narrow", RUN_A)
    points_frame(RUN_A).drop(columns=["speedup", "tpot_ms_p90"]).to_parquet(narrow / "points.parquet")
    report = build_report([tmp_path])  # a parent folder: a, corrupt, narrow, partial
    lines = [str(s) for s in report.skipped]
    assert lines[0].startswith(f"skipped {corrupt}: unreadable points.parquet: Could not open Parquet input source "
                               "'points.parquet': Parquet magic bytes not found")  # pyarrow's words
    assert "\n" not in lines[0]
    assert lines[1:] == [
        f"skipped {narrow}: points.parquet lacks columns: speedup, tpot_ms_p90",
        f"skipped {partial}: no points.parquet (an unfinished or partial run?)",
    ]
    assert [r.run.name for r in report.runs] == ["a"]
    assert GREEDY_ROWS[1] in render(report, Format.md)


def test_missing_empty_or_unreadable_paths_are_report_errors(tmp_path):
    with pytest.raises(ReportError, match=f"^no such folder: {tmp_path / 'nope'}$"):
        build_report([tmp_path / "nope"])
    with pytest.raises(ReportError, match="^an empty path was given"):
        build_report([""])
    with pytest.raises(ReportError, match=f"^no results in {tmp_path}: expected points.parquet in it or in its"):
        build_report([tmp_path])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "points.parquet").write_text("junk")
    with pytest.raises(ReportError, match=f"^no readable results in {bad} \\(skipped {bad}: no requests.parquet"):
        build_report([bad])


def test_two_folders_with_one_name_are_named_by_path(tmp_path):
    first, second = write_run(tmp_path / "x" / "run", RUN_A), write_run(tmp_path / "y" / "run", RUN_B)
    report = build_report([first, second])
    assert [r.run.name for r in report.runs] == [str(first), str(second)]


# --- the command ----------------------------------------------------------------------------------

# the sweep tests' project, one repeat of 8 tokens and no warm-up: the report only needs real results
TINY_PROFILE = (PROFILE.replace("max_new_tokens = 16", "max_new_tokens = 8")
                .replace("repeats = 2\nwarmup = 1", "warmup = 0"))
assert TINY_PROFILE != PROFILE


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory) -> Path:
    """A parent folder holding one real sweep of tiny models (run once for this module)."""
    project = write_project(tmp_path_factory.mktemp("tiny-project"), profile=TINY_PROFILE, prompts=PROMPTS)
    specbench.run(project / "tiny.toml", out=project / "results" / "tiny")
    return project / "results"


def report_cli(*args: str):
    return CliRunner().invoke(app, ["report", *map(str, args)])


def test_report_command_on_a_real_sweep(tiny_results, tmp_path):
    out = tmp_path / "report.html"
    result = report_cli(tiny_results, "--format", "html", "--out", out)
    assert result.exit_code == 0, result.output
    assert result.stderr == f"wrote {out}\n"
    pngs = embedded_pngs(out.read_text())
    assert len(pngs) == 5
    assert all(matplotlib.image.imread(io.BytesIO(png), format="png").size > 0 for png in pngs)

    result = report_cli(tiny_results / "tiny", "--filter", "draft=ngram", "--top", "1")
    assert result.exit_code == 0, result.output
    assert "temperature 0 " in result.stdout and "temperature 0.8 " in result.stdout
    assert "ngram-g" in result.stdout and "close-g" not in result.stdout and "baseline-t" not in result.stdout

    result = report_cli(tiny_results, "--format", "csv", "--sort", "peak_memory_mb")
    rows = pd.read_csv(io.StringIO(result.stdout))
    # tiny models take a millisecond a step: their timing may be flagged unstable on a busy machine, never failed
    assert len(rows) == 10 and set(rows["status"]) <= {"ok", "unstable"} and set(rows["run"]) == {"tiny"}


def test_report_command_skips_a_corrupt_folder_in_one_line(tmp_path, run_a):
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "points.parquet").write_bytes(b"\x00" * 64)
    (corrupt / "requests.parquet").write_bytes(b"\x00" * 64)
    result = report_cli(corrupt, run_a, "--format", "md")
    assert result.exit_code == 0, result.output
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith(f"skipped {corrupt}: unreadable points.parquet: ")
    assert GREEDY_ROWS[1] in result.stdout and f"- skipped {corrupt}: unreadable" in result.stdout


def test_report_command_writes_html_into_the_first_folder_without_out(run_a):
    result = report_cli(run_a, "--format", "html")
    assert result.exit_code == 0, result.output
    assert (run_a / "report.html").read_text().count(PNG_TAG) == 5


@pytest.mark.parametrize(("args", "message"), [
    (["nope"], "error: no such folder: nope"),
    ([""], "error: an empty path was given: pass a result folder (e.g. results/quickstart)"),
    (["{run}", "--filter", "colour=red"], "error: --filter 'colour=red': unknown key 'colour'; known keys: point_id,"),
    (["{run}", "--out", "x.txt"], "error: --out needs --format md, html, csv or json"),
])
def test_report_command_bad_input_is_one_line_and_exit_2(run_a, args, message):
    result = report_cli(*(arg.format(run=run_a) for arg in args))
    assert result.exit_code == 2
    assert result.stderr.startswith(message) and len(result.stderr.strip().splitlines()) == 1


def test_each_gamma_is_shown_beside_what_its_drafts_largest_gamma_predicts(tiny_results):
    points = pd.read_parquet(tiny_results / "tiny" / "points.parquet")
    drafted = points[points["method"] != "baseline"]
    assert drafted["max_gamma_predicted_speedup"].notna().all()  # the native backend records steps and costs
    manifest = json.loads((tiny_results / "tiny" / "manifest.json").read_text())
    assert len(manifest["verify_ms_by_tokens"]) == drafted["gamma"].max() + 1  # timed once, for the largest gamma

    result = report_cli(tiny_results / "tiny", "--format", "json")
    assert result.exit_code == 0, result.output
    rows = pd.DataFrame(json.loads(result.stdout)["across_gamma"])
    expected = drafted.set_index(["draft", "temperature", "gamma"])
    for row in rows.to_dict("records"):
        point = expected.loc[(row["draft"], row["temperature"], row["gamma"])]
        assert row["max_gamma_predicted_speedup"] == pytest.approx(point["max_gamma_predicted_speedup"])
        # the JSON keeps 4 significant digits: an error of ~0 (the largest gamma predicting itself) is noise
        assert row["error"] == pytest.approx(point["max_gamma_predicted_speedup"] / point["speedup"] - 1, rel=1e-3,
                                             abs=1e-6)
    markdown = report_cli(tiny_results / "tiny", "--format", "md").stdout
    assert "### Predicted from the largest gamma" in markdown and "from the largest gamma" in markdown

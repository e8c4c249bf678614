"""`specbench report` on a tune under load: per study, the best configuration per load level, the crossover,
the gamma schedule with its `--speculative-config`, and the verification of the schedule; a tune at one load
level (no "load" entry) shows none of it."""

from __future__ import annotations

import copy
import io
import json
import shlex
from html import escape
from pathlib import Path

import pytest
from rich.console import Console

from specbench.report import Format, build_report, render
from specbench.report.schedule import schedule_lines
from specbench.report.terminal import print_report
from test_report import markdown_tables
from test_report_tune import G, RECOMMENDATION, S, write_tune

LOAD = {
    "objective": "tokens_per_s",
    "mix": [{"load": "concurrency 1", "concurrency": 1, "request_rate": None, "weight": 0.5},
            {"load": "concurrency 4", "concurrency": 4, "request_rate": None, "weight": 0.25},
            {"load": "0.5 requests/s", "concurrency": None, "request_rate": 0.5, "weight": 0.25}],
    "levels": [
        {"load": "concurrency 1", "concurrency": 1, "request_rate": None, "weight": 0.5, "baseline_value": 18.2,
         "best": {"point_id": "ngram-g3-t0-p1", "draft": "ngram", "gamma": 3, "ngram_max": 3, "value": 25.0,
                  "speedup": 1.37, "speedup_ci": [1.2, 1.5]},
         "speculate": True, "single": {"value": 24.0, "speedup": 1.3, "speedup_ci": [1.1, 1.4], "loses": False}},
        {"load": "concurrency 4", "concurrency": 4, "request_rate": None, "weight": 0.25, "baseline_value": 52.0,
         "best": {"point_id": "ngram-g1-t0-p1", "draft": "ngram", "gamma": 1, "ngram_max": 3, "value": 53.0,
                  "speedup": 1.02, "speedup_ci": [0.97, 1.07]},
         "speculate": False, "single": {"value": 47.0, "speedup": 0.9, "speedup_ci": [0.85, 0.95], "loses": True}},
        {"load": "0.5 requests/s", "concurrency": None, "request_rate": 0.5, "weight": 0.25, "baseline_value": 9.5,
         "best": None, "speculate": False, "single": None},
    ],
    "crossover": {"concurrency": {"load": "concurrency 1", "concurrency": 1, "request_rate": None, "speedup": 1.37,
                                  "speedup_ci": [1.2, 1.5]},
                  "request_rate": None,
                  "note": "speculation measurably beats the baseline up to concurrency 1 (1.37x, 95% CI 1.20-1.50); "
                          "not above"},
    "schedule": {"draft": "ngram", "method": "ngram", "ngram_max": 3,
                 "gammas": [{"load": "concurrency 1", "concurrency": 1, "gamma": 3},
                            {"load": "concurrency 4", "concurrency": 4, "gamma": 0}],
                 "batch_size_ranges": [[1, 3, 3], [4, 8, 0]],
                 "speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                                        "prompt_lookup_min": 1,
                                        "num_speculative_tokens_per_batch_size": [[1, 3, 3], [4, 8, 0]]}},
    "single": {"point_id": "ngram-g3-t0-p1", "draft": "ngram", "gamma": 3, "ngram_max": 3, "mix_value": 20.1,
               "loses_at": ["concurrency 4"]},
    "verification": {
        "status": "measured", "reason": None, "folder": "verify",
        "levels": [
            {"load": "concurrency 1", "concurrency": 1, "request_rate": None,
             "baseline": {"point_id": "baseline-t0-p1", "tokens_per_s": 18.0, "goodput": None, "value": 18.0},
             "single": {"point_id": "ngram-g3-t0-p1", "tokens_per_s": 24.0, "speedup": 1.33, "speedup_ci": [1.2, 1.45],
                        "goodput": None, "value": 24.0},
             "schedule": None, "schedule_vs_single": None},
            {"load": "concurrency 4", "concurrency": 4, "request_rate": None,
             "baseline": {"point_id": "baseline-t0-p1-c4", "tokens_per_s": 51.0, "goodput": None, "value": 51.0},
             "single": {"point_id": "ngram-g3-t0-p1-c4", "tokens_per_s": 46.4, "speedup": 0.91,
                        "speedup_ci": [0.86, 0.96], "goodput": None, "value": 46.4},
             "schedule": {"point_id": "ngram-sched-t0-p1-c4", "tokens_per_s": 51.0, "speedup": 1.0,
                          "speedup_ci": [0.97, 1.03], "goodput": None, "value": 51.0},
             "schedule_vs_single": {"ratio": 1.1, "ci": [1.04, 1.16], "worse": False}},
            {"load": "0.5 requests/s", "concurrency": None, "request_rate": 0.5,
             "baseline": {"point_id": "baseline-t0-p1-r0.5", "tokens_per_s": 9.4, "goodput": None, "value": 9.4},
             "single": {"point_id": "ngram-g3-t0-p1-r0.5", "tokens_per_s": 9.5, "speedup": 1.01,
                        "speedup_ci": [0.95, 1.07], "goodput": None, "value": 9.5},
             "schedule": {"point_id": "ngram-sched-t0-p1-r0.5", "tokens_per_s": 9.7, "speedup": 1.03,
                          "speedup_ci": [0.96, 1.1], "goodput": None, "value": 9.7},
             "schedule_vs_single": {"ratio": 1.02, "ci": [0.97, 1.07], "worse": False}},
        ],
        "schedule_no_worse": True,
    },
}
ARGUMENT = ("--speculative-config '{\"method\":\"ngram\",\"num_speculative_tokens\":3,\"prompt_lookup_max\":3,"
            "\"prompt_lookup_min\":1,\"num_speculative_tokens_per_batch_size\":[[1,3,3],[4,8,0]]}'")
CROSSOVER = ("crossover: speculation measurably beats the baseline up to concurrency 1 (1.37x, 95% CI 1.20-1.50); "
             "not above")
VERDICT = ("verification measured (points in verify/points.parquet): the schedule is no worse than the single "
           "setting at any level")
LEVEL_ROWS = [
    "| load | weight | baseline tokens_per_s | best point | speedup [95% CI] | speculate | single [95% CI] "
    "| single loses |",
    "|:--|--:|--:|--:|--:|--:|--:|--:|",
    "| concurrency 1 | 0.5 | 18.2 | ngram-g3-t0-p1 | 1.37x [1.20-1.50] | yes | 1.30x [1.10-1.40] | no |",
    "| concurrency 4 | 0.25 | 52 | ngram-g1-t0-p1 | 1.02x [0.97-1.07] | no | 0.90x [0.85-0.95] | yes |",
    "| 0.5 requests/s | 0.25 | 9.5 | - | - | no | - | - |",
]
SCHEDULE_ROWS = ["| load | gamma |", "|:--|--:|", "| concurrency 1 | 3 |", "| concurrency 4 | off (no drafting) |"]
VERIFICATION_ROWS = [
    "| load | baseline tok/s | single [95% CI] | schedule [95% CI] | schedule/single [95% CI] | worse |",
    "|:--|--:|--:|--:|--:|--:|",
    "| concurrency 1 | 18.0 | 1.33x [1.20-1.45] | same as single | - | - |",
    "| concurrency 4 | 51.0 | 0.91x [0.86-0.96] | 1.00x [0.97-1.03] | 1.10x [1.04-1.16] | no |",
    "| 0.5 requests/s | 9.4 | 1.01x [0.95-1.07] | 1.03x [0.96-1.10] | 1.02x [0.97-1.07] | no |",
]
NEW_TITLES = ("Best configuration per load level", "Tuned schedule", "Verification of the schedule",
              "speculative-config", "crossover:", "single setting for the whole mix")


def with_load(load: dict) -> dict:
    """RECOMMENDATION with `load` in the greedy study's entry (the sampled study stays at one level)."""
    recommendation = copy.deepcopy(RECOMMENDATION)
    recommendation["temperatures"][0]["load"] = load
    return recommendation


def terminal(folder: Path) -> list[str]:
    """The terminal report's lines, as a 120-column log file gets them."""
    out = io.StringIO()
    print_report(Console(file=out, width=120), build_report([folder]))
    return [line.rstrip() for line in out.getvalue().splitlines()]


@pytest.fixture
def load_tune(tmp_path: Path) -> Path:
    return write_tune(tmp_path / "tune", recommendation=with_load(LOAD))


def test_markdown_shows_the_best_per_level_the_schedule_and_its_verification(load_tune):
    text = render(build_report([load_tune]), Format.md)
    found = markdown_tables(text)
    assert found[f"Best configuration per load level: temperature 0 (study {G})"] == LEVEL_ROWS
    assert found[f"Tuned schedule: temperature 0 (study {G})"] == SCHEDULE_ROWS
    assert found[f"Verification of the schedule: temperature 0 (study {G})"] == VERIFICATION_ROWS
    assert f"- {CROSSOVER}\n" in text
    assert ("- single setting for the whole mix: ngram-g3-t0-p1 (tokens_per_s 20.1 weighted over the mix); "
            "loses at concurrency 4\n") in text
    assert ("- draft ngram (method ngram, ngram_max 3), gamma by concurrency level\n"
            "- vLLM batch-size ranges: batch sizes 1-3: gamma 3; batch sizes 4-8: gamma off (no drafting)\n") in text
    assert f"```sh\n{ARGUMENT}\n```" in text
    assert f"**{VERDICT}**" in text
    # the sampled study was tuned at one load level: its section is as before
    sampled = text[text.index(f"### Tune: temperature 0.8 (study {S})"):]
    assert not any(title in sampled for title in NEW_TITLES)


def test_the_speculative_config_is_the_schedule_s_json_as_pasted(load_tune):
    """What a shell hands vLLM after `--speculative-config` is the recorded config, unchanged."""
    text = render(build_report([load_tune]), Format.md)
    line = next(line for line in text.splitlines() if line.startswith("--speculative-config "))
    flag, config = shlex.split(line)
    assert flag == "--speculative-config" and json.loads(config) == LOAD["schedule"]["speculative_config"]


def test_terminal_shows_the_tables_the_crossover_and_the_argument_on_one_line(load_tune):
    lines = terminal(load_tune)
    for title in ("Best configuration per load level", "Tuned schedule", "Verification of the schedule"):
        assert f"{title}: temperature 0 (study {G})" in lines
    assert ARGUMENT in lines and CROSSOVER in lines and VERDICT in lines
    assert any(line.split() == ["concurrency", "4", "off", "(no", "drafting)"] for line in lines)
    assert any(line.split() == ["concurrency", "1", "0.5", "18.2", "ngram-g3-t0-p1", "1.37x", "[1.20-1.50]", "yes",
                                "1.30x", "[1.10-1.40]", "no"] for line in lines)
    assert any(line.split() == ["concurrency", "4", "51.0", "0.91x", "[0.86-0.96]", "1.00x", "[0.97-1.03]", "1.10x",
                                "[1.04-1.16]", "no"] for line in lines)


def test_html_shows_the_tables_the_argument_and_the_verdict(load_tune):
    html = render(build_report([load_tune]), Format.html)
    for title in ("Best configuration per load level", "Tuned schedule", "Verification of the schedule"):
        assert f'<h4>{title}: temperature 0 (study {G})</h4>\n<div class="table-scroll"><table>' in html
    assert "<tr><td>concurrency 4</td><td>off (no drafting)</td></tr>" in html
    assert f"<pre><code>{escape(ARGUMENT)}</code></pre>" in html
    assert f"<li>{escape(CROSSOVER)}</li>" in html
    assert f"<p><strong>{escape(VERDICT)}</strong></p>" in html
    assert '<tr class="worse">' not in html


def test_a_schedule_worse_than_the_single_setting_is_flagged(tmp_path):
    load = copy.deepcopy(LOAD)
    load["verification"]["levels"][1]["schedule_vs_single"] = {"ratio": 0.9, "ci": [0.85, 0.95], "worse": True}
    load["verification"]["schedule_no_worse"] = False
    folder = write_tune(tmp_path / "tune", recommendation=with_load(load))
    verdict = ("verification measured (points in verify/points.parquet): the schedule is worse than the single "
               "setting at concurrency 4")
    text = render(build_report([folder]), Format.md)
    rows = markdown_tables(text)[f"Verification of the schedule: temperature 0 (study {G})"]
    assert rows[3] == "| concurrency 4 | 51.0 | 0.91x [0.86-0.96] | 1.00x [0.97-1.03] | 0.90x [0.85-0.95] | **WORSE** |"
    assert f"**{verdict}**" in text
    html = render(build_report([folder]), Format.html)
    assert '<tr class="worse"><td>concurrency 4</td>' in html and escape(verdict) in html
    assert verdict in terminal(folder)


@pytest.mark.parametrize("status,reason", [("skipped", "the profile has no server backend to launch"),
                                           ("failed", "the verification run failed: server never became ready")])
def test_a_verification_that_did_not_measure_is_one_line_with_its_reason(tmp_path, status, reason):
    load = copy.deepcopy(LOAD)
    load["verification"] = {"status": status, "reason": reason, "folder": None, "levels": [],
                            "schedule_no_worse": None}
    folder = write_tune(tmp_path / "tune", recommendation=with_load(load))
    line = f"verification {status}: {reason}"
    text = render(build_report([folder]), Format.md)
    assert f"**{line}**" in text and "Verification of the schedule" not in text
    assert f"Tuned schedule: temperature 0 (study {G})" in markdown_tables(text)  # the rest still shows
    html = render(build_report([folder]), Format.html)
    assert f"<p><strong>{escape(line)}</strong></p>" in html and "Verification of the schedule" not in html
    assert line in terminal(folder)


def test_without_a_schedule_the_report_says_why_and_offers_no_config(tmp_path):
    load = {**copy.deepcopy(LOAD), "schedule": None}
    load["verification"]["schedule_no_worse"] = None
    for level in load["verification"]["levels"]:
        level["schedule"] = level["schedule_vs_single"] = None
    folder = write_tune(tmp_path / "tune", recommendation=with_load(load))
    text = render(build_report([folder]), Format.md)
    assert "- no gamma schedule: speculation pays at no concurrency level\n" in text
    assert "speculative-config" not in text
    rows = markdown_tables(text)[f"Verification of the schedule: temperature 0 (study {G})"]
    assert rows[3] == "| concurrency 4 | 51.0 | 0.91x [0.86-0.96] | - | - | - |"
    assert ("**verification measured (points in verify/points.parquet): no schedule to compare; the single setting "
            "against the baseline**") in text


def test_a_tune_at_request_rates_alone_has_no_schedule_for_want_of_concurrency_levels():
    levels = [{"load": "0.5 requests/s", "concurrency": None, "request_rate": 0.5},
              {"load": "2 requests/s", "concurrency": None, "request_rate": 2.0}]
    assert schedule_lines({"levels": levels, "schedule": None}) == [
        "no gamma schedule: no concurrency levels in the profile"]


def test_a_tune_at_one_load_level_renders_as_before(tmp_path, load_tune):
    """No "load" entry: no new section in any format, and adding one only inserts the greedy study's section."""
    plain = write_tune(tmp_path / "plain" / "tune")  # named as load_tune: the reports differ in its path alone
    report, loaded = build_report([plain]), build_report([load_tune])
    for text in (render(report, Format.md), render(report, Format.html), "\n".join(terminal(plain))):
        assert not any(title in text for title in NEW_TITLES)
    before, after = render(report, Format.md), render(loaded, Format.md)
    start = after.index("### Best configuration per load level")
    end = after.index(f"### Tune: temperature 0.8 (study {S})")
    assert after[:start] + after[end:] == before.replace(str(plain), str(load_tune))

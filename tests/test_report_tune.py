"""`specbench report` on `specbench tune` output: the trial tables with the best value so far, the
recommendation, Optuna's parameter importances, the two tune plots, and a real replayed tune."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import matplotlib.image
import numpy as np
import pandas as pd
import pytest

from typer.testing import CliRunner

from specbench.cli import app
from specbench.report import Format, build_report, render
from specbench.report.trials import parameter_importances
from specbench.tune.outputs import trials_frame
from test_report import PNG_TAG, embedded_pngs, markdown_tables, report_cli
from test_tune import project  # noqa: F401 - a fixture

FIXTURES = Path(__file__).parent / "fixtures"

SPACE = {"drafts": [{"name": "small", "method": "draft", "model": "small-model", "quantize": None, "ngram_min": None,
                     "ngram_max_low": None, "ngram_max_high": None},
                    {"name": "ngram", "method": "ngram", "model": None, "quantize": None, "ngram_min": 1,
                     "ngram_max_low": 3, "ngram_max_high": 3}],
         "gamma": [1, 4]}


def trial(study: str, number: int, role: str, state: str, point_id: str, value=None, *, speedup=None, predicted=None,
          prompts=4, error=None) -> dict:
    draft, gamma, temperature = point_id.split("-")[0], int(point_id.split("-g")[1].split("-")[0]), \
        float(point_id.split("-t")[1].split("-")[0])
    measured = state in ("COMPLETE", "PRUNED")
    return {"study": study, "number": number, "state": state, "role": role, "point_id": point_id, "draft": draft,
            "gamma": gamma, "ngram_max": 3 if draft == "ngram" else None, "temperature": temperature, "top_p": 1.0,
            "value": value, "warm_start_prediction": predicted, "prompts_measured": prompts if measured else None,
            "trial_error": error, "status": "ok" if measured else None, "method": "ngram" if draft == "ngram" else
            "draft", "speedup": speedup, "speedup_ci_low": speedup and speedup - 0.1,
            "speedup_ci_high": speedup and speedup + 0.1, "tokens_per_s": value, "peak_memory_mb": 500.0 + gamma,
            "outputs_match_baseline": True if measured and temperature == 0 else None}


G, S = "demo-t0-p1", "demo-t0.8-p1"
TRIALS = [
    trial(G, 0, "calibration", "COMPLETE", "small-g4-t0-p1", 50.0, speedup=1.10),
    trial(G, 1, "calibration", "COMPLETE", "ngram-g4-t0-p1", 60.0, speedup=1.30),
    trial(G, 2, "warm_start", "COMPLETE", "ngram-g2-t0-p1", 80.0, speedup=1.70, predicted=1.75),
    trial(G, 3, "duplicate", "FAIL", "ngram-g2-t0-p1"),
    trial(G, 4, "search", "PRUNED", "small-g1-t0-p1", 90.0, prompts=1),  # a partial value: not a best
    trial(G, 5, "search", "COMPLETE", "ngram-g3-t0-p1", 78.0, speedup=1.65),
    trial(G, 6, "search", "FAIL", "small-g2-t0-p1", error="CUDA out of memory"),
    trial(S, 0, "calibration", "COMPLETE", "small-g4-t0.8-p1", 40.0, speedup=0.85),
    trial(S, 1, "calibration", "COMPLETE", "ngram-g4-t0.8-p1", 44.0, speedup=0.95),
]
RECOMMENDATION = {
    "objective": {"name": "tokens_per_s", "columns": ["tokens_per_s"], "directions": ["maximize"]},
    "search_space": SPACE,
    "temperatures": [
        {"study": G, "temperature": 0.0, "top_p": 1.0, "speculate": True, "trial": 2, "point_id": "ngram-g2-t0-p1",
         "speedup": 1.7, "speedup_ci": [1.6, 1.8], "objective_value": 80.0, "evaluations": 5},
        {"study": S, "temperature": 0.8, "top_p": 1.0, "speculate": False, "trial": 1, "point_id": "ngram-g4-t0.8-p1",
         "speedup": 0.95,
         "reason": "the best configuration (ngram-g4-t0.8-p1) is not measurably faster than the baseline"},
    ],
}
HEADER = "| trial | role | state | point | objective | best so far | speedup | warm-start pred. | prompts |"
GREEDY_TRIAL_ROWS = [
    "| 0 | calibration | complete | small-g4-t0-p1 | 50 | 50 | 1.10x | - | 4 |",
    "| 1 | calibration | complete | ngram-g4-t0-p1 | 60 | 60 | 1.30x | - | 4 |",
    "| 2 | warm_start | complete | ngram-g2-t0-p1 | 80 | 80 | 1.70x | 1.75x | 4 |",
    "| 4 | search | pruned | small-g1-t0-p1 | 90 | 80 | - | - | 1 |",
    "| 5 | search | complete | ngram-g3-t0-p1 | 78 | 80 | 1.65x | - | 4 |",
    "| 6 | search | fail | small-g2-t0-p1 | - | 80 | - | - | - |",
]


def write_tune(folder: Path, rows: list[dict] = TRIALS, recommendation: dict | None = RECOMMENDATION) -> Path:
    """A folder as `specbench tune --replay` leaves it: trials.parquet and recommendation.json, no points."""
    folder.mkdir(parents=True)
    trials_frame(rows).to_parquet(folder / "trials.parquet", index=False)
    if recommendation is not None:
        (folder / "recommendation.json").write_text(json.dumps(recommendation))
    return folder


@pytest.fixture
def tune_dir(tmp_path: Path) -> Path:
    return write_tune(tmp_path / "tune")


def test_markdown_lists_each_study_s_trials_with_the_best_value_so_far(tune_dir):
    text = render(build_report([tune_dir]), Format.md)
    found = markdown_tables(text)
    greedy = found[f"Tune: temperature 0 (study {G})"]
    assert greedy[0] == HEADER and greedy[2:] == GREEDY_TRIAL_ROWS
    assert found[f"Tune: temperature 0.8 (study {S})"][2:] == [
        "| 0 | calibration | complete | small-g4-t0.8-p1 | 40 | 40 | 0.85x | - | 4 |",
        "| 1 | calibration | complete | ngram-g4-t0.8-p1 | 44 | 44 | 0.95x | - | 4 |",
    ]
    assert ("**deploy ngram-g2-t0-p1: speedup 1.70x (95% CI 1.60-1.80), tokens_per_s 80 (median over repeats), "
            "chosen by trial 2 after 5 evaluations**") in text
    assert ("**do not speculate: the best configuration (ngram-g4-t0.8-p1) is not measurably faster than the baseline**"
            in text)
    assert "1 trial ran nothing (a duplicate of a claimed point, or past the budget); not listed." in text
    assert "- trial 6 (small-g2-t0-p1): CUDA out of memory" in text
    assert "parameter importances: not computed (2 completed trials; importances need at least 4)" in text
    # the points a replayed tune measured in full make the point tables (the completed trials, once each)
    assert [row.split(" | ")[0] for row in found["temperature 0"][2:]] == [
        "| **ngram-g2-t0-p1** (best)", "| ngram-g3-t0-p1", "| ngram-g4-t0-p1", "| small-g4-t0-p1"]


def test_best_so_far_follows_the_objective_s_direction(tmp_path):
    minimize = {**RECOMMENDATION, "objective": {"name": "tpot_ms_p50", "columns": ["tpot_ms_p50"],
                                                "directions": ["minimize"]}}
    report = build_report([write_tune(tmp_path / "tune", recommendation=minimize)])
    study = report.runs[0].studies[0]
    assert list(study.trials["best_so_far"]) == [50.0, 50.0, 50.0, 50.0, 50.0, 50.0]
    assert list(report.runs[0].studies[1].trials["best_so_far"]) == [40.0, 40.0]


def test_without_recommendation_json_the_trials_still_show(tmp_path):
    report = build_report([write_tune(tmp_path / "tune", recommendation=None)])
    study = report.runs[0].studies[0]
    assert study.trials["best_so_far"].isna().all() and study.recommendation is None
    assert study.importance_note == "no recommendation.json: the objective's direction is unknown"
    assert "no recommendation recorded for this study" in render(report, Format.md)


def test_importances_name_the_parameter_that_drives_the_objective():
    rng = np.random.default_rng(0)
    rows = [{"state": "COMPLETE", "draft": draft, "gamma": gamma, "ngram_max": None,
             "value": 100.0 - 10.0 * abs(gamma - 3) + rng.normal(0, 0.5)}
            for draft in ("small", "large") for gamma in range(1, 9)]
    space = {"drafts": [{"name": "small", "method": "draft"}, {"name": "large", "method": "draft"}], "gamma": [1, 8]}
    importances, note = parameter_importances(pd.DataFrame(rows), direction="maximize", space=space)
    assert note is None and set(importances) == {"draft", "gamma"}
    assert importances["gamma"] > 0.8 > importances["draft"]
    assert sum(importances.values()) == pytest.approx(1.0)
    swapped = [{**row, "value": 100.0 * (row["draft"] == "small") + rng.normal(0, 0.5)} for row in rows]
    importances, _ = parameter_importances(pd.DataFrame(swapped), direction="maximize", space=space)
    assert importances["draft"] > importances["gamma"]


def test_html_draws_objective_by_trial_and_importances(tune_dir):
    html = render(build_report([tune_dir]), Format.html)
    assert "<h3>Objective by trial</h3><figure>" in html and "<h3>Parameter importances</h3><figure>" in html
    # speedup vs gamma and throughput vs memory (these trials hold no per-position counts or predictions, and a
    # replayed tune no per-request rows), and both tune plots
    assert html.count(PNG_TAG) == 2 + 2
    assert all(matplotlib.image.imread(io.BytesIO(png), format="png").shape[0] > 100 for png in embedded_pngs(html))
    assert '<tr class="best"><td>2</td><td>warm_start</td>' in html
    assert '<tr class="failed"><td>6</td>' in html


def test_json_holds_each_study_with_trials_importances_and_recommendation(tune_dir):
    document = json.loads(render(build_report([tune_dir]), Format.json))
    greedy, sampled = document["tune"]
    assert greedy["study"] == G and greedy["direction"] == "maximize" and greedy["trials_not_run"] == 1
    assert [t["number"] for t in greedy["trials"]] == [0, 1, 2, 4, 5, 6]
    assert set(greedy["importances"]) == {"draft", "gamma"} and greedy["recommendation"]["trial"] == 2
    assert sampled["importances"] == {} and sampled["importance_note"].startswith("2 completed trials")


def test_filters_apply_to_trials_as_to_points(tune_dir):
    report = build_report([tune_dir], filters=["temperature=0.8"])
    assert [s.study for s in report.runs[0].studies] == [S]


def test_a_corrupt_trials_file_is_skipped_in_one_line(tmp_path, tune_dir):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "trials.parquet").write_bytes(b"junk")
    narrow = write_tune(tmp_path / "narrow")
    trials_frame(TRIALS).drop(columns=["role"]).to_parquet(narrow / "trials.parquet")
    report = build_report([tmp_path])
    assert [str(s) for s in report.skipped][1:] == [f"skipped {narrow}: trials.parquet lacks columns: role"]
    assert str(report.skipped[0]).startswith(f"skipped {broken}: unreadable trials.parquet: ")
    assert [r.run.name for r in report.runs] == ["tune"]


def test_report_command_on_a_real_replayed_tune(tmp_path):
    out = tmp_path / "tuned"
    tuned = CliRunner().invoke(app, ["tune", "--replay", str(FIXTURES / "synthetic-grid"), "--out", str(out),
                                     "--trials", "10"])
    assert tuned.exit_code == 0, tuned.output
    result = report_cli(out)
    assert result.exit_code == 0, result.output
    assert "Tune: temperature 0 (study synthetic-grid-tokens_per_s-t0-p1)" in result.stdout
    assert "parameter importances (Optuna, fANOVA): " in result.stdout
    recommendation = json.loads((out / "recommendation.json").read_text())
    for choice in recommendation["temperatures"]:
        assert f"deploy {choice['point_id']}: " in result.stdout
    html = tmp_path / "report.html"
    result = report_cli(out, "--format", "html", "--out", html)
    assert result.exit_code == 0, result.output
    assert html.read_text().count(PNG_TAG) == 4 + 2  # every point plot but the per-category heatmap, both tune plots
    shutil.copytree(out, tmp_path / "copy")  # two tunes: compared point by point like two runs
    result = report_cli(out, tmp_path / "copy", "--format", "md")
    assert result.exit_code == 0 and "## Comparison: tuned -> copy" in result.stdout


def test_report_command_on_a_live_tune_shows_its_points_and_its_trials(project):
    """A live tune writes points.parquet and requests.parquet as `specbench run` does, and trials.parquet."""
    tuned = CliRunner().invoke(app, ["tune", "tiny.toml", "--trials", "4", "--out", "tuned"])
    assert tuned.exit_code == 0, tuned.output
    report = build_report([project / "tuned"])
    (run,) = report.runs
    assert "baseline-t0-p1" in set(run.points["point_id"])  # the run's own points, baseline included
    assert len(run.categories) > 0  # per-request rows: the per-category speedups exist
    (study,) = run.studies
    assert len(study.trials) == 4 and set(study.trials["state"]) <= {"COMPLETE", "PRUNED", "FAIL"}
    html = render(report, Format.html)
    assert "<h3>Objective by trial</h3><figure>" in html and "<h3>Tune: " in html

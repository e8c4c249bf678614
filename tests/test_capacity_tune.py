"""`specbench tune --objective capacity` on the engine stand-in of tests/test_capacity_run.py (its capacity per
configuration known): a trial is one capacity search, the best capacity is recommended with its gain and cost over
the baseline's, and bad input is one line."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

import specbench.sweep.context
from specbench.cli import app
from test_capacity_run import PROFILE, StandIn


def test_a_capacity_tune_recommends_the_configuration_that_holds_the_slo_at_the_most_requests(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "standin.toml").write_text(PROFILE.replace("concurrency = true\n", ""))
    engine = StandIn({"baseline": 1.3, "ngram-n1-g3": 1.1, "ngram-n2-g3": 1.7, "ngram-n3-g3": 1.5}, {})
    monkeypatch.setattr(specbench.sweep.context, "get_backend", lambda name: engine)
    result = CliRunner().invoke(app, ["tune", "standin.toml", "--objective", "capacity", "--trials", "3",
                                      "--out", "tuned", "--no-verify"])
    assert result.exit_code == 0, result.output
    recommendation = json.loads((tmp_path / "tuned" / "recommendation.json").read_text())
    choice, = recommendation["temperatures"]
    assert recommendation["objective"]["name"] == "capacity" and choice["speculate"]
    assert choice["point_id"] == "ngram-n2-g3-t0-p1" and choice["ngram_max"] == 2
    capacity = choice["capacity"]
    assert capacity["status"] == capacity["baseline_status"] == "found"
    assert capacity["bracket"][0] <= 1.7 < capacity["bracket"][1] and capacity["capacity_rps"] == choice["objective_value"]
    assert capacity["baseline_bracket"][0] <= 1.3 < capacity["baseline_bracket"][1]
    assert capacity["interval"] == capacity["bracket"] and capacity["baseline_interval"] == capacity["baseline_bracket"]
    assert capacity["gain_interval"][0] > 0 and capacity["verdict"] == "higher"  # the one rule: the gain's interval
    assert capacity["gain_vs_baseline"] == pytest.approx(capacity["capacity_rps"] / capacity["baseline_capacity_rps"] - 1)
    assert capacity["measurably_higher"] and capacity["replicas_for_traffic"] == 3 and capacity["traffic_rps"] == 5.0
    assert capacity["usd_per_mtok_change_vs_baseline"] == pytest.approx(
        capacity["usd_per_mtok_at_capacity"] / capacity["baseline_usd_per_mtok_at_capacity"] - 1)
    trials = pd.read_parquet(tmp_path / "tuned" / "trials.parquet")
    # each the estimate of its search: where the fit crosses 0.8, a fifth of the way (in log load) from its bracket's
    # passing load (every request met the SLO) to its failing one (none did)
    assert dict(zip(trials["point_id"], trials["value"])) == pytest.approx({
        "ngram-n3-g3-t0-p1": 1.41 * (1.54 / 1.41) ** 0.2, "ngram-n2-g3-t0-p1": 1.68 * (1.83 / 1.68) ** 0.2,
        "ngram-n1-g3-t0-p1": 1.09 * (1.19 / 1.09) ** 0.2})
    assert list(trials["noise"].round(3)) == [0.065, 0.075, 0.05]  # half the interval: near-ties within it
    assert choice["usd_per_mtok"] == capacity["usd_per_mtok_at_capacity"]
    points = pd.read_parquet(tmp_path / "tuned" / "points.parquet")
    assert {"ngram-n2-g3-t0-p1-r1.68", "baseline-t0-p1-r1.3"} <= set(points["point_id"])  # every probe recorded


def test_a_capacity_tune_needs_a_capacity_table(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "standin.toml").write_text(PROFILE.split("[capacity]")[0])
    result = CliRunner().invoke(app, ["tune", "standin.toml", "--objective", "capacity", "--out", "tuned"])
    assert result.exit_code == 2
    assert result.output.strip() == ("error: --objective capacity: standin.toml has no [capacity] table: a trial is one "
                                     "capacity search (add [capacity], with an [slo])")
    assert not (tmp_path / "tuned").exists()
    (tmp_path / "standin.toml").write_text(PROFILE.replace("concurrency = true", "concurrency = true\nrate = false"))
    result = CliRunner().invoke(app, ["tune", "standin.toml", "--objective", "capacity", "--out", "tuned"])
    assert (result.exit_code, result.output.strip()) == (2, (
        "error: --objective capacity: a trial searches the highest request rate, which standin.toml turns off "
        "([capacity] rate = false): remove it"))
    assert not (tmp_path / "tuned").exists()


def test_a_tune_refuses_slo_limits_relative_to_the_serial_figures(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "standin.toml").write_text(PROFILE.replace("ttft_ms = 1000", 'ttft_ms = "3x serial"'))
    result = CliRunner().invoke(app, ["tune", "standin.toml", "--objective", "capacity", "--out", "tuned"])
    assert result.exit_code == 2
    assert result.output.strip() == (
        'error: standin.toml: slo.ttft_ms: a tune judges every trial against the same limits: give them in '
        'milliseconds (limits relative to the baseline\'s serial figures, "Nx serial", are for specbench run)')
    assert not (tmp_path / "tuned").exists()


def test_the_recommendation_panel_says_the_capacity_and_cost_beside_the_baselines():
    from rich.console import Console

    from specbench.tune.document import Recommendation
    from specbench.ui.tune import recommendation_panel

    capacity = {"capacity_rps": 1.71, "interval": [1.68, 1.83], "bracket": [1.68, 1.83], "status": "found",
                "baseline_capacity_rps": 1.32, "baseline_interval": [1.3, 1.41], "baseline_bracket": [1.3, 1.41],
                "baseline_status": "found", "gain_vs_baseline": 0.2955, "gain_interval": [0.2, 0.4],
                "verdict": "higher", "replicas_range": [3, 3], "baseline_replicas_range": [4, 4],
                "usd_per_mtok_at_capacity": 12.93, "baseline_usd_per_mtok_at_capacity": 16.33,
                "replicas_for_traffic": 3, "baseline_replicas_for_traffic": 4, "traffic_rps": 5.0, "usd_per_hour": 2.5}
    choice = {"temperature": 0.0, "top_p": 1.0, "speculate": True, "point_id": "ngram-n2-g3-t0-p1", "speedup": None,
              "speedup_ci": [None, None], "tokens_per_s": 77.4, "acceptance_rate": None, "peak_memory_mb": None,
              "engine_settings": {"vllm": {"args": []}, "llama_cpp": {}}, "capacity": capacity, "evaluations": 3,
              "trials": 3}
    console = Console(width=300, record=True)  # the sentence on one line of the panel
    console.print(recommendation_panel(Recommendation(objective={"name": "capacity"}, temperatures=[choice], space_size=3)))
    assert ("ngram-n2-g3-t0-p1 holds the SLO up to 1.71 requests/s [1.68, 1.83] against the baseline's 1.32 [1.3, "
            "1.41]: +30 % [+20 %, +40 %], measurably higher, $16.33 → $12.93 per 1M output tokens; 3 replicas for 5.0 "
            "requests/s against 4"
            ) in " ".join(console.export_text().split())


def test_the_reason_not_to_speculate_gives_both_capacities_and_the_gain_with_their_intervals():
    from specbench.tune.outputs import _capacity_gain

    capacity = {"capacity_rps": 1.412, "interval": [1.3, 1.5], "baseline_capacity_rps": 1.31,
                "baseline_interval": [1.2, None], "gain_vs_baseline": 0.0779, "gain_interval": [-0.04, 0.21]}
    assert _capacity_gain(capacity) == "capacity 1.41 [1.3, 1.5] against 1.31 [1.2, -] requests/s: gain +8 % [-4 %, +21 %]"
    unknown = {**capacity, "interval": None, "gain_vs_baseline": None, "gain_interval": None}
    assert _capacity_gain(unknown) == "capacity 1.41 [-, -] against 1.31 [1.2, -] requests/s: gain - [-, -]"

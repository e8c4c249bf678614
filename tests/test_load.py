"""Open-loop load levels: seeded arrival schedules at exactly the asked mean rate, prompts drawn with
replacement, goodput under SLOs from the request rows, a client that falls behind flagged, in-process backends
refusing a rate — and a rate sweep against a real llama-server (skipped where `make engines` has not built it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.core import summary
from specbench.backends.server.client import arrival_times
from specbench.backends.server.measure import request_plan
from specbench.cli import app
from specbench.profile import dump_profile, load_profile, profile_from_dict
from specbench.core.results import PointSpec, point_id
from specbench.workloads.prompts import load_prompts
from installed_engines import LLAMA_SERVER, needs_llama_server
from test_server import PROFILE

RATE_PROFILE = (PROFILE.split("[[drafts]]")[0]
                + '[[drafts]]\nname = "ngram"\nmethod = "ngram"\nngram_max = 3\n'
                + '[sweep]\ngamma = [3]\ntemperature = [0.0]\nconcurrency = [1]\nrequest_rate = [2.0, 8.0]\n'
                + '[workload]\nprompts = "builtin:mixed"\nmax_prompts = 3\nmax_new_tokens = 16\n'
                + '[load]\nrequests = 8\n[slo]\nttft_ms = 2000.0\ntpot_ms = 400.0\n[run]\nwarmup = 1\n')


def test_arrivals_are_seeded_at_exactly_the_asked_mean_rate_with_the_asked_burstiness():
    times = arrival_times(50, request_rate=4.0, burstiness=1.0, seed=3)
    assert times == arrival_times(50, request_rate=4.0, burstiness=1.0, seed=3)  # every point of a level alike
    assert times != arrival_times(50, request_rate=4.0, burstiness=1.0, seed=4)
    # as vLLM's client: the first arrives one gap after the start, the last at exactly count / rate
    assert 0.0 < times[0] < times[1] and (50 / times[-1]) == pytest.approx(4.0)
    gaps = {shape: np.diff(arrival_times(4000, request_rate=2.0, burstiness=shape, seed=0)) for shape in (0.25, 1.0, 4.0)}
    cv = {shape: g.std() / g.mean() for shape, g in gaps.items()}
    assert cv[1.0] == pytest.approx(1.0, abs=0.05)  # Poisson: exponential gaps
    assert cv[0.25] == pytest.approx(2.0, abs=0.15) and cv[4.0] == pytest.approx(0.5, abs=0.05)  # 1/sqrt(shape)


def session_of(requests: int | None) -> SimpleNamespace:
    data = {"name": "x", "backend": "server", "server": {"engine": "openai", "url": "http://127.0.0.1:1"},
            "target": {"model": "builtin:smollm2-135m-instruct"}, "sweep": {"gamma": [1], "temperature": [0.0],
            "request_rate": [1.0]}, "workload": {"prompts": "builtin:mixed", "max_prompts": 4},
            "load": {"requests": requests} if requests else {}, "run": {"repeats": 2, "seed": 5}}
    profile = profile_from_dict(data)
    return SimpleNamespace(profile=profile, prompts=load_prompts("builtin:mixed", max_prompts=4, categories=None))


def test_a_rate_level_takes_the_prompts_round_and_round_in_a_seeded_cyclic_order():
    session = session_of(10)
    rate = PointSpec.baseline(0.0, 1.0, request_rate=1.0)
    plan = request_plan(session, rate)
    assert len(plan) == 10 and plan == request_plan(session, PointSpec(
        point_id("d", 2, 0.0, 1.0, request_rate=1.0), "ngram", "d", 2, 0.0, 1.0, request_rate=1.0))
    ids = [(prompt.prompt_id, repeat) for _, prompt, repeat, _ in plan]
    assert len(set(ids)) == 10  # each draw is its own request, a prompt's repeat counting its draws
    assert len({prompt_id for prompt_id, _ in ids}) < 10
    # any 4 consecutive requests (4 prompts) hold each prompt once: every window has the prompt set's mix
    assert all(len({prompt_id for prompt_id, _ in ids[i:i + 4]}) == 4 for i in range(len(ids) - 3))
    assert sorted(len(plan_) for plan_ in [request_plan(session_of(None), rate)]) == [8]  # default: prompts x repeats
    distinct = request_plan(session_of(3), rate)
    assert len({p.prompt_id for _, p, _, _ in distinct}) == 3  # fewer requests than prompts: no prompt twice
    closed = request_plan(session, PointSpec.baseline(0.0, 1.0))
    assert [(p.prompt_id, r) for _, p, r, _ in closed][:3] == [(session.prompts[0].prompt_id, 0),
                                                                (session.prompts[0].prompt_id, 1),
                                                                (session.prompts[1].prompt_id, 0)]


def test_each_rate_level_draws_its_own_prompts_and_arrivals_the_same_for_every_configuration():
    from specbench.backends.server.measure import draw_seed

    session = session_of(10)
    baseline, ngram = (PointSpec.baseline(0.0, 1.0, request_rate=1.3),
                       PointSpec(point_id("d", 2, 0.0, 1.0, request_rate=1.3), "ngram", "d", 2, 0.0, 1.0,
                                 request_rate=1.3))
    assert draw_seed(5, baseline, 10) == draw_seed(5, ngram, 10)  # common random numbers across configurations
    assert request_plan(session, baseline) == request_plan(session, ngram)
    other = PointSpec.baseline(0.0, 1.0, request_rate=1.41)
    assert len({draw_seed(5, baseline, 10), draw_seed(5, other, 10), draw_seed(5, baseline, 20),
                draw_seed(6, baseline, 10)}) == 4
    assert request_plan(session, baseline) != request_plan(session, other)
    # a level sent again with twice the requests: a new draw, not the first one's arrivals again as its prefix
    first = arrival_times(10, request_rate=1.3, burstiness=1.0, seed=draw_seed(5, baseline, 10))
    again = arrival_times(20, request_rate=1.3, burstiness=1.0, seed=draw_seed(5, baseline, 20))
    same_seed = arrival_times(20, request_rate=1.3, burstiness=1.0, seed=draw_seed(5, baseline, 10))
    gaps = np.diff([0.0, *first])
    assert not np.allclose(np.diff([0.0, *again])[:10] / gaps, (np.diff([0.0, *again])[:10] / gaps)[0])
    assert np.allclose(np.diff([0.0, *same_seed])[:10] / gaps, (np.diff([0.0, *same_seed])[:10] / gaps)[0])


def test_a_recorded_rate_point_is_reused_only_with_the_same_burstiness_and_steady_window():
    from specbench.sweep.context import RunContext

    def key(burstiness: float, spec: PointSpec, *, lead_in_s: float = 0.0, sent_lead_in_s: float | None = None) -> str:
        profile = session_of(10).profile
        profile = profile.model_copy(update={"load": profile.load.model_copy(update={"burstiness": burstiness,
                                                                                     "lead_in_s": lead_in_s})})
        sent = profile if sent_lead_in_s is None else profile.model_copy(
            update={"load": profile.load.model_copy(update={"lead_in_s": sent_lead_in_s})})
        session = SimpleNamespace(draft_identity=lambda spec: None, profile=sent)
        return RunContext(profile, None, session, "run").point_key(spec)

    rate, closed = PointSpec.baseline(0.0, 1.0, request_rate=1.0), PointSpec.baseline(0.0, 1.0)
    assert key(1.0, rate) != key(4.0, rate) and key(1.0, rate) == key(1.0, rate)
    assert key(1.0, closed) == key(4.0, closed)  # in a closed loop no arrivals are drawn
    # a steady window is part of what was measured, at either kind of level, as the session sent it (a capacity
    # probe sends its search's lead-in whatever [load] says)
    for spec in (rate, closed):
        assert key(1.0, spec) != key(1.0, spec, lead_in_s=5.0) == key(1.0, spec, sent_lead_in_s=5.0)


def rate_rows(spec: PointSpec, *, ttft: list[float], tpot: list[float], starts: list[float], e2e: float = 400.0):
    return [{"point_id": spec.point_id, "point_key": "k", "request_id": f"p{i}#0", "prompt_id": f"p{i}",
             "category": "qa", "repeat": 0, "seed": i, "prompt_tokens": 10, "output_tokens": 11, "ttft_ms": t,
             "e2e_ms": e2e, "tokens_per_s": 11 / (e2e / 1e3), "tpot_ms": o, "itl_ms": [o] * 10, "target_steps": None,
             "decode_tokens": None, "drafted_tokens": None, "accepted_tokens": None, "rejected_steps": None,
             "accepted_per_position": [], "drafted_per_position": None, "draft_ms": None, "verify_ms": None,
             "peak_memory_growth_mb": None, "output_sha": f"s{i}", "output_ids": None, "top2_gap": None,
             "start_ms": s} for i, (t, o, s) in enumerate(zip(ttft, tpot, starts))]


def test_goodput_counts_the_requests_that_met_every_slo_over_the_wall_time():
    spec = PointSpec.baseline(0.0, 1.0, request_rate=2.0)
    starts = [0.0, 500.0, 1000.0, 1500.0]  # 2 requests/s, sent on time
    rows = rate_rows(spec, ttft=[100.0, 300.0, 100.0, 100.0], tpot=[20.0, 20.0, 80.0, 20.0], starts=starts)
    point = summary.summarize([spec], pd.DataFrame(rows), failures={}, context={},
                              slo={"ttft_ms": 200.0, "tpot_ms": 50.0}).iloc[0]
    wall_s = (1500.0 + 400.0) / 1e3
    assert point["slo_met_fraction"] == 0.5  # one too slow to start, one too slow per token
    assert point["goodput"] == pytest.approx(2 / wall_s)
    assert point["request_throughput"] == pytest.approx(4 / wall_s)
    assert point["tokens_per_s"] == pytest.approx(44 / wall_s)  # over the wall time, not per request
    assert point["achieved_request_rate"] == pytest.approx(2.0)
    assert point["slo"] == "ttft_ms <= 200, tpot_ms <= 50"
    assert point["ttft_ms_p99"] == pytest.approx(np.percentile([100, 300, 100, 100], 99))
    assert not point["unstable"]
    late = rate_rows(spec, ttft=[100.0] * 4, tpot=[20.0] * 4, starts=[0.0, 700.0, 1400.0, 2100.0])
    behind = summary.summarize([spec], pd.DataFrame(late), failures={}, context={}).iloc[0]
    assert behind["unstable"] and "the client sent 1.43 requests/s, not the 2 asked for" in behind["unstable_reason"]
    assert pd.isna(behind["goodput"]) and pd.isna(behind["slo"])  # no SLO given: no goodput


def test_a_steady_rate_points_throughput_is_over_its_window_not_its_lead_in():
    # 10 s of lead-in (3 requests sent, not recorded), then 4 measured requests at 2 requests/s: the window starts one
    # mean gap (0.5 s) before its first scheduled arrival — the first one, due at 10.2 s, went out 100 ms late
    spec = PointSpec.baseline(0.0, 1.0, request_rate=2.0)
    rows = rate_rows(spec, ttft=[100.0] * 4, tpot=[20.0] * 4, starts=[10_300.0, 10_800.0, 11_200.0, 11_700.0])
    for row, due in zip(rows, [10_200.0, 10_800.0, 11_200.0, 11_700.0]):
        row["scheduled_ms"] = due
    steady = summary.summarize([spec], pd.DataFrame(rows), failures={}, context={spec.point_id: {
        "lead_in_requests": 3, "tail_requests": 2, "window_s": 1.5}}, slo={"ttft_ms": 200.0}).iloc[0]
    wall_s = (11_700.0 + 400.0 - (10_200.0 - 500.0)) / 1e3
    assert steady["request_throughput"] == pytest.approx(4 / wall_s) == steady["goodput"]
    assert steady["tokens_per_s"] == pytest.approx(44 / wall_s)
    # without a lead-in (no steady columns) the schedule starts at 0, as vLLM's benchmark client times its run
    plain = summary.summarize([spec], pd.DataFrame(rows), failures={}, context={}).iloc[0]
    assert plain["request_throughput"] == pytest.approx(4 / 12.1)


def test_in_process_backends_refuse_a_rate_and_load_and_slo_round_trip(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.toml").write_text('name = "p"\n[target]\nmodel = "builtin:smollm2-135m-instruct"\n'
                                     '[sweep]\ngamma = [2]\ntemperature = [0.0]\nrequest_rate = [1.0]\n'
                                     '[workload]\nprompts = "builtin:mixed"\n')
    result = CliRunner().invoke(app, ["run", "p.toml"])
    assert result.exit_code == 2
    assert result.output.strip() == ('error: p.toml: sweep.request_rate: backend "native" runs one request at a time '
                                     'and cannot honour an arrival rate: remove request_rate, or use backend = "server"')
    assert not (tmp_path / "results").exists()
    (tmp_path / "rate.toml").write_text(RATE_PROFILE)
    profile = load_profile(tmp_path / "rate.toml")
    assert profile.load.requests == 8 and profile.slo.limits() == {"ttft_ms": 2000.0, "tpot_ms": 400.0}
    (tmp_path / "again.toml").write_text(dump_profile(profile))
    assert load_profile(tmp_path / "again.toml") == profile


@pytest.mark.alone  # what it asserts rests on the server keeping a rate
@needs_llama_server
def test_a_rate_sweep_on_a_real_server_sends_on_schedule_and_reports_goodput(tmp_path):
    (tmp_path / "rate.toml").write_text(RATE_PROFILE)
    result = subprocess.run([sys.executable, "-m", "specbench.cli", "run", "rate.toml", "--out", "out"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    points = pd.read_parquet(tmp_path / "out" / "points.parquet").set_index("point_id")
    requests = pd.read_parquet(tmp_path / "out" / "requests.parquet")
    assert sorted(points.index) == ["baseline-t0-p1", "baseline-t0-p1-r2", "baseline-t0-p1-r8", "ngram-g3-t0-p1",
                                    "ngram-g3-t0-p1-r2", "ngram-g3-t0-p1-r8"]
    for rate in (2, 8):
        mine, theirs = (requests[requests["point_id"] == f"{name}-t0-p1-r{rate}"] for name in ("ngram-g3", "baseline"))
        assert len(mine) == 8 and list(mine["scheduled_ms"]) == list(theirs["scheduled_ms"])  # the same arrivals
        assert list(mine["request_id"]) == list(theirs["request_id"])  # the same prompts, drawn with replacement
        assert (mine["start_ms"] - mine["scheduled_ms"]).max() < 100  # sent on time
        for name in ("ngram-g3", "baseline"):
            row = points.loc[f"{name}-t0-p1-r{rate}"]
            assert row["status"] == "ok", row["error"]
            assert pd.isna(row["concurrency"]) and row["request_rate"] == rate
            assert row["achieved_request_rate"] == pytest.approx(rate, rel=0.02)
            assert 0 <= row["slo_met_fraction"] <= 1 and row["goodput"] <= row["request_throughput"]
    at_8 = requests[requests["point_id"] == "baseline-t0-p1-r8"]
    finish = (at_8["start_ms"] + at_8["e2e_ms"]).to_numpy()
    assert max(((at_8["start_ms"] <= s) & (finish > s)).sum() for s in at_8["start_ms"]) > 1  # open loop overlaps
    assert "temperature 0, 8 requests/s" in result.stdout
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert len(manifest["server"]["launches"]) == 2  # a rate is per request: one launch per configuration

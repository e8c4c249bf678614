"""A capacity search against a real vLLM (its CPU build, made by `make engine-vllm`; skipped where it is not
installed) on the embedded SmolLM2: `specbench run` must find a knee — a passing and a failing probe — for the
baseline and for n-gram speculation. Every probe is a recorded rate point, and no vLLM is left behind.
Kept short: eager vLLM in one process (ready in ~35 s), the shortest prompts of builtin:mixed (43-81 tokens) and
8-token outputs, 12 requests per probe and no repeat of an undecided one (its point estimate decides), an 80 %
confidence, a 50 % resolution, a lead-in of 1.5 s and a 2 s window (at these rates the 12 requests take longer to
arrive: the window is theirs). The SLO (TTFT 4 s, TPOT 300 ms) holds several times over for a request alone on every
machine seen here (serial TPOT ~50 ms on the Xeon, 113-115 ms and TTFT ~0.85 s on the AMD EPYC with 16 tokens of
the longer prompts), so the knee is where requests queue, not where one request alone misses the SLO: with TPOT
100 ms the EPYC's serial requests already missed it and the search probed down to a quarter of its start before it
could say so. With 16 tokens of every category the knee lay near 0.36-0.51 requests/s on the EPYC (414 s for the
test); with these requests at 2.6 requests/s for the baseline and 0.89 for n-gram (200 s) while each probe's 12
requests were measured from an idle engine to its drain — a burst it absorbed —, and in a steady state (the lead-in
and window below, 2026-12-05 on the EPYC, 248 s) at 0.837 [0.739, 1.05] for the baseline and 0.809 [0.721, 1.02]
for n-gram.

How close two runs' capacities land is a property of the machine's timing, so it is measured by `make
bench-capacity`, not asserted here: with the SLO's TPOT limit (100 ms) within 20 % of the serial TPOT, two runs
on this 2-core machine found 0.926 and 0.618 requests/s for the baseline, and CI's 1.1 and 0.662."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pandas as pd
import pytest

from test_server_vllm import needs_vllm, vllm_pids, vllm_server

pytestmark = pytest.mark.alone  # a knee found by probing rates: nothing may share the cores

RESOLUTION = 0.5
LEAD_IN_S = 1.5
PROFILE = f"""
name = "vllm-capacity"
{vllm_server(max_num_seqs=8)}[[drafts]]
name = "ngram"
method = "ngram"
ngram_min = 3
ngram_max = 3
[sweep]
gamma = [3]
temperature = [0.0]
[workload]
prompts = "builtin:mixed"
categories = ["qa", "translation", "code", "math"]
max_prompts = 8
max_new_tokens = 8
[slo]
ttft_ms = 4000
tpot_ms = 300
[capacity]
attainment = 0.75
confidence = 0.8
requests = 12
max_requests = 12
lead_in_s = {LEAD_IN_S}
window_s = 2.0
resolution = {RESOLUTION}
max_probes = 16
[cost]
usd_per_hour = 1.0
[run]
warmup = 1
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("capacity")
    (folder / "capacity.toml").write_text(PROFILE)
    before = vllm_pids()
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "specbench.cli", "run", "capacity.toml", "--out", "out", "--fresh"],
                            cwd=folder, capture_output=True, text=True, timeout=1200)
    wall_s = time.monotonic() - started
    out = folder / "out"
    document = json.loads((out / "capacity.json").read_text()) if (out / "capacity.json").exists() else None
    return (result, document, out, wall_s), before


@needs_vllm
def test_the_search_finds_a_knee_for_the_baseline_and_n_gram(run):
    (result, document, out, wall_s), _ = run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = {entry["configuration"]: entry for entry in document["configurations"]}
    assert list(found) == ["baseline", "ngram γ3"]
    for name, entry in found.items():
        assert entry["status"] == "found", (name, entry["status"], entry["probes"])
        assert entry["bracket_low"] < entry["bracket_high"] <= entry["bracket_low"] * (1 + RESOLUTION) * 1.001
        decisions = {p["load"]: p["decision"] for p in entry["probes"]}
        assert decisions[entry["bracket_low"]].startswith("pass")  # the knee: a passing and a failing probe
        assert decisions[entry["bracket_high"]].startswith("fail")
        # the capacity fitted to every probe, inside its interval (open at an end where resamples met or missed the
        # target at every load: the note says so)
        low, high = entry["capacity_low"], entry["capacity_high"]
        assert (low is None or low <= entry["capacity"]) and (high is None or entry["capacity"] <= high)
        assert (low is not None and high is not None) or "interval reaches" in entry["note"]
        # every probe's load is fitted but those whose window was not a steady state (the engine's queue still
        # grew: a fail whose attainment is a transient's) or whose client sent late (void)
        steady = {p["load"] for p in entry["probes"] if "queue" not in p["decision"] and not p["void"]}
        assert sorted(steady) == [point[0] for point in entry["curve"]]
        assert entry["usd_per_mtok_at_capacity"] > 0
    ngram = found["ngram γ3"]
    assert ngram["gain_vs_baseline"] == pytest.approx(ngram["capacity"] / found["baseline"]["capacity"] - 1)
    assert ngram["gain_low"] <= ngram["gain_vs_baseline"] <= ngram["gain_high"]
    assert ngram["verdict"] == ("higher" if ngram["gain_low"] > 0 else "lower" if ngram["gain_high"] < 0 else "within")
    points = pd.read_parquet(out / "points.parquet").set_index("point_id")
    for entry in found.values():  # every probe is a recorded rate point
        for probe in entry["probes"]:
            row = points.loc[probe["point_id"]]
            assert row["status"] == "ok" and row["request_rate"] == probe["load"]
            assert row["n_requests"] >= probe["n_requests"]
            # in a steady state: a lead-in and a tail around the window (either may be empty at a low rate), the
            # window measured from its first arrival at or after the lead-in to the last
            assert row["lead_in_requests"] >= 0 and row["tail_requests"] >= 0 and row["window_s"] > 0
            # it began with vLLM's prefix cache emptied (its dev-mode endpoint), and the engine's own time series
            # over it: one entry per /metrics sample, in time order, the queue as vLLM counted it
            assert row["prefix_cache_reset"] == True  # noqa: E712 - a nullable boolean
            assert len(row["series_t_ms"]) == row["metrics_samples"] == len(row["series_requests_waiting"])
            assert list(row["series_t_ms"]) == sorted(row["series_t_ms"])
            assert max(row["series_requests_running"]) == row["requests_running_peak"]
            assert row["queue_time_ms_mean"] >= 0
    probes = points[points["request_rate"].notna()]
    assert probes["lead_in_requests"].sum() > 0 and probes["tail_requests"].sum() > 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert [c["configuration"] for c in manifest["capacity"]] == ["baseline", "ngram γ3"]
    assert "holds the SLO up to" in result.stdout and "per 1M output tokens" in result.stdout
    print(f"{out} ({wall_s:.0f} s): " + "; ".join(
        f"{e['configuration']} {e['capacity']:.3g} [{e['capacity_low']}, {e['capacity_high']}] (bracket "
        f"[{e['bracket_low']:g}, {e['bracket_high']:g}]) in "
        f"{len(e['probes'])} probes" for e in found.values()), file=sys.stderr)


@needs_vllm
def test_no_vllm_is_left_behind(run):
    _, before = run
    assert vllm_pids() <= before

"""`specbench run` with a [capacity] table, on an engine stand-in whose capacity is known (the sweep's backend
replaced in-process: the real-engine test is tests/test_capacity_vllm.py): every probe a recorded point, the
decisions in the terminal and the manifest, capacity.json with gains, costs and replicas, the headline, a rerun
that reuses every probe, the case that cannot bracket (exit 1), a failed probe, and bad input (exit 2, one line,
nothing written)."""

from __future__ import annotations

import hashlib
import json
import math
import os

import pandas as pd
import pytest
from typer.testing import CliRunner

import specbench.sweep.context
from specbench.capacity.estimate import ProbeRequests, between_repeats, estimate_capacity, run_dispersion
from specbench.capacity.sentence import number, percent_change
from specbench.backends.server.backend import launch_key
from specbench.backends.server.client import arrival_times
from specbench.backends.server.measure import request_plan
from specbench.cli import app
from specbench.models.load import load_tokenizer
from specbench.core.results import PointSpec
from specbench.workloads.build import build_workload

PROFILE = """
name = "standin"
backend = "server"
[server]
engine = "openai"
url = "http://127.0.0.1:9"
[target]
model = "builtin:smollm2-135m-instruct"
[[drafts]]
name = "ngram"
method = "ngram"
url = "http://127.0.0.1:10"  # the deployment that runs it (the stand-in serves both)
[sweep]
gamma = [3]
temperature = [0.0]
[workload]
prompts = "builtin:mixed"
max_prompts = 4
max_new_tokens = 48
[slo]
ttft_ms = 1000
[capacity]
attainment = 0.8
requests = 16
resolution = 0.1
concurrency = true
[cost]
usd_per_hour = 3.6
traffic_rps = 5
"""


class StandIn:
    """A serving engine stand-in: a request meets the TTFT SLO (100 ms, else 5 s) exactly when the load is at most
    the configuration's capacity (`rates` in requests/s, `concurrency` in requests in flight); one request at a
    time takes 1 s, so the search starts at 1 request/s."""

    name = "server"
    pins_local_devices = False
    launch_key = staticmethod(launch_key)

    def __init__(self, rates: dict[str, float], concurrency: dict[str, int], *, broken=lambda spec: False,
                 late_from: float | None = None, growing_from: float | None = None, burst_at: float | None = None,
                 share=None, drift: float = 1.0):
        self.rates, self.concurrency, self.broken = rates, concurrency, broken  # broken(spec): the point fails
        self.late_from = late_from  # from this rate up, every request is sent 500 ms late (a client that cannot keep up)
        self.growing_from = growing_from  # from this rate up, its queue grows over the point (5 more waiting)
        self.burst_at = burst_at  # at this rate the first draw's last quarter misses (a burst), later draws meet
        self.share = share  # share(spec, meets): the share of a rate probe's requests that meet (the rest at its end)
        self.drift = drift  # each repeat of a capacity search finds every capacity this many times the last one's
        self.points: list[str] = []  # the points it was asked to run, in order
        self.sent: list[int] = []
        self.windows: dict[str, tuple[float, float]] = {}  # per point: the lead-in and window it was sent with

    def open(self, profile, *, observer, out_dir=None):
        return StandInSession(profile, self)


class StandInSession:
    backend = "server"
    identity = {"target": "stand-in", "backend": "server"}

    def __init__(self, profile, engine: StandIn):
        self.profile, self.engine = profile, engine
        tokenizer, _ = load_tokenizer(profile.target.model)
        self.workload = build_workload(profile.workload, tokenizer, seed=profile.run.seed)
        self.prompts, self.prompt_tokens = self.workload.prompts, self.workload.prompt_tokens

    def draft_identity(self, spec):
        return None

    def gpu_uuids(self):
        return ()

    def gpu_claimed(self):
        return frozenset()

    def point_context(self, spec):
        return {"backend": "server", "target_model": "stand-in", "weight_mb": None}

    def own_pids(self):
        return [os.getpid()]

    def run_point(self, spec: PointSpec, *, point_key, on_request, after_prompt):
        self.engine.points.append(spec.point_id)
        self.last = spec
        if self.engine.broken(spec):
            raise RuntimeError("the engine died")
        plan = request_plan(self, spec)  # as the server backend plans it: [load] requests, or prompts x repeats
        self.engine.sent.append(len(plan))
        self.engine.windows[spec.point_id] = (self.profile.load.lead_in_s, self.profile.load.window_s)
        configuration = spec.point_id.split("-t")[0]  # "ngram-g3" (or "ngram-n2-g3" in a tune), else by draft
        if spec.open_loop:
            starts = [s * 1e3 for s in arrival_times(len(plan), request_rate=spec.request_rate, burstiness=1.0,
                                                     seed=self.profile.run.seed)]
            meets = spec.request_rate <= self.engine.rates.get(configuration, self.engine.rates.get(spec.draft)) * \
                self.engine.drift ** (spec.capacity_repeat or 0)
        else:
            starts = [1000.0 * (i // spec.concurrency) for i in range(len(plan))]
            meets = spec.concurrency <= self.engine.concurrency.get(spec.draft, 1)
        burst = spec.open_loop and spec.request_rate == self.engine.burst_at and spec.capacity_draw == 0
        share = self.engine.share(spec, meets) if self.engine.share and spec.open_loop else float(meets)
        rows = []
        for i, ((index, prompt, repeat, seed), start) in enumerate(zip(plan, starts)):
            ttft = 100.0 if i < share * len(plan) and not (burst and i >= 0.75 * len(plan)) else 5000.0
            e2e = 1000.0 if spec.concurrency == 1 else ttft + 900.0
            rows.append({
                "point_id": spec.point_id, "point_key": point_key, "request_id": f"{prompt.prompt_id}#{repeat}",
                "prompt_id": prompt.prompt_id, "category": prompt.category, "conversation_id": None, "turn": None,
                "repeat": repeat, "seed": seed, "prompt_tokens": 20, "output_tokens": 48, "ttft_ms": ttft,
                "e2e_ms": e2e, "tokens_per_s": 48 / e2e * 1e3, "tpot_ms": (e2e - ttft) / 47, "itl_ms": [],
                "target_steps": None, "decode_tokens": None, "drafted_tokens": None, "accepted_tokens": None,
                "rejected_steps": None, "accepted_per_position": [], "drafted_per_position": None, "draft_ms": None,
                "verify_ms": None, "peak_memory_growth_mb": None,
                "output_sha": hashlib.sha256(prompt.prompt_id.encode()).hexdigest()[:16], "output_ids": None,
                "top2_gap": None, "start_ms": start,
                "send_lateness_ms": 500.0 if spec.open_loop and self.engine.late_from is not None
                and spec.request_rate >= self.engine.late_from else (0.0 if spec.open_loop else None)})
            on_request()
        return rows

    def point_measurements(self):
        growing = self.engine.growing_from is not None and self.last.open_loop and \
            self.last.request_rate >= self.engine.growing_from
        return {"requests_waiting_growth": 5.0, "requests_running_peak": 8} if growing else {}

    def verify_costs(self, max_tokens):
        return ()

    def describe(self):
        return {"models": {}, "environment": {}}

    def close(self):
        pass


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "standin.toml").write_text(PROFILE)
    return tmp_path


def by_configuration(folder) -> dict[tuple[str, str], dict]:
    """capacity.json's entries by (configuration, axis)."""
    return {(e["configuration"], e["axis"]): e
            for e in json.loads((folder / "out" / "capacity.json").read_text())["configurations"]}


def run(monkeypatch, engine: StandIn, *args: str):
    monkeypatch.setattr(specbench.sweep.context, "get_backend", lambda name: engine)
    return CliRunner().invoke(app, ["run", "standin.toml", "--out", "out", *args])


def test_capacity_is_found_per_configuration_with_gain_cost_replicas_and_every_probe_recorded(folder, monkeypatch):
    engine = StandIn({"baseline": 1.3, "ngram": 1.7}, {"baseline": 3, "ngram": 5})
    result = run(monkeypatch, engine)
    assert result.exit_code == 0, result.output
    document = json.loads((folder / "out" / "capacity.json").read_text())
    assert document["target_attainment"] == 0.8 and document["slo"] == {"ttft_ms": 1000.0}
    assert (document["usd_per_hour"], document["traffic_rps"], document["resolution"]) == (3.6, 5.0, 0.1)
    found = {(e["configuration"], e["axis"]): e for e in document["configurations"]}
    assert list(found) == [("baseline", "concurrency"), ("baseline", "request_rate"), ("ngram γ3", "concurrency"),
                           ("ngram γ3", "request_rate")]
    baseline, ngram = found["baseline", "request_rate"], found["ngram γ3", "request_rate"]
    for entry, truth in ((baseline, 1.3), (ngram, 1.7)):
        assert entry["status"] == "found"
        assert entry["bracket_low"] <= truth < entry["bracket_high"] <= entry["bracket_low"] * 1.1
        # every request met the SLO at the bracket's low end and none at its high end: the fit crosses 0.8 a fifth
        # of the way (in log load) from one to the other, and the probes cannot place it closer than the two loads
        low, high = entry["bracket_low"], entry["bracket_high"]
        assert entry["capacity"] == pytest.approx(low * (high / low) ** 0.2)
        assert (entry["capacity_low"], entry["capacity_high"], entry["note"]) == (low, high, None)
        assert entry["attainment_low"][0] == 1.0
        assert entry["attainment_high"][0] == 0.0 and entry["attainment_high"][2] < 0.8
        assert entry["replicas_for_traffic"] == -(-5 // entry["capacity"])
        assert entry["replicas_range"] == [-(-5 // high), -(-5 // low)]
        assert [tuple(point[:2]) for point in entry["curve"]] == sorted({(p["load"], p["n_requests"]) for p in entry["probes"]})
    # the concurrency searched first; the rate search starts at the requests/s its highest passing concurrency
    # completed (3 in flight, 1 s each, 16 requests: 2.67), in steps of 1.25
    at_three = [p for p in found["baseline", "concurrency"]["probes"] if p["load"] == 3]
    assert (baseline["start"], baseline["start_from"]) == (pytest.approx(at_three[0]["request_throughput"]),
                                                           "concurrency 3")
    assert baseline["start"] == pytest.approx(16 / 6)
    # 2.67 / 1.25, / 1.25², / 1.25³, then bisecting (this stand-in's open loop holds half its closed loop's rate)
    assert [p["load"] for p in baseline["probes"]] == [2.67, 2.14, 1.37, 0.701, 0.98, 1.16, 1.26]
    assert [p["decision"] for p in baseline["probes"]] == ["fail"] * 3 + ["pass"] * 4
    assert (found["baseline", "concurrency"]["start"], found["baseline", "concurrency"]["start_from"]) == (1, "serial")
    assert ("baseline: the search starts at 2.67 requests/s, what concurrency 3 (the highest that held the SLO) "
            "completed, in steps of 1.25x") in " ".join(result.output.split())
    assert ngram["gain_vs_baseline"] == pytest.approx(ngram["capacity"] / baseline["capacity"] - 1)
    assert ngram["gain_low"] < ngram["gain_vs_baseline"] < ngram["gain_high"]
    assert ngram["verdict"] == "higher" and ngram["gain_low"] > 0 and baseline["verdict"] is None
    assert (found["baseline", "concurrency"]["capacity"], found["ngram γ3", "concurrency"]["capacity"]) == (3, 5)
    assert found["ngram γ3", "concurrency"]["gain_vs_baseline"] == pytest.approx(5 / 3 - 1)

    points = pd.read_parquet(folder / "out" / "points.parquet").set_index("point_id")
    for entry in (baseline, ngram):  # every probe is a recorded rate point with the same figures
        for probe in entry["probes"]:
            row = points.loc[probe["point_id"]]
            assert row["request_rate"] == probe["load"] and row["n_requests"] == probe["n_requests"] == 16
            assert row["goodput"] == pytest.approx(probe["goodput"])
            assert row["usd_per_mtok"] == pytest.approx(3.6 / (3600 * row["tokens_per_s"]) * 1e6)
        top = [p for p in entry["probes"] if p["load"] == entry["bracket_low"]][-1]  # the highest probe below it
        # a replica serving at capacity: its rate times what a request yields, not the probe's own tokens/s (which
        # divides by the drain after the last arrival too)
        assert top["output_tokens"] == points.loc[top["point_id"], "output_tokens"]
        assert entry["usd_per_mtok_at_capacity"] == pytest.approx(
            3.6 / (3600 * entry["capacity"] * top["output_tokens"] / top["n_requests"]) * 1e6)
        assert entry["usd_per_mtok_at_capacity"] < points.loc[top["point_id"], "usd_per_mtok"]
    assert "ngram-g3-t0-p1-r1.74" in points.index and "baseline-t0-p1-c4" in points.index
    assert ngram["usd_per_mtok_change_vs_baseline"] == pytest.approx(
        ngram["usd_per_mtok_at_capacity"] / baseline["usd_per_mtok_at_capacity"] - 1)

    manifest = json.loads((folder / "out" / "manifest.json").read_text())
    assert manifest["capacity"][0]["decisions"][0] == "1: 16 requests, 16 met: pass; next concurrency 2"
    assert manifest["capacity"][1]["decisions"][0] == "2.67: 16 requests, 0 met: fail; next 2.14 requests/s"
    assert "baseline: concurrency 1: attainment 1.00 [0.81, 1.00] of 16 >= 0.8: pass; next concurrency 2" in result.output
    assert (f"ngram γ3 holds the SLO up to {number(ngram['capacity'])} requests/s [{number(ngram['capacity_low'])}, "
            f"{number(ngram['capacity_high'])}] against the baseline's {number(baseline['capacity'])} "
            f"[{number(baseline['capacity_low'])}, {number(baseline['capacity_high'])}]: "
            f"{percent_change(ngram['gain_vs_baseline'])} [{percent_change(ngram['gain_low'])}, "
            f"{percent_change(ngram['gain_high'])}], measurably higher, $") in " ".join(result.output.split())
    assert "per 1M output tokens" in result.output and "replicas for 5.0 requests/s" in result.output

    # every probe in the search's steady state ([capacity] lead_in_s, window_s: 10 and 30 by default), but one request
    # at a time: the serial point, which the concurrency-1 probe is
    assert {point: window for point, window in engine.windows.items() if not point.endswith("-p1")} == {
        point: (10.0, 30.0) for point in engine.windows if not point.endswith("-p1")}
    assert engine.windows["baseline-t0-p1"] == engine.windows["ngram-g3-t0-p1"] == (0.0, 0.0)
    assert ("baseline: each probe is a 10 s lead-in at its load (not measured), then at least 16 requests sent over "
            "at least 30 s measured, the load held until they finish: about 41 s at 2.67 requests/s; at most 12 probes"
            in " ".join(result.output.split()))
    assert "window is shorter" not in result.output  # 30 s against a 1 s request

    engine.points.clear()  # the same search again: every probe is reused from the files, nothing runs
    again = run(monkeypatch, engine)
    assert again.exit_code == 0, again.output
    assert engine.points == [] and "(recorded point reused)" in again.output
    assert json.loads((folder / "out" / "capacity.json").read_text())["configurations"] == [
        {**e, "probes": [{**p, "reused": True, "duration_s": pytest.approx(p["duration_s"], abs=60)} for p in e["probes"]]}
        for e in document["configurations"]]


def test_a_start_rps_given_overrides_the_placement_from_the_concurrency(folder, monkeypatch):
    (folder / "standin.toml").write_text(PROFILE.replace("concurrency = true", "concurrency = true\nstart_rps = 1.1"))
    result = run(monkeypatch, StandIn({"baseline": 1.3, "ngram": 1.7}, {"baseline": 3, "ngram": 5}))
    assert result.exit_code == 0, result.output
    entry = by_configuration(folder)["baseline", "request_rate"]
    assert (entry["start"], entry["start_from"], entry["probes"][0]["load"]) == (1.1, "start_rps", 1.1)
    assert "what concurrency" not in result.output


def test_a_straddling_bracket_end_is_sent_again_with_twice_the_requests(folder, monkeypatch):
    (folder / "standin.toml").write_text(PROFILE.replace("attainment = 0.8", "attainment = 0.9")
                                         .replace("concurrency = true", "max_requests = 64"))
    engine = StandIn({"baseline": 1.3, "ngram": 1.7}, {})
    result = run(monkeypatch, engine)
    assert result.exit_code == 0, result.output
    document = json.loads((folder / "out" / "capacity.json").read_text())
    probes = document["configurations"][0]["probes"]
    # 16 of 16 is [0.81, 1.00]: it straddles 0.9 and leans pass; once the bracket is [1.3, 1.41], 1.3 is sent again
    # with 32 requests: [0.89, 1.00] still straddles; with 64, [0.94, 1.00] is a pass (it takes 35 to confirm 0.9:
    # a max_requests below that is refused up front, tests/test_profile.py)
    assert [(p["load"], p["n_requests"], p["decision"]) for p in probes] == [
        (1.0, 16, "undecided (leans pass)"), (2.0, 16, "fail"), (1.41, 16, "fail"),
        (1.19, 16, "undecided (leans pass)"), (1.3, 16, "undecided: add requests"),
        (1.3, 32, "undecided: add requests"), (1.3, 64, "pass")]
    assert engine.sent[:8] == [4, 16, 16, 16, 16, 16, 32, 64]  # the serial point (every prompt once), then the probes
    # each draw of 1.3 is a point of its own, with its own prompts and arrivals
    points = pd.read_parquet(folder / "out" / "points.parquet").set_index("point_id")
    drawn = ["baseline-t0-p1-r1.3", "baseline-t0-p1-r1.3-d2", "baseline-t0-p1-r1.3-d3"]
    assert [p["point_id"] for p in probes[4:]] == drawn
    assert points.loc[drawn, "n_requests"].tolist() == [16, 32, 64]
    assert points.loc[drawn, "capacity_draw"].tolist() == [0, 1, 2]
    assert points.loc[drawn, "request_rate"].tolist() == [1.3] * 3
    entry = document["configurations"][0]  # the fit: 1.0 at 1.3 (every draw's 112 requests), 0.0 at 1.41
    assert (entry["capacity"], entry["bracket_high"], entry["note"]) == (pytest.approx(1.3 * (1.41 / 1.3) ** 0.1), 1.41,
                                                                         None)
    assert entry["curve"][2] == [1.3, 16 + 32 + 64, 1.0]
    assert entry["attainment_low"][:2] == [1.0, pytest.approx(64 / (64 + 1.959964**2))]


def test_a_failing_end_whose_misses_came_together_is_drawn_again_and_the_search_goes_on(folder, monkeypatch):
    (folder / "standin.toml").write_text(PROFILE.replace("attainment = 0.8", "attainment = 0.9")
                                         .replace("concurrency = true", "max_requests = 64"))
    # the baseline holds the SLO up to 1.3, but the first draw at 1.19 met only its first 12 of 16 requests (a burst
    # at the end of its window): its Wilson interval [0.51, 0.90) is a fail, its misses are one block of neighbours
    engine = StandIn({"baseline": 1.3, "ngram": 1.7}, {}, burst_at=1.19)
    result = run(monkeypatch, engine)
    assert result.exit_code == 0, result.output
    entry = by_configuration(folder)["baseline", "request_rate"]
    probes = [(p["load"], p["n_requests"], p["met"]) for p in entry["probes"]]
    assert probes[3] == (1.19, 16, 12) and probes[4][0] == 1.09  # bisected below it, and resolved there
    # the bracket [1.09, 1.19] was resolved, but the capacity's interval from the requests (blocks of neighbours
    # resampled) reached above 1.19: 1.19 drawn again with 64 requests, every one met, and the search went on above
    narrowing = next(i for i, p in enumerate(entry["probes"]) if p["next"].startswith("next 1.19 requests/s with 64"))
    assert "the capacity's interval reaches above 1.19" in entry["probes"][narrowing]["next"]
    assert (1.19, 64, 64) in probes and probes.index((1.19, 64, 64)) == narrowing + 1
    assert entry["bracket_low"] <= 1.3 < entry["bracket_high"] and entry["capacity_high"] is not None
    assert "(the capacity's interval reaches above 1.19: a new draw there with 64 requests)" in \
        " ".join(result.output.split())


def test_a_configuration_that_misses_the_slo_at_its_lowest_rate_is_recorded_and_exits_1(folder, monkeypatch):
    # one request at a time meets the SLO (concurrency 1 holds it), every rate misses it
    engine = StandIn({"baseline": 1.3, "ngram": 0.0}, {"baseline": 3, "ngram": 1})
    result = run(monkeypatch, engine)
    assert result.exit_code == 1, result.output
    found = by_configuration(folder)
    entry = found["ngram γ3", "request_rate"]
    assert entry["status"] == "not bracketed: misses the SLO at its lowest rate 0.25"
    # from what concurrency 1 completed (1 request/s) in steps of 1.25, 1.25², 1.25³, down to the serial rate / 4
    assert (entry["start"], entry["start_from"]) == (1.0, "concurrency 1")
    assert [p["load"] for p in entry["probes"]] == [1.0, 0.8, 0.512, 0.262, 0.25]
    assert entry["capacity"] is None and entry["gain_vs_baseline"] is None and entry["bracket_high"] == 0.25
    assert found["ngram γ3", "concurrency"]["capacity"] == 1
    assert found["baseline", "request_rate"]["status"] == "found"
    assert ("ngram γ3: no request-rate capacity found (not bracketed: misses the SLO at its lowest rate 0.25)"
            in result.output)


def test_a_configuration_whose_requests_alone_miss_the_slo_is_not_searched(folder, monkeypatch):
    engine = StandIn({"baseline": 1.3, "ngram": 0.0}, {"baseline": 3, "ngram": 0})
    result = run(monkeypatch, engine)
    assert result.exit_code == 1, result.output
    found = by_configuration(folder)
    entry = found["ngram γ3", "request_rate"]
    # TTFT 5 s one request at a time against a 1 s limit: no rate can do better, so no rate is probed
    # (the concurrency search, first, sent 16 at concurrency 1)
    reason = "one request at a time already misses it (ttft_ms p50 5000 > 1000, 16 requests)"
    assert (entry["status"], entry["probes"], entry["capacity"]) == (f"not bracketed: {reason}", [], None)
    assert "ngram-g3-t0-p1-r1" not in engine.points
    assert f"ngram γ3: {reason}: no rate can hold the SLO, the search stops" in " ".join(result.output.split())
    assert f"ngram γ3: no request-rate capacity found (not bracketed: {reason})" in " ".join(result.output.split())
    # the closed loop is searched as before: concurrency 1 is its lowest
    assert found["ngram γ3", "concurrency"]["status"] == "not bracketed: misses the SLO at its lowest concurrency 1"
    assert found["baseline", "request_rate"]["status"] == "found"


def test_a_probe_whose_point_fails_is_a_failing_probe_and_a_search_with_nothing_measured_fails(folder, monkeypatch):
    engine = StandIn({"baseline": 1.3, "ngram": 1.7}, {"baseline": 3, "ngram": 5},
                     broken=lambda spec: spec.open_loop and (spec.request_rate == 2.14 or spec.draft == "ngram"))
    result = run(monkeypatch, engine)
    assert result.exit_code == 1, result.output
    entries = by_configuration(folder)
    baseline = entries["baseline", "request_rate"]
    assert baseline["status"] == "found" and baseline["bracket_low"] <= 1.3 < baseline["bracket_high"]
    at_2 = baseline["probes"][1]
    assert (at_2["load"], at_2["n_requests"], at_2["met"], at_2["error"]) == (
        2.14, 16, 0, "baseline-t0-p1-r2.14: RuntimeError: the engine died")
    assert at_2["decision"] == "fail (the point failed: baseline-t0-p1-r2.14: RuntimeError: the engine died)"
    ngram = entries["ngram γ3", "request_rate"]  # every rate probe of n-gram failed: nothing measured, no capacity
    # from what its concurrency capacity 5 completed, steps growing, down to the lowest (the serial rate / 4)
    assert [(p["load"], p["met"]) for p in ngram["probes"]] == [(4.0, 0), (3.2, 0), (2.05, 0), (1.05, 0), (0.43, 0),
                                                                (0.25, 0)]
    assert ngram["status"] == "failed: ngram-g3-t0-p1-r0.25: RuntimeError: the engine died"
    assert entries["ngram γ3", "concurrency"]["status"] == "found"  # its closed-loop points ran
    assert "baseline: 2.14 requests/s: attainment 0.00 [0.00, 0.19] of 16 < 0.8: fail (the point failed" in result.output


@pytest.mark.parametrize("edit, message", [
    (lambda p: p.replace("[slo]\nttft_ms = 1000\n", ""),
     "slo: a capacity search needs an SLO to hold: add an [slo] table (ttft_ms, tpot_ms and/or e2e_ms)"),
    (lambda p: p.replace("attainment = 0.8", "attainment = 0.0"), "capacity.attainment: must be a number in (0, 1] (got 0.0)"),
    (lambda p: p.replace("attainment = 0.8", "attainment = 1.5"), "capacity.attainment: must be a number in (0, 1] (got 1.5)"),
    (lambda p: p.replace("usd_per_hour = 3.6", "usd_per_hour = -1.0"), "cost.usd_per_hour: must be a number > 0 (got -1.0)"),
    (lambda p: p.replace("usd_per_hour = 3.6", "usd_per_hour = 0"), "cost.usd_per_hour: must be a number > 0 (got 0.0)"),
    (lambda p: p.replace('backend = "server"', 'backend = "native"').split("[server]")[0] + "[target]"
     + p.split("[target]")[1],
     'capacity: a capacity search sends requests at rates to a serving engine: set backend = "server" (backend '
     '"native" runs one request at a time), or remove [capacity]'),
    (lambda p: p.replace("resolution = 0.1", "resolution = 0.1\nresolution_rps = 0.2"),
     "capacity.resolution_rps: give one of resolution (relative, e.g. 0.1) and resolution_rps (requests/s), not both"),
    (lambda p: p.replace("attainment = 0.8\n", "").replace("requests = 16", "requests = 16\nmax_requests = 64"),
     "capacity.max_requests: 64 requests per probe can never confirm attainment 0.95 at confidence 0.95, even when "
     "every one meets the SLO (it takes 73 requests): raise max_requests to 73, or lower attainment or confidence"),
    (lambda p: p.replace("attainment = 0.8", "attainment = 0.99"),
     "capacity.requests: 64 requests per probe can never confirm attainment 0.99 at confidence 0.95, even when every "
     "one meets the SLO (it takes 381 requests): raise requests (probes grow to 4 x requests) or set max_requests to "
     "381, or lower attainment or confidence"),
    (lambda p: p.replace("attainment = 0.8", "attainment = 1.0"),
     "capacity.attainment: 1 can never be confirmed: a probe's interval never reaches it, however many requests meet "
     "the SLO; use a share below 1, e.g. 0.99"),
    (lambda p: p.replace("requests = 16", "requests = 16\nlead_in_s = -1.0"),
     "capacity.lead_in_s: must be a number >= 0 (got -1.0)"),
    (lambda p: p.replace("concurrency = true", "concurrency = false\nrate = false"),
     "capacity.rate: searches no axis: set rate = true (the highest request rate) or concurrency = true (the highest "
     "concurrency), or both"),
    (lambda p: p.replace("requests = 16", "requests = 16\nrepeats = 0"),
     "capacity.repeats: must be an integer >= 1 (got 0)"),
    (lambda p: p.replace("ttft_ms = 1000", 'ttft_ms = "3x serial"').replace("temperature = [0.0]",
                                                                        "temperature = [0.0]\nconcurrency = [2]"),
     'slo.ttft_ms: "3x serial" is relative to the baseline\'s serial figures, its point at concurrency 1: add 1 to '
     "[sweep] concurrency, or give the limit in milliseconds"),
    (lambda p: p.replace("ttft_ms = 1000", 'ttft_ms = "3 x the serial"'),
     'slo.ttft_ms: must be a number > 0 (milliseconds) or "Nx serial", e.g. "2x serial" (got "3 x the serial")'),
    (lambda p: p.replace("ttft_ms = 1000", 'ttft_ms = "0x serial"'),
     'slo.ttft_ms: must be a number > 0 (milliseconds) or "Nx serial", e.g. "2x serial" (got "0x serial")'),
])
def test_bad_capacity_or_cost_input_is_one_line_exit_2_and_nothing_written(folder, edit, message):
    (folder / "bad.toml").write_text(edit(PROFILE))
    result = CliRunner().invoke(app, ["run", "bad.toml", "--out", "out"])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: bad.toml: {message}"
    assert not (folder / "out").exists()


def test_a_price_from_the_command_line_is_checked_like_the_profiles(folder):
    result = CliRunner().invoke(app, ["run", "standin.toml", "--out", "out", "--usd-per-hour", "0"])
    assert result.exit_code == 2 and result.output.strip() == "error: standin.toml: cost.usd_per_hour: must be a number > 0 (got 0.0)"
    result = CliRunner().invoke(app, ["run", "standin.toml", "--out", "out", "--workers", "2"])
    assert result.exit_code == 2 and "capacity: a capacity search decides each probe from the last, in one process" in result.output
    assert not (folder / "out").exists()


def test_the_headline_says_when_a_gain_is_not_measurable():
    from specbench.capacity.document import document_from_dict
    from specbench.ui.run import capacity_lines

    def entry(name, method, capacity, low, high, gain=None, gain_low=None, gain_high=None, verdict=None):
        return {"configuration": name, "method": method, "axis": "request_rate", "temperature": 0.0, "top_p": 1.0,
                "status": "found", "capacity": capacity, "capacity_low": low, "capacity_high": high,
                "bracket_low": low, "bracket_high": high, "gain_vs_baseline": gain, "gain_low": gain_low,
                "gain_high": gain_high, "verdict": verdict,
                "usd_per_mtok_at_capacity": 0.58 if method == "baseline" else 0.547,
                "usd_per_mtok_change_vs_baseline": None if method == "baseline" else -0.057,
                "replicas_for_traffic": 8, "replicas_range": [7, 8], "note": None}

    document = document_from_dict({
        "version": 2, "target_attainment": 0.9, "slo": {"ttft_ms": 1000.0, "tpot_ms": 100.0}, "traffic_rps": 10.0,
        "usd_per_hour": 2.0, "confidence": 0.95,
        "configurations": [entry("baseline", "baseline", 1.35, 1.32, 1.44),
                           entry("ngram γ3", "ngram", 1.43, 1.4, 1.54, 0.0593, -0.05, 0.18, "within")]})
    assert capacity_lines(document) == [
        "capacity: the highest load at which 90% of requests meet ttft_ms <= 1000, tpot_ms <= 100, fitted to every "
        "probe [95% interval]",
        "temperature 0",
        "  baseline holds the SLO up to 1.35 requests/s [1.32, 1.44]: $0.58 per 1M output tokens at capacity; 8 "
        "(7-8) replicas for 10.0 requests/s",
        "  ngram γ3 holds the SLO up to 1.43 requests/s [1.4, 1.54] against the baseline's 1.35 [1.32, 1.44]: +6 % "
        "[-5 %, +18 %], not measurably different, $0.58 → $0.55 per 1M output tokens (-6 %); 8 (7-8) replicas for "
        "10.0 requests/s against 8 (7-8)"]


def test_slo_limits_relative_to_the_baselines_serial_figures_are_resolved_from_its_serial_point(folder, monkeypatch):
    # the stand-in's serial requests have a TTFT of 100 ms: "3x serial" is 300 ms, which every load up to the
    # configuration's capacity meets (100 ms) and every load past it misses (5 s): the same capacities as 1000 ms
    (folder / "standin.toml").write_text(PROFILE.replace("ttft_ms = 1000", 'ttft_ms = "3x serial"'))
    engine = StandIn({"baseline": 1.3, "ngram": 1.7}, {"baseline": 3, "ngram": 5})
    result = run(monkeypatch, engine)
    assert result.exit_code == 0, result.output
    document = json.loads((folder / "out" / "capacity.json").read_text())
    assert document["slo"] == {"ttft_ms": 300.0}
    assert "SLO ttft_ms 300 (3x serial: 3 x the baseline's serial median)" in " ".join(result.output.split())
    found = by_configuration(folder)
    assert found["baseline", "request_rate"]["bracket_low"] <= 1.3 < found["baseline", "request_rate"]["bracket_high"]
    assert (found["baseline", "concurrency"]["capacity"], found["ngram γ3", "concurrency"]["capacity"]) == (3, 5)
    points = pd.read_parquet(folder / "out" / "points.parquet").set_index("point_id")
    assert set(points["slo"]) == {"ttft_ms <= 300"}  # every point judged by the same limit, in milliseconds
    assert points["goodput"].notna().all()


def test_a_relative_slo_is_resolved_only_once_its_reference_is_measured():
    from types import SimpleNamespace

    import tomllib

    from specbench.profile import profile_from_dict
    from specbench.sweep.context import RunContext

    profile = profile_from_dict(tomllib.loads(PROFILE.replace("ttft_ms = 1000", 'ttft_ms = "2.5x serial"\ne2e_ms = 9000')))
    ctx = RunContext(profile, None, SimpleNamespace(), "run")
    serial = pd.DataFrame({"point_id": ["baseline-t0-p1"] * 3 + ["ngram-g3-t0-p1"], "ttft_ms": [90.0, 100.0, 400.0, 1.0],
                           "error": [None, None, None, None]})
    assert ctx.slo_limits(serial) == {"ttft_ms": 250.0, "e2e_ms": 9000.0}  # 2.5 x the median, the absolute as given
    assert ctx.slo_limits(serial[serial["point_id"] != "baseline-t0-p1"]) == {}  # not measured: nothing judged yet
    assert ctx.slo_limits(None) == {}


def test_a_probe_the_client_sent_late_is_void_and_no_higher_rate_is_measured(folder, monkeypatch):
    engine = StandIn({"baseline": 3.0, "ngram": 1.3}, {}, late_from=1.9)
    (folder / "standin.toml").write_text(PROFILE.replace("concurrency = true", "concurrency = false"))
    result = run(monkeypatch, engine)
    found = by_configuration(folder)
    baseline = found["baseline", "request_rate"]
    void = [p for p in baseline["probes"] if p["void"]]
    assert void and all(p["load"] >= 1.9 for p in void)
    assert void[0]["decision"] == "void: the client sent late (p99 500 ms > 0.25 x ttft_ms 1000)"
    assert baseline["status"].startswith("not bracketed: meets it at the highest rate probed")
    assert baseline["capacity"] < 1.9 and "the client could not send on time at" in baseline["note"]
    assert found["ngram γ3", "request_rate"]["status"] == "found"  # below the client's limit: as ever
    assert result.exit_code == 1 and "(void)" in result.output


def test_repeated_searches_take_turns_draw_afresh_and_pool_into_one_capacity(folder, monkeypatch):
    (folder / "standin.toml").write_text(PROFILE.replace("concurrency = true", "concurrency = false\nrepeats = 3"))
    engine = StandIn({"baseline": 1.3, "ngram": 1.7}, {})
    result = run(monkeypatch, engine)
    assert result.exit_code == 0, result.output
    # the launches take turns, each repeat in the order the last one ended (A B, B A, A B): a drift of the machine
    # weighs on both alike, and the launch the last repeat ended with is not started again
    turns = [(point.split("-t")[0], point.split("-rep")[1].split("-")[0] if "-rep" in point else "1")
             for point in engine.points]
    assert list(dict.fromkeys(turns)) == [("baseline", "1"), ("ngram-g3", "1"), ("ngram-g3", "2"), ("baseline", "2"),
                                          ("baseline", "3"), ("ngram-g3", "3")]
    found = by_configuration(folder)
    points = pd.read_parquet(folder / "out" / "points.parquet").set_index("point_id")
    for configuration, truth in (("baseline", 1.3), ("ngram γ3", 1.7)):
        entry = found[configuration, "request_rate"]
        assert [r["repeat"] for r in entry["repeats"]] == [0, 1, 2]
        for repeat in entry["repeats"]:  # each repeat's own estimate brackets the truth
            assert repeat["status"] == "found" and repeat["capacity_low"] <= truth < repeat["capacity_high"]
        by_repeat = [[p for p in entry["probes"] if p["repeat"] == k] for k in range(3)]
        assert all(by_repeat)
        # a later repeat starts where the repeats before it put the capacity, not at the serial rate again
        assert by_repeat[0][0]["load"] == 1.0
        assert by_repeat[1][0]["load"] == pytest.approx(entry["repeats"][0]["capacity"], rel=0.01)
        assert (entry["start_from"], entry["start"]) == ("repeats", pytest.approx(by_repeat[2][0]["load"], rel=0.01))
        for k, probes in enumerate(by_repeat):  # its own points, recorded with their repeat
            for probe in probes:
                assert ("-rep" in probe["point_id"]) == (k > 0)
                assert points.loc[probe["point_id"], "capacity_repeat"] == k
        # the capacity is fitted to every repeat's requests: each load's are those of its last probe per repeat
        last = {}
        for probe in entry["probes"]:
            last[probe["repeat"], probe["load"]] = probe["n_requests"]
        pooled = {}
        for (_, load), n in last.items():
            pooled[load] = pooled.get(load, 0) + n
        assert [tuple(point[:2]) for point in entry["curve"]] == sorted(pooled.items())
        assert entry["status"] == "found" and entry["capacity_low"] <= truth < entry["capacity_high"]
        assert entry["between_repeats"] < 0.05  # the repeats agree within a few per cent: little to add
    assert found["ngram γ3", "request_rate"]["verdict"] == "higher"
    text = " ".join(result.output.split())
    assert "baseline (repeat 2 of 3): this repeat " in text and "; every repeat so far pooled " in text

    engine.points.clear()  # resumed: every repeat's probes are in the files
    again = run(monkeypatch, engine)
    assert again.exit_code == 0, again.output
    assert engine.points == []


def test_each_repeat_draws_its_own_prompts_and_arrivals_the_same_for_every_configuration():
    from specbench.backends.server.measure import draw_seed

    baseline = PointSpec.baseline(0.0, 1.0, request_rate=1.5)
    ngram = PointSpec("ngram-g3-t0-p1-r1.5", "ngram", "ngram", 3, 0.0, 1.0, concurrency=None, request_rate=1.5)
    seeds = [draw_seed(0, baseline.in_repeat(k), 40) for k in range(3)]
    assert len(set(seeds)) == 3 and seeds[0] == draw_seed(0, baseline, 40)
    assert [draw_seed(0, ngram.in_repeat(k), 40) for k in range(3)] == seeds
    assert ngram.in_repeat(2).point_id == "ngram-g3-t0-p1-rep3-r1.5"
    assert ngram.in_repeat(2).baseline_id == baseline.in_repeat(2).point_id == "baseline-t0-p1-rep3-r1.5"
    assert ngram.in_repeat(2).in_repeat(0) == ngram and ngram.in_repeat(1).at_load(request_rate=2.0).point_id == \
        "ngram-g3-t0-p1-rep2-r2"
    assert "capacity_repeat" not in ngram.identity() and ngram.in_repeat(1).identity()["capacity_repeat"] == 1
    # a load drawn again within a repeat: its own seed (even with as many requests), id and baseline
    again = ngram.in_repeat(1).in_draw(1)
    assert again.point_id == "ngram-g3-t0-p1-rep2-r1.5-d2" and again.in_draw(0) == ngram.in_repeat(1)
    assert again.baseline_id == baseline.in_repeat(1).in_draw(1).point_id == "baseline-t0-p1-rep2-r1.5-d2"
    assert draw_seed(0, again, 40) not in seeds + [draw_seed(0, ngram.in_repeat(1), 40)]
    assert draw_seed(0, again, 40) == draw_seed(0, baseline.in_repeat(1).in_draw(1), 40)
    assert "capacity_draw" not in ngram.identity() and again.identity()["capacity_draw"] == 1
    assert PointSpec.from_row({**again.__dict__}) == again


def test_a_load_where_the_engines_queue_still_grew_fails_whatever_its_window_met(folder, monkeypatch):
    # the baseline meets the SLO up to 3 requests/s in each probe's window, but from 1.9 up its queue grows: requests
    # arrive faster than it serves them, and held longer they would wait ever longer
    engine = StandIn({"baseline": 3.0, "ngram": 1.3}, {}, growing_from=1.9)
    (folder / "standin.toml").write_text(PROFILE.replace("concurrency = true", "concurrency = false"))
    result = run(monkeypatch, engine)
    assert result.exit_code == 0, result.output
    baseline = by_configuration(folder)["baseline", "request_rate"]
    unsustained = [p for p in baseline["probes"] if "queue" in p["decision"]]
    assert unsustained and all(p["load"] >= 1.9 for p in unsustained)
    assert unsustained[0]["decision"] == ("fail: the engine's queue was still growing (requests waiting +5.0 over the "
                                          "probe): not sustainable")
    assert baseline["status"] == "found" and baseline["bracket_low"] < 1.9 <= baseline["bracket_high"]
    # the fit has only the loads the engine kept up with (all met): the capacity is the highest of them, and its
    # interval ends where the queue grew
    assert baseline["capacity"] == baseline["bracket_low"] and baseline["capacity_high"] == baseline["bracket_high"]
    assert [point[0] for point in baseline["curve"]] == sorted({p["load"] for p in baseline["probes"]
                                                                if "queue" not in p["decision"]})
    assert "where the engine's queue still grew" in baseline["note"]
    assert by_configuration(folder)["ngram γ3", "request_rate"]["status"] == "found"  # below 1.9: as ever
    points = pd.read_parquet(folder / "out" / "points.parquet").set_index("point_id")
    assert points.loc[unsustained[0]["point_id"], "requests_waiting_growth"] == 5.0


def test_a_queue_grows_when_its_last_quarter_waits_more_than_its_second():
    from specbench.backends.server.metrics import waiting_growth
    from specbench.capacity.search import growing_queue

    assert waiting_growth([0.0] * 7) is None  # too few samples to say
    # filling from idle (the first quarter) is not growth; a queue that levels off is steady
    assert waiting_growth([0, 4, 6, 6, 5, 6, 6, 6]) == 0.0
    assert waiting_growth([0, 1, 2, 3, 4, 5, 6, 7]) == pytest.approx(4.0)
    assert growing_queue(0.5, running_peak=8) is None and growing_queue(None, running_peak=8) is None
    assert growing_queue(2.5, running_peak=16) is None  # within a quarter of what it ran at once
    assert growing_queue(4.0, running_peak=8) == ("the engine's queue was still growing (requests waiting +4.0 over the "
                                                  "probe): not sustainable")


def test_a_search_on_the_concurrency_axis_alone_sends_no_rate(folder, monkeypatch):
    (folder / "standin.toml").write_text(PROFILE.replace("concurrency = true", "concurrency = true\nrate = false"))
    engine = StandIn({"baseline": 1.3, "ngram": 1.7}, {"baseline": 3, "ngram": 5})
    result = run(monkeypatch, engine)
    assert result.exit_code == 0, result.output
    assert set(by_configuration(folder)) == {("baseline", "concurrency"), ("ngram γ3", "concurrency")}
    assert not [point for point in engine.points if "-r" in point.split("-p1")[-1]]  # no rate point was sent
    assert by_configuration(folder)["ngram γ3", "concurrency"]["capacity"] == 5


def test_a_crossing_the_fit_puts_above_the_load_where_the_queue_grew_comes_down_to_it():
    # what CI met on vLLM: 9 met, 18 half met, 12.7 met in its window while the queue grew (out of the fit): the
    # fit alone crosses 0.75 halfway (in log load) from 9 to 18, at 12.73, above a load the engine could not keep up
    # with
    import numpy as np

    from specbench.capacity.estimate import ProbeRequests, estimate_capacity
    from specbench.capacity.outcome import search_outcome
    from specbench.capacity.search import Probe, SearchSettings

    settings = SearchSettings(target=0.75, confidence=0.8, requests=12, max_requests=12, max_probes=16,
                              max_time_s=None, growth=2.0, resolution=0.5, relative=True, start=9.0, lowest=2.0,
                              highest=None)
    history = [Probe(load=9.0, n_requests=12, met=12), Probe(load=18.0, n_requests=12, met=0),
               Probe(load=12.7, n_requests=12, met=12, unsustained="the engine's queue was still growing")]
    estimate = estimate_capacity([ProbeRequests(9.0, np.ones(12, bool)),
                                  ProbeRequests(18.0, np.array([True, False] * 6))], target=0.75, confidence=0.8)
    assert estimate.capacity == pytest.approx(12.73, abs=0.01)
    outcome = search_outcome(history, settings, [], "request_rate", estimate=estimate)
    assert outcome["status"] == "found" and (outcome["bracket_low"], outcome["bracket_high"]) == (9.0, 12.7)
    assert (outcome["capacity_low"], outcome["capacity"], outcome["capacity_high"]) == (9.0, 12.7, 12.7)


def test_a_window_shorter_than_two_request_lifetimes_is_said_before_the_search(folder, monkeypatch):
    # the stand-in's request takes 1 s one at a time: a 1.5 s window holds a response to a few arrivals
    (folder / "standin.toml").write_text(PROFILE.replace("requests = 16", "requests = 16\nwindow_s = 1.5"))
    result = run(monkeypatch, StandIn({"baseline": 1.3, "ngram": 1.7}, {}))
    assert result.exit_code == 0, result.output
    assert ("baseline: the 1.5 s window is shorter than two requests' lifetimes (1.0 s each one at a time): a window "
            "that short holds the engine's response to a few arrivals rather than a steady state; raise [capacity] "
            "window_s to several times 1.0 s") in " ".join(result.output.split())


def test_every_interval_allows_for_the_scatter_of_the_runs_probes_on_its_axis(folder, monkeypatch):
    (folder / "standin.toml").write_text(PROFILE.replace("concurrency = true", "concurrency = false"))

    def share(spec, meets):  # n-gram's draws near its capacity scatter (a burst's worth lost), the baseline's do not
        if not meets or spec.method == "baseline" or spec.request_rate < 1.0:
            return float(meets)
        return (0.5, 1.0, 0.8)[spec.capacity_draw % 3]

    result = run(monkeypatch, StandIn({"baseline": 1.3, "ngram": 1.7}, {}, share=share))
    assert result.exit_code == 0, result.output
    found = by_configuration(folder)
    requests = pd.read_parquet(folder / "out" / "requests.parquet")
    searches = {}
    for configuration in ("baseline", "ngram γ3"):
        entry = found[configuration, "request_rate"]
        probes = [p for p in entry["probes"] if not p["void"]]
        searches[configuration] = [ProbeRequests(p["load"], (requests[requests.point_id == p["point_id"]]
                                                             .sort_values("start_ms")["ttft_ms"] <= 1000).to_numpy())
                                   for p in probes]
    spread = run_dispersion(list(searches.values()))
    assert spread is not None and spread > 1
    widths = []
    for configuration, probes in searches.items():
        entry = found[configuration, "request_rate"]
        assert entry["run_dispersion"] == pytest.approx(spread)
        again = estimate_capacity(probes, target=0.8, integer=False, seed=0, run_dispersion=spread)
        assert (entry["capacity"], entry["capacity_low"], entry["capacity_high"]) == pytest.approx(
            (again.capacity, again.ci_low, again.ci_high))
        alone = estimate_capacity(probes, target=0.8, integer=False, seed=0)
        widths.append(tuple(math.inf if None in (e.ci_low, e.ci_high) else e.ci_high - e.ci_low for e in (alone, again)))
    # the baseline's probes alone cannot tell their scatter (each load met every request or none): n-gram's can
    assert found["baseline", "request_rate"]["dispersion"] is None
    assert widths[0][1] > widths[0][0] and widths[1][1] == pytest.approx(widths[1][0])
    text = " ".join(result.output.split())
    assert f"request rate: the probes of every configuration scatter about their fits {spread:.2g}x" in text


def test_repeats_that_disagree_beyond_their_intervals_widen_the_pooled_one(folder, monkeypatch):
    # the machine speeds up by 30 % between the two repeats: each repeat's interval is narrow and holds its own
    # capacity, not the other's; pooled, the interval takes the spread between them and holds both
    (folder / "standin.toml").write_text(PROFILE.replace("concurrency = true", "concurrency = false\nrepeats = 2"))
    result = run(monkeypatch, StandIn({"baseline": 1.3, "ngram": 1.7}, {}, drift=1.3))
    assert result.exit_code == 0, result.output
    for configuration, truth in (("baseline", 1.3), ("ngram γ3", 1.7)):
        entry = by_configuration(folder)[configuration, "request_rate"]
        first, second = entry["repeats"]
        assert first["capacity_low"] <= truth < first["capacity_high"] < truth * 1.3 <= second["capacity_high"]
        tau = between_repeats([(r["capacity"], r["capacity_low"], r["capacity_high"]) for r in entry["repeats"]],
                              confidence=0.95)
        assert entry["between_repeats"] == pytest.approx(tau) and tau > 0.1
        assert (entry["capacity_low"] or 0) <= first["capacity"] and entry["capacity_high"] >= second["capacity"]


def test_the_note_says_how_wide_the_repeats_spread_made_the_interval(folder, monkeypatch):
    # a machine 10 % faster in the second repeat: n-gram's repeats (1.7, then 1.87 requests/s) lie apart
    (folder / "standin.toml").write_text(PROFILE.replace("concurrency = true", "concurrency = false\nrepeats = 2"))
    assert run(monkeypatch, StandIn({"baseline": 1.3, "ngram": 1.7}, {}, drift=1.1)).exit_code == 0
    entry = by_configuration(folder)["ngram γ3", "request_rate"]
    low, high, tau = entry["capacity_low"], entry["capacity_high"], entry["between_repeats"]
    assert tau > 0.05 and low is not None and high is not None
    assert f"(τ {tau:.2g}): widened to ±{(high - low) / 2 / entry['capacity'] * 100:.0f} %" in entry["note"]

"""The capacity search's decisions (specbench.capacity.search) on stand-ins whose attainment curve is known, so the
right answer is known: Wilson intervals, pass / fail / undecided, more requests where an interval straddles the
target, bracketing up and down, bisection to the resolution, the knee, the limits, the cases that cannot bracket;
the SLO count from request rows; and the cost arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from specbench.capacity.search import (Done, Next, Probe, SearchSettings, completed_per_s, conclude, decide, fewest_to_confirm,
                                late_sends, met_slo, narrowing_probe, next_probe, wilson_interval)
from specbench.core.cost import change, replicas_for, usd_per_mtok


def settings(**overrides) -> SearchSettings:
    values = dict(target=0.8, requests=16, max_requests=64, start=0.5, lowest=0.125, resolution=0.1)
    return SearchSettings(**{**values, **overrides})


def step_curve(capacity: float):
    """Every request meets the SLO below `capacity`, none above: the answer is `capacity`."""
    return lambda load: 1.0 if load <= capacity else 0.0


def search(curve, how: SearchSettings, *, seed: int | None = None, knee: float | None = None,
           client_limit: float | None = None) -> list[Probe]:
    """Run the search against a stand-in: `met` is the curve's share of the requests (exactly, or binomial draws
    with `seed`); above `knee` the stand-in completes requests at the knee's rate; from `client_limit` up the
    client sends late (the probe is void)."""
    rng = np.random.default_rng(seed)
    history: list[Probe] = []
    while isinstance(step := next_probe(history, how), Next):
        p = curve(step.load)
        met = int(rng.binomial(step.n_requests, p)) if seed is not None else round(p * step.n_requests)
        completed = min(step.load, knee) if knee is not None else step.load
        void = "the client sent late" if client_limit is not None and step.load >= client_limit else None
        history.append(Probe(load=step.load, n_requests=step.n_requests, met=met, duration_s=step.n_requests / step.load,
                             completed_per_s=completed, void=void))
        assert len(history) < 40, "the search does not end"
    return history


def test_the_wilson_interval_matches_its_closed_form_and_known_values():
    assert wilson_interval(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)  # the textbook example
    low, high = wilson_interval(16, 16)
    assert low == pytest.approx(16 / (16 + 1.959964**2), abs=1e-6) and high == 1.0  # all met: n / (n + z²)
    assert wilson_interval(0, 12)[0] == 0.0 and wilson_interval(0, 12)[1] == pytest.approx(3.8415 / 15.8415, abs=1e-4)
    narrower = wilson_interval(80, 100, confidence=0.8)
    assert narrower[0] > wilson_interval(80, 100)[0] and narrower[1] < wilson_interval(80, 100)[1]


@pytest.mark.parametrize("target", [0.5, 0.75, 0.9, 0.95, 0.99])
def test_the_fewest_requests_that_can_confirm_a_target_are_the_first_whose_all_met_interval_clears_it(target):
    n = fewest_to_confirm(target)
    assert wilson_interval(n, n)[0] >= target > wilson_interval(n - 1, n - 1)[0]
    assert decide(Probe(load=1.0, n_requests=n, met=n), SearchSettings(target=target, start=1, lowest=1)).verdict \
        == "pass"


def test_no_number_of_requests_confirms_an_attainment_of_1():
    assert fewest_to_confirm(1.0) is None
    assert fewest_to_confirm(0.9) == 35  # the figure the search's warning gives for the default confidence


def test_a_probe_passes_or_fails_only_when_its_whole_interval_is_on_one_side_of_the_target():
    how = settings(target=0.8)
    assert decide(Probe(load=1, n_requests=16, met=16), how).verdict == "pass"  # [0.81, 1.00] >= 0.8
    assert decide(Probe(load=1, n_requests=16, met=7), how).verdict == "fail"  # [0.23, 0.67] < 0.8
    straddles = decide(Probe(load=1, n_requests=16, met=14), how)  # 0.875 [0.64, 0.97]
    assert straddles.verdict is None and straddles.label == "undecided (leans pass)" and straddles.leaning == "pass"
    assert decide(Probe(load=1, n_requests=16, met=12), how).label == "undecided (leans fail)"  # 0.75 [0.51, 0.90]
    at_most = decide(Probe(load=1, n_requests=64, met=56), how)  # 0.875 [0.77, 0.94]: still straddles at the most
    assert at_most.verdict == "pass" and at_most.label.startswith("pass (point estimate")
    assert decide(Probe(load=1, n_requests=64, met=50), how).label.startswith("fail (point estimate")


def test_requests_are_added_where_a_bracket_end_straddles_the_target_until_the_most_then_the_estimate_decides():
    how = settings(target=0.9, start=1.0, lowest=0.25)
    history = search(lambda load: 0.94 if load <= 1.0 else 0.0, how)  # 15/16, 30/32, 60/64: 0.94 straddles 0.9
    # the bracket moves on leanings (15 of 16 leans pass) and bisects first; then its passing end is confirmed
    assert [(p.load, p.n_requests) for p in history] == [(1.0, 16), (2.0, 16), (1.41, 16), (1.19, 16), (1.09, 16),
                                                          (1.0, 32), (1.0, 64)]
    assert [decide(p, how).verdict for p in history[-3:]] == ["fail", None, "pass"]  # the last by its estimate
    outcome = conclude(history, how)
    assert outcome.status == "found" and outcome.capacity == 1.0 and outcome.failing.load == 1.09
    assert outcome.note is None


def test_a_confirmation_that_flips_the_bracket_sends_the_search_on():
    how = settings(target=0.9, start=1.0, lowest=0.25, max_requests=64)
    draws = iter([16, 0, 0, 0, 0, 27])  # 1.0: 16/16 leans pass; fails above; then 1.0 again: 27/32 leans fail
    history: list[Probe] = []
    while isinstance(step := next_probe(history, how), Next) and len(history) < 9:
        met = next(draws, round(0.95 * step.n_requests) if step.load < 1.0 else 0)
        history.append(Probe(load=step.load, n_requests=step.n_requests, met=met))
    loads = [p.load for p in history]
    assert loads[:6] == [1.0, 2.0, 1.41, 1.19, 1.09, 1.0] and history[5].n_requests == 32
    assert loads[6] < 1.0  # 1.0 failed once confirmed: the bracket moved below it


def test_a_bracket_end_the_capacitys_interval_reaches_past_is_drawn_again_with_the_most_requests():
    how = settings(target=0.9, max_requests=64, max_probes=8)
    history = [Probe(load=1.0, n_requests=16, met=16), Probe(load=1.19, n_requests=16, met=12),
               Probe(load=1.09, n_requests=64, met=64)]
    assert isinstance(next_probe(history, how), Done)  # the bracket [1.09, 1.19] is resolved
    above = narrowing_probe(history, how, reaches_above=True, reaches_below=False)
    assert (above.load, above.n_requests) == (1.19, 64) and "reaches above 1.19" in above.reason
    below = narrowing_probe(history, how, reaches_above=False, reaches_below=True)
    assert (below.load, below.n_requests) == (1.09, 64) and "reaches below 1.09" in below.reason
    assert narrowing_probe(history, how, reaches_above=False, reaches_below=False) is None
    # at most three draws of one load, within the probe limit; a load whose queue grew is not drawn again
    drawn = history + [Probe(load=1.19, n_requests=64, met=40), Probe(load=1.19, n_requests=64, met=41)]
    assert narrowing_probe(drawn, how, reaches_above=True, reaches_below=False) is None
    assert narrowing_probe(history, settings(target=0.9, max_probes=3), reaches_above=True, reaches_below=False) is None
    grew = history[:1] + [Probe(load=1.19, n_requests=16, met=16, unsustained="the queue grew")] + history[2:]
    assert narrowing_probe(grew, how, reaches_above=True, reaches_below=False) is None


@pytest.mark.parametrize("capacity", [0.3, 1.3, 2.9, 7.0])
def test_a_step_curve_is_found_within_the_resolution(capacity):
    how = settings(start=1.0, lowest=0.25)
    history = search(step_curve(capacity), how)
    outcome = conclude(history, how)
    assert outcome.status == "found" and outcome.note is None
    assert outcome.passing.load <= capacity < outcome.failing.load
    assert outcome.failing.load <= outcome.passing.load * 1.1 * (1 + 1e-9)  # bracket within 10 %
    assert outcome.capacity == outcome.passing.load
    assert len(history) <= 8


def test_bracketing_grows_by_the_factor_then_bisects_by_the_geometric_mean():
    history = search(step_curve(1.3), settings(start=0.5, lowest=0.125))
    loads = [p.load for p in history]
    assert loads[:3] == [0.5, 1.0, 2.0]  # pass, pass, fail
    assert loads[3] == pytest.approx(math.sqrt(2.0), abs=0.005)  # 1.41: fail
    assert loads[4] == pytest.approx(math.sqrt(1.0 * 1.41), abs=0.005)  # 1.19: pass
    assert loads[-1] >= 1.19 and conclude(history, settings()).status == "found"


@pytest.mark.parametrize("capacity, loads", [
    (0.85, [1.0, 0.8]),  # near the start: one fine step brackets it
    (0.6, [1.0, 0.8, 0.512]),  # then 1.25², 1.25³, ...: far away in a few
    (0.2, [1.0, 0.8, 0.512, 0.262, 0.107]),
    (1.3, [1.0, 1.25, 1.95]),  # up alike
])
def test_an_accelerating_search_steps_finely_first_then_ever_further(capacity, loads):
    how = settings(start=1.0, lowest=0.05, growth=1.25, accelerating=True)
    history = search(step_curve(capacity), how)
    assert [p.load for p in history[:len(loads)]] == loads
    outcome = conclude(history, how)
    assert outcome.status == "found" and outcome.passing.load <= capacity < outcome.failing.load
    assert outcome.failing.load <= outcome.passing.load * 1.1 * (1 + 1e-9)
    # a fixed step of 1.25 takes more probes to reach 0.05 from 1.0
    assert len(search(step_curve(0.05), how)) < len(search(step_curve(0.05), settings(
        start=1.0, lowest=0.05, growth=1.25)))


def test_an_accelerating_search_whose_passing_end_flips_steps_finely_from_it_again():
    # seen on vLLM CPU: from 1.72, 1.38 passed twice and bisecting bracketed [1.38, 1.46]; a third draw at 1.38 then
    # failed (49 of 72), so nothing passes: the next step is one fine step below 1.38, not 1.25 to the 7th
    how = settings(start=1.72, lowest=0.3, growth=1.25, accelerating=True, target=0.9, requests=36, max_requests=72)
    history = [Probe(load=load, n_requests=n, met=met) for load, n, met in (
        (1.72, 69, 5), (1.38, 36, 35), (1.54, 44, 29), (1.46, 40, 36), (1.46, 72, 23), (1.38, 72, 71), (1.38, 72, 49))]
    step = next_probe(history, how)
    assert isinstance(step, Next) and step.load == pytest.approx(1.38 / 1.25, abs=0.005)


def test_an_absolute_resolution_bisects_arithmetically():
    how = settings(start=1.0, resolution=0.05, relative=False)
    history = search(step_curve(1.3), how)
    outcome = conclude(history, how)
    assert [p.load for p in history[:4]] == [1.0, 2.0, 1.5, 1.25]  # (1 + 2) / 2, then (1 + 1.5) / 2
    assert outcome.failing.load - outcome.passing.load <= 0.05 + 1e-9 and outcome.passing.load <= 1.3


def test_noisy_draws_around_a_known_knee_land_within_the_resolution_plus_10_percent():
    """Attainment 0.99 up to 1.3 requests/s, then falling linearly to 0 at 1.6: 0.8 is held up to 1.36."""
    def curve(load):
        return 0.99 if load <= 1.3 else max(0.0, 0.99 * (1.6 - load) / 0.3)

    truth = 1.3 + 0.3 * (1 - 0.8 / 0.99)
    how = settings(start=0.6, lowest=0.15)
    found = []
    for seed in range(30):
        outcome = conclude(search(curve, how, seed=seed), how)
        assert outcome.status == "found"
        found.append(outcome.capacity)
    within = [abs(c / truth - 1) <= 0.1 + 0.1 for c in found]
    assert sum(within) >= 28, sorted(found)  # the resolution plus 10 %, as the rerun criterion asks
    assert max(found) / min(found) <= 1.25


def test_a_start_that_fails_shrinks_until_a_probe_passes():
    how = settings(start=2.0, lowest=0.25)
    history = search(step_curve(0.7), how)
    assert [p.load for p in history[:3]] == [2.0, 1.0, 0.5]
    outcome = conclude(history, how)
    assert outcome.status == "found" and outcome.passing.load <= 0.7 < outcome.failing.load


def test_an_engine_that_misses_the_slo_even_at_its_lowest_rate_is_not_bracketed():
    how = settings(start=1.0, lowest=0.3)
    history = search(lambda load: 0.0, how)
    assert [p.load for p in history] == [1.0, 0.5, 0.3]  # down to the lowest allowed, no further
    assert next_probe(history, how) == Done("lowest")
    outcome = conclude(history, how)
    assert outcome.status == "not bracketed: misses the SLO at its lowest rate 0.3"
    assert outcome.capacity is None and outcome.passing is None and outcome.failing.load == 0.3


def test_an_engine_that_meets_it_at_the_highest_rate_allowed_is_not_bracketed_and_capacity_is_a_lower_bound():
    how = settings(start=1.0, highest=3.0)
    history = search(lambda load: 1.0, how)
    assert [p.load for p in history] == [1.0, 2.0, 3.0]
    outcome = conclude(history, how)
    assert outcome.status == "not bracketed: meets it at the highest rate probed 3"
    assert outcome.capacity == 3.0 and outcome.failing is None


def test_the_probe_and_time_limits_stop_the_search_and_say_so():
    how = settings(start=1.0, max_probes=4)
    history = search(step_curve(1.3), how)
    assert len(history) == 4 and next_probe(history, how) == Done("probe limit")
    outcome = conclude(history, how)
    assert outcome.status == "found" and outcome.note == "stopped at the probe limit; the bracket is wider than the resolution"
    timed = settings(start=1.0, max_time_s=40.0)  # each probe takes 16 / load seconds
    history = search(step_curve(1.3), timed)
    assert sum(p.duration_s for p in history[:-1]) < 40.0 <= sum(p.duration_s for p in history)


def test_a_failing_probe_that_saturated_the_engine_sends_the_next_probe_to_the_knee():
    how = settings(start=0.5, lowest=0.125)
    history = search(step_curve(1.1), how, knee=1.2)  # from 2 requests/s the engine completes only 1.2/s
    loads = [p.load for p in history]
    assert loads[:4] == [0.5, 1.0, 2.0, 1.2]  # the knee, instead of the bisection's 1.41
    outcome = conclude(history, how)
    assert outcome.passing.load <= 1.1 < outcome.failing.load <= 1.2


def test_concurrency_is_searched_in_whole_numbers():
    how = settings(start=1, lowest=1, integer=True)
    history = search(step_curve(5), how)
    assert [p.load for p in history] == [1, 2, 4, 8, 6, 5]
    outcome = conclude(history, how, unit="concurrency")
    assert (outcome.capacity, outcome.failing.load) == (5, 6)
    assert conclude(search(lambda c: 0.0, settings(start=1, lowest=1, integer=True)), settings(integer=True),
                    unit="concurrency").status == "not bracketed: misses the SLO at its lowest concurrency 1"


def test_a_request_meets_the_slo_when_every_limit_holds_and_a_failed_request_never_does():
    rows = pd.DataFrame({"ttft_ms": [100.0, 900.0, 100.0, 100.0, 100.0], "tpot_ms": [10.0, 10.0, 60.0, None, 10.0],
                         "error": [None, None, None, None, "HTTP 503"]})
    assert met_slo(rows, {"ttft_ms": 500, "tpot_ms": 50}).tolist() == [True, False, False, True, False]
    assert met_slo(rows.drop(columns="error"), {"ttft_ms": 500}).tolist() == [True, False, True, True, True]
    assert met_slo(rows.assign(error=""), {"ttft_ms": 500}).tolist() == [True, False, True, True, True]


def test_a_request_sent_late_counts_its_ttft_and_end_to_end_from_its_scheduled_arrival():
    # the client sent the second request 450 ms after its arrival: the user waited 100 + 450 ms for the first token
    rows = pd.DataFrame({"ttft_ms": [100.0, 100.0, 100.0], "e2e_ms": [900.0, 900.0, 900.0],
                         "tpot_ms": [10.0, 10.0, 10.0], "send_lateness_ms": [0.0, 450.0, -3.0]})
    assert met_slo(rows, {"ttft_ms": 500}).tolist() == [True, False, True]  # sent early: no credit
    assert met_slo(rows, {"e2e_ms": 1000}).tolist() == [True, False, True]
    assert met_slo(rows, {"tpot_ms": 20}).tolist() == [True, True, True]  # between tokens: lateness does not count
    assert met_slo(rows.assign(send_lateness_ms=None), {"ttft_ms": 500}).tolist() == [True, True, True]  # closed loop


def test_requests_completed_per_second_leave_the_drain_out():
    rows = pd.DataFrame({"start_ms": [0.0, 1000.0, 2000.0, 3000.0], "e2e_ms": [5000.0, 5000.0, 5000.0, 5000.0]})
    assert completed_per_s(rows) == pytest.approx(1.0)  # finishes 1 s apart: what arrived, not 4 / 8 s
    assert completed_per_s(rows.iloc[:1]) is None


def test_cost_per_million_output_tokens_replicas_and_changes():
    assert usd_per_mtok(3.6, 100.0) == pytest.approx(10.0)  # 3.6 $/h / (3600 s x 100 tok/s) x 1e6
    assert usd_per_mtok(2.0, 50.0) == pytest.approx(2.0 / (3600 * 50) * 1e6)
    assert usd_per_mtok(None, 100.0) is None and usd_per_mtok(1.0, 0.0) is None and usd_per_mtok(1.0, None) is None
    assert replicas_for(10.0, 3.0) == 4 and replicas_for(9.0, 3.0) == 3 and replicas_for(0.5, 3.0) == 1
    assert replicas_for(None, 3.0) is None and replicas_for(1.0, None) is None
    assert change(1.3, 1.0) == pytest.approx(0.3) and change(8.0, 10.0) == pytest.approx(-0.2)
    assert change(None, 1.0) is None and change(1.0, None) is None


def test_a_void_probe_is_neither_pass_nor_fail_and_caps_the_loads_searched():
    how = settings(target=0.8, start=1.0, lowest=0.25)
    # the engine holds the SLO up to 3 requests/s, the client sends on time only below 2.5: the search can say only
    # that it holds at the highest rate below the client's limit
    history = search(step_curve(3.0), how, client_limit=2.5)
    # growing 1 -> 2 -> 4 (void), then between the highest pass and the lowest void load: 2.83 (void), 2.38 (pass),
    # 2.6 (void), until they are within the resolution
    assert [(p.load, p.void is not None) for p in history] == [
        (1.0, False), (2.0, False), (4.0, True), (2.83, True), (2.38, False), (2.6, True)]
    outcome = conclude(history, how)
    assert outcome.status == "not bracketed: meets it at the highest rate probed 2.38" and outcome.capacity == 2.38
    assert outcome.note == "the client could not send on time at 2.6: no rate from there up was measured"
    # a capacity below the client's limit is found as if the client were never late
    assert conclude(search(step_curve(1.3), how, client_limit=2.5), how).capacity == \
        conclude(search(step_curve(1.3), how), how).capacity
    # void from the start: the search goes down below it, and says so when nothing could be measured
    everything = search(step_curve(3.0), how, client_limit=0.0)
    assert [p.load for p in everything] == [1.0, 0.5, 0.25] and all(p.void for p in everything)
    assert conclude(everything, how).status == "not bracketed: the client could not send on time even at 0.25"


def test_a_probe_sent_late_against_its_slo_is_void():
    rows = pd.DataFrame({"send_lateness_ms": [0.0] * 98 + [300.0, 400.0]})
    assert late_sends(rows, {"ttft_ms": 1000.0}, share=0.25) == (
        "the client sent late (p99 301 ms > 0.25 x ttft_ms 1000)")  # numpy's linear quantile
    assert late_sends(rows, {"ttft_ms": 2000.0}, share=0.25) is None
    assert late_sends(rows, {"tpot_ms": 50.0, "e2e_ms": 1000.0}, share=0.25).endswith("0.25 x e2e_ms 1000)")
    assert late_sends(rows, {"tpot_ms": 50.0}, share=0.25, request_ms=800.0).endswith("0.25 x one request's time 800)")
    assert late_sends(rows, {"tpot_ms": 50.0}, share=0.25) is None  # nothing to judge lateness against
    assert late_sends(pd.DataFrame({"send_lateness_ms": [None, None]}), {"ttft_ms": 10.0}, share=0.25) is None

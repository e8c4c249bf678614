"""The analytic model where it is used: a point's predicted_speedup (results), the tune's warm start, and a
recorded n-gram point the old gamma-always formula got wrong. No timing: every time here is given."""

from __future__ import annotations

import pandas as pd
import pytest

from specbench.core import results, stats, summary
from specbench.core.trace import StepRecord, Trace
from specbench.core.results import PointSpec
from specbench.tune.warmstart import Calibration, calibrate, predicted_speedup
from specbench.workloads.prompts import Prompt

BASELINE = PointSpec.baseline(0.0, 1.0)
NGRAM = PointSpec("ngram-g4-t0-p1", "ngram", "ngram", 4, 0.0, 1.0, ngram_min=1, ngram_max=3)


def trace(steps: list[tuple[int, int]], *, draft_ms: float, verify_ms: float, ttft_ms: float, gamma: int = 4) -> Trace:
    """A greedy request whose steps drafted and accepted (drafted, accepted) tokens, each step taking
    draft_ms per drafted token plus verify_ms."""
    records = [StepRecord(drafted=d, accepted=a, emitted=a + 1, draft_s=d * draft_ms / 1e3, verify_s=verify_ms / 1e3)
               for d, a in steps]
    times, now = [ttft_ms / 1e3], ttft_ms / 1e3
    for record in records:
        now += record.draft_s + record.verify_s
        times += [now] * record.emitted
    return Trace(prompt_tokens=20, output_ids=tuple(range(len(times))), ttft_s=ttft_ms / 1e3,
                 token_times_s=tuple(times), steps=tuple(records), gamma=gamma)


def rows(spec: PointSpec, traces: list[Trace]) -> pd.DataFrame:
    return pd.DataFrame([results.request_row(spec, point_key="k", prompt=Prompt(f"p{i}", "c", ()), repeat=0, seed=0,
                                             trace=t) for i, t in enumerate(traces)])


def test_a_points_prediction_uses_what_its_steps_drafted_and_accepted():
    # two prompts; n-gram steps that draft nothing half the time
    point = rows(NGRAM, [trace([(0, 0), (4, 2), (0, 0), (4, 4)] * 5, draft_ms=1.0, verify_ms=12.0, ttft_ms=50.0)] * 2)
    baseline = rows(BASELINE, [trace([(0, 0)] * 49, draft_ms=0.0, verify_ms=10.0, ttft_ms=40.0, gamma=1)] * 2)
    prediction = summary.predict(point, baseline)
    assert prediction.model == stats.StepModel((0.5,) * 4, (0.5, 0.5, 0.25, 0.25))
    assert (prediction.draft_ms_per_token, prediction.verify_ms_per_step, prediction.target_ms_per_token) == \
        pytest.approx((1.0, 12.0, 10.0))
    assert (prediction.decode_tokens, prediction.ttft_ms, prediction.baseline_ttft_ms) == \
        pytest.approx((50, 50.0, 40.0))
    # the model explains this point exactly: 20 steps of 14 ms on average after a 50 ms prefill, against
    # 49 steps of 10 ms after 40 ms, for 50 + 1 and 49 + 1 tokens
    points = summary.summarize([BASELINE, NGRAM], pd.concat([baseline, point]), failures={}, context={})
    ngram = points.set_index("point_id").loc[NGRAM.point_id]
    assert ngram["predicted_speedup"] == pytest.approx(prediction.speedup)
    assert prediction.speedup == pytest.approx((40.0 + 50 * 10.0) / (50.0 + 20 * 14.0))
    assert ngram["speedup"] == pytest.approx((51 / (50.0 + 20 * 14.0)) / (50 / (40.0 + 49 * 10.0)))


def test_no_prediction_without_per_step_drafts():
    hf = rows(NGRAM, [trace([(0, 0)] * 3, draft_ms=0.0, verify_ms=10.0, ttft_ms=5.0)])
    hf["drafted_tokens"], hf["drafted_per_position"] = None, None  # HF generate does not say what it drafted
    assert summary.predict(hf, rows(BASELINE, [trace([(0, 0)] * 3, draft_ms=0, verify_ms=10, ttft_ms=5)])) is None


def test_the_warm_start_predicts_a_smaller_gamma_from_the_calibration_counts():
    point = rows(NGRAM, [trace([(0, 0), (4, 2), (0, 0), (4, 4)] * 5, draft_ms=1.0, verify_ms=12.0, ttft_ms=50.0)])
    baseline = rows(BASELINE, [trace([(0, 0)] * 49, draft_ms=0.0, verify_ms=10.0, ttft_ms=40.0, gamma=1)])
    calibration = calibrate(point, baseline, gamma=4, verify_ms_by_tokens=(10.0, 11.0, 11.5, 11.8, 12.0))
    assert calibration.step_model() == summary.predict(point, baseline).model
    # gamma 2: half the steps draft 0 tokens (verify 1), half draft 2 (verify 3); 1 + 0.5 + 0.5 tokens per step;
    # the verify cost is the point's measured 12 ms scaled by the curve from gamma 4's steps (1 or 5 tokens) to these
    at_gamma_4 = 0.5 * 10.0 + 0.5 * 12.0
    step_ms = 1.0 * 1.0 + 12.0 * (0.5 * 10.0 + 0.5 * 11.5) / at_gamma_4
    assert predicted_speedup(calibration, 2) == pytest.approx((40.0 + 50 * 10.0) / (50.0 + 50 * step_ms / 2.0))
    assert Calibration.from_dict(calibration.as_dict()) == calibration
    # greedy (temperature 0): the measured spans re-cut at gamma 2 (stats.StepModel.at_gamma), the same costs
    greedy = calibrate(point, baseline, gamma=4, verify_ms_by_tokens=(10.0, 11.0, 11.5, 11.8, 12.0), greedy=True)
    recut = calibration.step_model().at_gamma(2, greedy=True)
    assert greedy.step_model(2) == recut and recut.tokens_per_step() > calibration.step_model(2).tokens_per_step()
    step_ms = 1.0 * recut.drafted_per_step() + 12.0 * recut.verify_ms((10.0, 11.0, 11.5)) / at_gamma_4
    assert predicted_speedup(greedy, 2) == pytest.approx(
        (40.0 + 50 * 10.0) / (50.0 + 50 * step_ms / recut.tokens_per_step()))
    assert Calibration.from_dict(greedy.as_dict()) == greedy


def test_a_calibration_stored_before_the_prefill_was_recorded_still_loads():
    old = {"gamma": 2, "accepted_per_step": [0.5, 0.25], "drafted_per_step": [1.0, 1.0], "draft_ms_per_token": 1.0,
           "verify_ms_per_step": 12.0, "target_ms_per_token": 10.0, "verify_ms_by_tokens": []}
    calibration = Calibration.from_dict(old)
    assert calibration.ttft_ms == calibration.baseline_ttft_ms == calibration.decode_tokens == 0.0
    assert predicted_speedup(calibration, 2) == pytest.approx(1.75 / ((2 * 1.0 + 12.0) / 10.0))  # decode steps only


# A recorded n-gram point: `python -m benches` (SmolLM2-135M-Instruct, float32, 2 CPU threads on a
# shared machine, greedy, gamma 4, ngram_max 3, 64 new tokens), each prompt's fastest of 2 repeats, native
# backend. Many steps drafted nothing (no n-gram matched): 25 % of multi_turn-01's, 76 % of translation-01's.
RECORDED_COLUMNS = ("prompt_id", "output_tokens", "e2e_ms", "ttft_ms", "target_steps", "decode_tokens", "drafted_tokens",
                    "accepted_tokens", "rejected_steps", "draft_ms", "verify_ms", "drafted_per_position",
                    "accepted_per_position")
RECORDED_BASELINE = [
    ("multi_turn-01", 64, 11675.9, 1029.9, 63, 63, 0, 0, 0, 0.4, 10644.3, [0], [0]),
    ("code-01", 64, 10807.1, 580.0, 63, 63, 0, 0, 0, 0.5, 10225.4, [0], [0]),
    ("summarization-01", 64, 11668.3, 1355.1, 63, 63, 0, 0, 0, 0.4, 10311.8, [0], [0]),
    ("translation-01", 64, 10921.0, 499.2, 63, 63, 0, 0, 0, 0.4, 10420.3, [0], [0]),
    ("qa-01", 64, 11083.3, 438.6, 63, 63, 0, 0, 0, 0.4, 10643.3, [0], [0]),
    ("math-01", 64, 10763.1, 533.8, 63, 63, 0, 0, 0, 0.4, 10227.8, [0], [0]),
]
RECORDED_NGRAM = [
    ("multi_turn-01", 64, 8540.7, 871.4, 32, 63, 93, 31, 19, 6.2, 7662.4, [24, 24, 23, 22], [15, 7, 5, 4]),
    ("code-01", 64, 8743.6, 747.3, 37, 63, 65, 26, 14, 10.8, 7984.7, [17, 17, 16, 15], [10, 7, 6, 3]),
    ("summarization-01", 64, 9523.0, 1427.0, 32, 63, 99, 31, 21, 22.9, 8072.4, [26, 25, 24, 24], [11, 9, 7, 4]),
    ("translation-01", 64, 10029.8, 381.0, 51, 63, 48, 12, 10, 21.1, 9626.8, [12, 12, 12, 12], [4, 3, 3, 2]),
    ("qa-01", 64, 11837.0, 545.8, 55, 63, 93, 8, 23, 25.9, 11264.2, [24, 23, 23, 23], [4, 2, 1, 1]),
    ("math-01", 64, 10215.4, 579.7, 46, 63, 87, 17, 19, 20.5, 9614.3, [23, 22, 21, 21], [7, 4, 3, 3]),
]


def test_a_recorded_ngram_point_is_predicted_within_5_percent_where_the_gamma_always_formula_is_40_percent_high():
    point = pd.DataFrame(RECORDED_NGRAM, columns=RECORDED_COLUMNS)
    baseline = pd.DataFrame(RECORDED_BASELINE, columns=RECORDED_COLUMNS)
    measured = stats.paired_bootstrap_speedup(point["output_tokens"].to_numpy(float), point["e2e_ms"].to_numpy(float),
                                              baseline["output_tokens"].to_numpy(float),
                                              baseline["e2e_ms"].to_numpy(float))[0]
    assert measured == pytest.approx(1.136, abs=1e-3)
    prediction = summary.predict(point, baseline)
    assert prediction.model.drafted_share()[0] == pytest.approx(1 - 126 / 253)  # steps that drafted nothing
    assert prediction.speedup == pytest.approx(measured, rel=0.05)
    assert prediction.decode_speedup == pytest.approx(measured, rel=0.05)
    accepted = point["accepted_tokens"].sum()
    alpha = accepted / (accepted + point["rejected_steps"].sum())  # 125 / (125 + 106)
    gamma_always = stats.predicted_speedup(alpha=alpha, gamma=4, draft_s_per_token=prediction.draft_ms_per_token,
                                           verify_s=prediction.verify_ms_per_step,
                                           target_s_per_token=prediction.target_ms_per_token)
    assert gamma_always > 1.35 * measured


NGRAM_G2 = PointSpec("ngram-g2-t0-p1", "ngram", "ngram", 2, 0.0, 1.0, ngram_min=1, ngram_max=3)
OTHER_G2 = PointSpec("other-g2-t0-p1", "ngram", "other", 2, 0.0, 1.0, ngram_min=1, ngram_max=3)


def test_each_point_gets_the_speedup_its_drafts_largest_gamma_predicts_for_it():
    largest = rows(NGRAM, [trace([(0, 0), (4, 2), (0, 0), (4, 4)] * 5, draft_ms=1.0, verify_ms=12.0, ttft_ms=50.0)])
    small = rows(NGRAM_G2, [trace([(0, 0), (2, 2)] * 10, draft_ms=1.0, verify_ms=11.5, ttft_ms=50.0, gamma=2)])
    other = rows(OTHER_G2, [trace([(2, 1)] * 10, draft_ms=1.0, verify_ms=11.5, ttft_ms=50.0, gamma=2)])
    baseline = rows(BASELINE, [trace([(0, 0)] * 49, draft_ms=0.0, verify_ms=10.0, ttft_ms=40.0, gamma=1)])
    curve = (10.0, 11.0, 11.5, 11.8, 12.0)
    specs = [BASELINE, NGRAM, NGRAM_G2, OTHER_G2]
    points = summary.summarize(specs, pd.concat([baseline, largest, small, other]), failures={}, context={},
                               verify_ms_by_tokens=curve).set_index("point_id")
    calibration = calibrate(largest, baseline, gamma=4, verify_ms_by_tokens=curve, greedy=True)  # temperature 0
    # gamma 2 from gamma 4's counts and the timed verify curve, not from gamma 2's own steps
    assert points.loc[NGRAM_G2.point_id, "max_gamma_predicted_speedup"] == pytest.approx(predicted_speedup(calibration, 2))
    assert points.loc[NGRAM_G2.point_id, "max_gamma_predicted_speedup"] != pytest.approx(
        points.loc[NGRAM_G2.point_id, "predicted_speedup"])
    # the largest restates itself; another draft's only gamma is its own largest; the baseline has none
    assert points.loc[NGRAM.point_id, "max_gamma_predicted_speedup"] == pytest.approx(predicted_speedup(calibration, 4))
    assert points.loc[OTHER_G2.point_id, "max_gamma_predicted_speedup"] == pytest.approx(
        points.loc[OTHER_G2.point_id, "predicted_speedup"], rel=0.05)
    assert pd.isna(points.loc[BASELINE.point_id, "max_gamma_predicted_speedup"])
    # without the timing (hf, a replay): the verify cost is interpolated between one token and the largest step
    untimed = summary.summarize(specs, pd.concat([baseline, largest, small, other]), failures={}, context={})
    assert untimed.set_index("point_id").loc[NGRAM_G2.point_id, "max_gamma_predicted_speedup"] == pytest.approx(
        predicted_speedup(calibrate(largest, baseline, gamma=4, greedy=True), 2))


def test_no_prediction_across_gamma_from_a_point_that_records_no_steps():
    server = rows(NGRAM, [trace([(4, 2)] * 5, draft_ms=1.0, verify_ms=12.0, ttft_ms=50.0)])
    server["target_steps"], server["drafted_tokens"] = None, None
    baseline = rows(BASELINE, [trace([(0, 0)] * 9, draft_ms=0.0, verify_ms=10.0, ttft_ms=40.0, gamma=1)])
    points = summary.summarize([BASELINE, NGRAM], pd.concat([baseline, server]), failures={}, context={})
    assert points["max_gamma_predicted_speedup"].isna().all()

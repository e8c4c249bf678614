"""specbench.core.stats: the analytic step model on hand-built counts, the paired bootstraps, the Pareto mask."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specbench.core import stats
from specbench.report import tables
from specbench.core.stats import Prediction, StepModel
from specbench.tune.recommend import pareto_front

# Four n-gram steps at gamma 4: two found no match (drafted 0), one drafted 4 and kept 2, one kept all 4.
NGRAM = StepModel.from_counts(steps=4, drafted_per_position=[2, 2, 2, 2], accepted_per_position=[2, 2, 1, 1])


def test_the_counts_give_the_distribution_of_drafted_tokens_and_the_prefix_acceptance():
    assert NGRAM.gamma == 4
    assert NGRAM.drafted_at_least == (0.5, 0.5, 0.5, 0.5)
    assert NGRAM.accepted_through == (0.5, 0.5, 0.25, 0.25)
    assert NGRAM.drafted_share() == (0.5, 0.0, 0.0, 0.0, 0.5)  # P(exactly k drafted), k = 0..4
    assert NGRAM.acceptance_given_drafted() == (1.0, 1.0, 0.5, 0.5)
    assert NGRAM.tokens_per_step() == 2.5  # the steps emitted 1, 1, 3 and 5 tokens
    assert NGRAM.drafted_per_step() == 2.0
    assert NGRAM.verify_ms((10.0, 20.0, 15.0, 12.0, 11.0)) == 0.5 * 10.0 + 0.5 * 11.0  # 1 or 5 tokens verified


def test_a_smaller_gamma_sampled_drafts_at_most_gamma_and_keeps_the_accepted_prefix():
    two = NGRAM.at_gamma(2)
    assert two.drafted_share() == (0.5, 0.0, 0.5)
    assert two.tokens_per_step() == 2.0  # the steps would emit 1, 1, 3 and 3 tokens
    assert two.drafted_per_step() == 1.0
    assert NGRAM.at_gamma(4) is NGRAM is NGRAM.at_gamma(4, greedy=True)
    with pytest.raises(ValueError, match="gamma 5 is outside the measured 1..4"):
        NGRAM.at_gamma(5, greedy=True)


def _greedy_run(runs: list[int], gamma: int) -> tuple[int, list[int]]:
    """Decode an output whose positions a deterministic draft gets right in runs (the draft is right for `run`
    tokens, then wrong once) at gamma: (steps, accepted per step)."""
    right = [True if i < run else False for run in runs for i in range(run + 1)]  # per output position
    steps, accepted, position = 0, [], 0
    while position < len(right):
        kept = 0
        while kept < gamma and position + kept < len(right) and right[position + kept]:
            kept += 1
        steps, position = steps + 1, position + kept + 1
        accepted.append(kept)
    return steps, accepted


def _measured(runs: list[int], top: int) -> StepModel:
    steps, accepted = _greedy_run(runs, top)
    return StepModel.from_counts(steps=steps, drafted_per_position=[steps] * top,
                                 accepted_per_position=[sum(a > k for a in accepted) for k in range(top)])


def test_greedy_recuts_each_measured_span_exactly_when_no_step_accepted_everything():
    rng = np.random.default_rng(0)  # bursty, as n-gram lookup is: mostly nothing, sometimes a long copied run
    runs = [int(rng.integers(3, 12)) if rng.random() < 0.3 else 0 for _ in range(400)]
    top = max(runs) + 1  # measured at a gamma no run fills: every span ends at a rejection
    measured = _measured(runs, top)
    for gamma in range(1, top):
        steps, per_step = _greedy_run(runs, gamma)
        recut = measured.at_gamma(gamma, greedy=True)
        assert recut.tokens_per_step() == pytest.approx((steps + sum(per_step)) / steps)
        assert recut.drafted_share()[gamma] == pytest.approx(1.0)  # a draft model drafts gamma every step
        if gamma < 4:  # cutting every measured step at gamma (the sampled rule) would lose the rest of its span
            assert measured.at_gamma(gamma).tokens_per_step() < 0.9 * recut.tokens_per_step()


def test_a_greedy_draft_that_accepted_everything_accepts_gamma_at_every_smaller_gamma():
    perfect = StepModel.from_counts(steps=10, drafted_per_position=[10] * 4, accepted_per_position=[10] * 4)
    for gamma in (1, 2, 3):
        assert perfect.at_gamma(gamma, greedy=True).tokens_per_step() == gamma + 1


def test_greedy_runs_that_fill_the_measured_gamma_continue_at_the_pooled_acceptance():
    # memoryless runs: after a right guess the next is right with probability 0.65 wherever it stands
    runs = list(np.random.default_rng(1).geometric(0.35, size=20000) - 1)
    measured = _measured(runs, 3)  # a quarter of the steps accept all 3
    for gamma in (1, 2):
        steps, per_step = _greedy_run(runs, gamma)
        assert measured.at_gamma(gamma, greedy=True).tokens_per_step() == pytest.approx(
            (steps + sum(per_step)) / steps, rel=0.01)


def test_ngram_steps_that_draft_nothing_half_the_time_predict_less_than_the_gamma_always_formula():
    costs = dict(draft_ms_per_token=1.0, verify_ms_per_step=12.0, target_ms_per_token=10.0)
    assert Prediction(NGRAM, **costs).speedup == pytest.approx(2.5 / ((2 * 1.0 + 12.0) / 10.0))
    alpha = 6 / 7  # accepted / (accepted + rejections): 6 accepted, 1 step with a rejection
    old = stats.predicted_speedup(alpha=alpha, gamma=4, draft_s_per_token=1.0, verify_s=12.0, target_s_per_token=10.0)
    assert old == pytest.approx((1 - alpha**5) / (1 - alpha) / ((4 * 1.0 + 12.0) / 10.0))
    assert Prediction(NGRAM, **costs).speedup < 0.8 * old


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.7, 1.0])
def test_a_draft_that_always_drafts_gamma_with_geometric_acceptance_is_leviathans_formula(alpha):
    for gamma in range(1, 7):
        geometric = StepModel.geometric(alpha=alpha, gamma=gamma)
        assert geometric.tokens_per_step() == pytest.approx(stats.expected_tokens_per_step(alpha, gamma))
        if alpha < 1:
            assert geometric.tokens_per_step() == pytest.approx((1 - alpha ** (gamma + 1)) / (1 - alpha))
        assert geometric.drafted_share() == (0.0,) * gamma + (1.0,)
        assert StepModel.geometric(alpha=alpha, gamma=6).at_gamma(gamma) == geometric  # sampled: each step cut
    counts = StepModel.from_counts(steps=1000, drafted_per_position=[1000] * 3, accepted_per_position=[500, 250, 125])
    assert counts.tokens_per_step() == (1 - 0.5**4) / (1 - 0.5)


def test_the_prediction_adds_each_sides_prefill_per_request():
    prediction = Prediction(NGRAM, draft_ms_per_token=1.0, verify_ms_per_step=12.0, target_ms_per_token=10.0,
                            decode_tokens=47, ttft_ms=100.0, baseline_ttft_ms=80.0)
    assert prediction.step_ms == 14.0
    assert prediction.decode_speedup == pytest.approx(2.5 * 10.0 / 14.0)
    assert prediction.speedup == pytest.approx((80.0 + 47 * 10.0) / (100.0 + 47 * 14.0 / 2.5))


def test_counts_that_cannot_be_raise():
    with pytest.raises(ValueError, match="at least one step"):
        StepModel.from_counts(steps=0, drafted_per_position=[], accepted_per_position=[])
    with pytest.raises(ValueError, match="0 <= accepted <= drafted <= 1"):
        StepModel.from_counts(steps=2, drafted_per_position=[1], accepted_per_position=[2])


def test_the_ratio_of_two_speedups_is_bootstrapped_over_prompts_together():
    rng = np.random.default_rng(3)
    tokens = np.full(5, 64.0)
    first = (tokens, rng.uniform(1, 2, 5), tokens, rng.uniform(2, 3, 5))
    second = (tokens, rng.uniform(1, 2, 5), tokens, rng.uniform(2, 3, 5))
    value, low, high = stats.paired_bootstrap_speedup_ratio(first, second)
    assert value == pytest.approx((first[3].sum() / first[1].sum()) / (second[3].sum() / second[1].sum()))
    assert low <= value <= high
    # against a speedup of exactly 1 on every resample, the ratio is the first speedup with its own CI
    unity = (tokens, np.ones(5), tokens, np.ones(5))
    assert stats.paired_bootstrap_speedup_ratio(first, unity) == pytest.approx(stats.paired_bootstrap_speedup(*first))
    with pytest.raises(ValueError, match="same non-empty set of prompts"):
        stats.paired_bootstrap_speedup_ratio(first, (tokens[:4], np.ones(4), tokens[:4], np.ones(4)))


def test_the_pareto_mask_keeps_points_nobody_beats_on_both_and_identical_points_together():
    tokens_per_s = [10.0, 10.0, 8.0, 12.0, 9.0, np.nan]
    peak_memory_mb = [5.0, 5.0, 4.0, 9.0, 6.0, 1.0]
    assert stats.pareto_mask(tokens_per_s, peak_memory_mb).tolist() == [True, True, True, True, False, False]
    assert stats.pareto_mask([], []).tolist() == []


def test_the_tune_and_the_report_draw_the_same_front():
    tokens_per_s = [10.0, 7.0, 8.0, 12.0, 9.0]
    peak_memory_mb = [5.0, 5.0, 4.0, 9.0, 6.0]
    rows = [{"number": i, "values": [t, m]} for i, (t, m) in enumerate(zip(tokens_per_s, peak_memory_mb))]
    assert [r["number"] for r in pareto_front(rows)] == [3, 0, 2]  # fastest first
    points = pd.DataFrame({"point_id": [f"p{i}" for i in range(5)], "status": "ok", "outputs_match_baseline": True,
                           "temperature": 0.0, "top_p": 1.0, "tokens_per_s": tokens_per_s,
                           "peak_memory_mb": peak_memory_mb})
    assert list(points["point_id"][tables.pareto_front(points)]) == ["p0", "p2", "p3"]

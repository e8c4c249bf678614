"""A contended machine is flagged: other processes' CPU time is measured per point, points (and the points
whose baseline) measured under contention are marked unstable with the reason, and the terminal says what
to do. Greedy outputs that differ from the baseline say where they diverge and whether it is a near-tie."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time

import pandas as pd
import pytest
from rich.console import Console

from specbench.core import contention, summary
from specbench.core.trace import Trace
from specbench.ui.run import print_run_summary
from specbench.core.summary import mismatch_warning
from specbench.core.results import PointSpec
from test_analytic import BASELINE, NGRAM, rows, trace


def test_other_processes_cpu_time_is_measured_and_our_own_is_not():
    burners = [subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"])
               for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.5)  # the burners are running
        with contention.ConditionsProbe() as busy:
            time.sleep(1.5)
    finally:
        for burner in burners:
            burner.wait()
    assert busy.conditions.other_cpu_share is not None and busy.conditions.other_cpu_share > 0.5
    # this process burning a core itself is its own time, not contention: what it used (as os.times tells
    # it) is left out of the other processes' share
    before, start = os.times(), time.monotonic()
    with contention.ConditionsProbe() as own:
        while time.monotonic() < start + 1.0:
            pass
    after, wall = os.times(), time.monotonic() - start
    own_share = (after.user + after.system - before.user - before.system) / (wall * (os.cpu_count() or 1))
    assert own.conditions.other_cpu_share <= 1.0 - own_share + 0.1
    assert own.conditions.gpu_other_processes is None  # not measured without a GPU


def test_the_limits_name_each_reason():
    assert contention.unstable_reasons(other_cpu_share=0.05, gpu_other_processes=0, repeat_spread=0.02,
                                       tpot_spread=1.5) == []
    assert contention.unstable_reasons(other_cpu_share=0.34, gpu_other_processes=2, repeat_spread=0.5,
                                       tpot_spread=4.0) == [
        "other processes used 34% of the CPU", "2 other process(es) on the GPU", "repeats differ by 50%",
        "TPOT p90/p10 4.0"]
    assert contention.repeat_spread([[100.0, 110.0], [50.0, 50.0], [10.0, 20.0]]) == pytest.approx(0.1)
    assert contention.repeat_spread([[100.0], [50.0]]) is None


def points_with(baseline_share: float, point_share: float) -> pd.DataFrame:
    point = rows(NGRAM, [trace([(4, 4)] * 5, draft_ms=1.0, verify_ms=12.0, ttft_ms=50.0)] * 2)
    baseline = rows(BASELINE, [trace([(0, 0)] * 24, draft_ms=0.0, verify_ms=10.0, ttft_ms=40.0, gamma=1)] * 2)
    context = {BASELINE.point_id: {"other_cpu_share": baseline_share, "gpu_other_processes": None},
               NGRAM.point_id: {"other_cpu_share": point_share, "gpu_other_processes": None}}
    return summary.summarize([BASELINE, NGRAM], pd.concat([baseline, point]), failures={}, context=context)


def test_a_point_whose_baseline_was_contended_is_unstable_and_the_terminal_says_what_to_do():
    quiet = points_with(0.01, 0.02).set_index("point_id")
    assert not quiet["unstable"].any() and quiet["unstable_reason"].isna().all()
    assert quiet.loc[NGRAM.point_id, "other_cpu_share"] == 0.02
    points = points_with(0.40, 0.02)
    flagged = points.set_index("point_id")
    assert bool(flagged.loc[BASELINE.point_id, "unstable"])
    assert flagged.loc[NGRAM.point_id, "unstable_reason"] == "baseline: other processes used 40% of the CPU"
    out = io.StringIO()
    print_run_summary(Console(file=out, width=160), points, "results/x")
    text = out.getvalue()
    assert "x !" in text  # the speedup is marked
    assert "! unstable timing at 2 of 2 points: their speedups cannot be trusted; repeat them on a quiet machine " \
           "(--fresh), or stop the other load" in text
    assert f"{NGRAM.point_id}: baseline: other processes used 40% of the CPU" in text


def greedy(ids: list[int], gaps: list[float]) -> Trace:
    base = trace([(0, 0)] * (len(ids) - 1), draft_ms=0.0, verify_ms=10.0, ttft_ms=5.0, gamma=1)
    return Trace(prompt_tokens=base.prompt_tokens, output_ids=tuple(ids), ttft_s=base.ttft_s,
                 token_times_s=base.token_times_s, steps=base.steps, gamma=1, top2_gap=tuple(gaps))


def test_a_greedy_divergence_records_where_and_the_top2_gap_so_a_near_tie_is_told_from_a_bug():
    spec = PointSpec("close-g2-t0-p1", "draft", "close", 2, 0.0, 1.0, draft_model="m")
    baseline = rows(BASELINE, [greedy([5, 6, 7, 8], [3.0, 2.0, 0.04, 1.0]), greedy([1, 2, 3], [1.0, 1.0, 1.0])])
    point = rows(spec, [greedy([5, 6, 9, 9], [3.0, 2.0, 0.03, 1.0]), greedy([1, 2, 3], [1.0, 1.0, 1.0])])
    row = summary.summarize([BASELINE, spec], pd.concat([baseline, point]), failures={}, context={}) \
        .set_index("point_id").loc[spec.point_id]
    assert not row["outputs_match_baseline"] and row["outputs_match_fraction"] == 0.5
    assert row["first_divergence"] == 2 and row["divergence_top2_gap"] == 0.03
    warning = mismatch_warning({**row.to_dict(), "point_id": spec.point_id})
    assert warning == ("greedy outputs differ from the baseline at close-g2-t0-p1 (50% of requests match); first "
                       "divergence at output token 2, where the target's top-2 logits differ by 0.03: a near-tie that "
                       "reduced-precision verification can flip, not necessarily a bug")
    far = mismatch_warning({"point_id": "x", "outputs_match_fraction": 0.0, "first_divergence": 0,
                            "divergence_top2_gap": 4.5})
    assert far.endswith("differ by 4.5 (not a near-tie): the decoding is broken for this point, its speed means nothing")


def test_a_serving_engines_greedy_mismatch_is_reported_as_its_numerics_not_a_broken_decoder():
    warning = mismatch_warning({"point_id": "self-g3-t0-p1", "backend": "server", "outputs_match_fraction": 0.75,
                                "first_divergence": None, "divergence_top2_gap": None})
    assert warning.startswith("greedy outputs differ from the baseline at self-g3-t0-p1 (75% of requests match): the "
                              "engine's speculative path is not bit-exact with its plain decoding here")
    assert "broken" not in warning


def test_a_server_stopped_or_started_during_a_point_is_not_counted_as_another_processs_load():
    """Before: the first point after a relaunch subtracted the stopped server's lifetime CPU ticks from this run's
    own and blamed 43-72 % of the CPU on other processes at every such point of a quiet vLLM sweep."""
    from specbench.core.contention import _own_ticks

    start = {1: 100, 2: 90_000}  # this process; the previous launch's server, about to be stopped
    end = {1: 130, 3: 4_000}  # this process; the new server, launched within the point
    assert _own_ticks(start, end) == 30 + 4_000

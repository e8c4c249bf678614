"""Progress in a log (specbench.ui.lines): the lines of `specbench run` and `specbench tune` where the console is not
a terminal, exactly; the heartbeat while a point runs, and none once it has finished. The quickstart piped end to end
is in test_quickstart.py."""

from __future__ import annotations

import io
import time

from rich.console import Console

from specbench.core.results import PointSpec
from specbench.ui.lines import ProgressStyle, SweepLines, duration, wants_lines
from specbench.ui.run import SweepProgress, sweep_observer
from specbench.ui.tune import TuneLines, TuneProgress, tune_observer

BASELINE = PointSpec.baseline(0.0, 1.0)
NGRAM = PointSpec(point_id="ngram-g3-t0-p1", method="ngram", draft="ngram", gamma=3, temperature=0.0, top_p=1.0)
DRAFT = PointSpec(point_id="small-g4-t0-p1", method="draft", draft="small", gamma=4, temperature=0.0, top_p=1.0)
HOT_BASELINE = PointSpec.baseline(0.8, 1.0)
HOT = PointSpec(point_id="ngram-g3-t0.8-p1", method="ngram", draft="ngram", gamma=3, temperature=0.8, top_p=1.0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def log_console() -> Console:
    """What a pipe gets: no terminal, 40 columns (lines are never wrapped to it)."""
    return Console(file=io.StringIO(), width=40)


def written(console: Console) -> list[str]:
    return console.file.getvalue().splitlines()


def ok_row(**values) -> dict:
    return {"status": "ok", "error": None, "failed_requests": 0, "unstable": False, "unstable_reason": None,
            "outputs_match_baseline": True, **values}


def run_point(lines: SweepLines, clock: FakeClock, spec: PointSpec, row: dict, *, requests: int = 4,
              answered: int | None = None, seconds: float = 12.0) -> None:
    lines.point_started(spec, requests)
    for _ in range(requests if answered is None else answered):
        lines.request_done(spec)
    clock.now += seconds
    lines.point_finished(spec, row)


def test_a_sweep_in_a_log_is_a_line_per_point_started_and_finished():
    console, clock = log_console(), FakeClock()
    lines = SweepLines(console, clock=clock, stamp=lambda: "2026-01-02 03:04:05")
    resumed = PointSpec(point_id="ngram-g2-t0-p1", method="ngram", draft="ngram", gamma=2, temperature=0.0, top_p=1.0)
    lines.sweep_started([BASELINE, resumed, NGRAM, DRAFT, HOT, HOT_BASELINE], [BASELINE, NGRAM, DRAFT, HOT, HOT_BASELINE])
    lines.message("loading draft small")
    run_point(lines, clock, BASELINE, ok_row(tokens_per_s=41.25, speedup=1.0, speedup_ci_low=1.0, speedup_ci_high=1.0,
                                             acceptance_rate=None, mean_accepted_length=1.0))
    run_point(lines, clock, NGRAM, ok_row(tokens_per_s=58.5, speedup=1.4183, speedup_ci_low=1.2049,
                                          speedup_ci_high=1.6071, acceptance_rate=0.625, mean_accepted_length=2.3125,
                                          failed_requests=1, unstable=True,
                                          unstable_reason="other processes used 46% of the CPU"),
              requests=5, seconds=3725)
    run_point(lines, clock, DRAFT, {"status": "failed", "error": "CUDA out of memory"}, answered=2)
    # its baseline has not run yet (the plan runs it first; a row without a speedup says so)
    run_point(lines, clock, HOT, ok_row(tokens_per_s=30.0, speedup=None, speedup_ci_low=None, speedup_ci_high=None,
                                        acceptance_rate=0.5, mean_accepted_length=1.5, outputs_match_baseline=None),
              requests=1)
    lines.point_started(NGRAM, 8)  # a capacity probe measuring a point again: not numbered
    assert written(console) == [
        "2026-01-02 03:04:05 sweep: 6 points, 5 to run, 1 resumed",
        "2026-01-02 03:04:05 loading draft small",
        "2026-01-02 03:04:05 point 2/6 baseline-t0-p1: started, 4 requests",
        "2026-01-02 03:04:05 point 2/6 baseline-t0-p1: ok, 4/4 requests (0 failed), 41.2 tok/s, in 0:00:12",
        "2026-01-02 03:04:05 point 3/6 ngram-g3-t0-p1: started, 5 requests",
        "2026-01-02 03:04:05 point 3/6 ngram-g3-t0-p1: unstable, 5/5 requests (1 failed), 58.5 tok/s, speedup 1.42x "
        "(95% CI 1.20-1.61), acceptance 62%, mean accepted length 2.31, in 1:02:05; unstable: other processes used "
        "46% of the CPU",
        "2026-01-02 03:04:05 point 4/6 small-g4-t0-p1: started, 4 requests",
        "2026-01-02 03:04:05 point 4/6 small-g4-t0-p1: failed after 2/4 requests, in 0:00:12: CUDA out of memory",
        "2026-01-02 03:04:05 point 5/6 ngram-g3-t0.8-p1: started, 1 request",
        "2026-01-02 03:04:05 point 5/6 ngram-g3-t0.8-p1: ok, 1/1 requests (0 failed), 30.0 tok/s, speedup after the "
        "baseline, acceptance 50%, mean accepted length 1.50, in 0:00:12",
        "2026-01-02 03:04:05 probe ngram-g3-t0-p1: started, 8 requests",
    ]


def test_a_point_line_says_what_its_row_lacks():
    console, clock = log_console(), FakeClock()
    lines = SweepLines(console, clock=clock, stamp=lambda: "T")
    lines.sweep_started([BASELINE, NGRAM, DRAFT], [BASELINE, NGRAM, DRAFT])
    run_point(lines, clock, BASELINE, {"status": "failed", "error": "every request failed"}, answered=0)
    run_point(lines, clock, NGRAM, ok_row(tokens_per_s=None, speedup=None, acceptance_rate=None,
                                          mean_accepted_length=None), requests=1)
    lines.sweep_started([BASELINE, NGRAM, DRAFT], [DRAFT])  # resumed: the baseline is recorded
    run_point(lines, clock, DRAFT, ok_row(tokens_per_s=9.0, speedup=0.9, speedup_ci_low=None, speedup_ci_high=None,
                                          acceptance_rate=0.25, mean_accepted_length=1.2,
                                          outputs_match_baseline=False), requests=1)
    assert [line for line in written(console) if "started" not in line] == [
        "T sweep: 3 points, 3 to run, 0 resumed",
        "T point 1/3 baseline-t0-p1: failed after 0/4 requests, in 0:00:12: every request failed",
        "T point 2/3 ngram-g3-t0-p1: ok, 1/1 requests (0 failed), - tok/s, no speedup (the baseline failed), "
        "acceptance -, in 0:00:12",
        "T sweep: 3 points, 1 to run, 2 resumed",
        "T point 3/3 small-g4-t0-p1: ok, 1/1 requests (0 failed), 9.0 tok/s, speedup 0.90x (no CI from one prompt), "
        "acceptance 25%, mean accepted length 1.20, in 0:00:12; greedy outputs differ from the baseline's (the "
        "summary says why)",
    ]


def test_the_heartbeat_tells_the_open_point_its_requests_elapsed_and_eta():
    console, clock = log_console(), FakeClock()
    lines = SweepLines(console, clock=clock, stamp=lambda: "T")
    lines.sweep_started([BASELINE], [BASELINE])
    assert lines.beat_text() is None  # no point open: nothing to say
    lines.point_started(BASELINE, 10)
    clock.now += 90
    assert lines.beat_text() == "point 1/1 baseline-t0-p1: running, 0/10 requests, elapsed 0:01:30, eta -"
    for _ in range(4):
        lines.request_done(BASELINE)
    assert lines.beat_text() == "point 1/1 baseline-t0-p1: running, 4/10 requests, elapsed 0:01:30, eta 0:02:15"
    lines.point_finished(BASELINE, {"status": "failed", "error": "killed"})
    assert lines.beat_text() is None


def test_points_of_several_workers_open_at_once_keep_their_own_counts():
    """`--workers 2` relays both workers' points into one observer: each finished line counts its own requests, the
    heartbeat names every open point, and a capacity probe left open is ended by the next point to start."""
    console, clock = log_console(), FakeClock()
    lines = SweepLines(console, clock=clock, stamp=lambda: "T")
    lines.sweep_started([BASELINE, NGRAM, DRAFT], [BASELINE, NGRAM, DRAFT])
    lines.point_started(BASELINE, 3)
    lines.point_started(NGRAM, 2)
    lines.request_done(BASELINE)
    lines.request_done(NGRAM)
    clock.now += 60
    assert lines.beat_text() == ("point 1/3 baseline-t0-p1: running, 1/3 requests, elapsed 0:01:00, eta 0:02:00; "
                                 "point 2/3 ngram-g3-t0-p1: running, 1/2 requests, elapsed 0:01:00, eta 0:01:00")
    lines.request_done(BASELINE)
    lines.request_done(BASELINE)
    lines.point_finished(BASELINE, ok_row(tokens_per_s=10.0))
    lines.request_done(NGRAM)
    lines.point_finished(NGRAM, ok_row(tokens_per_s=20.0, speedup=2.0, speedup_ci_low=1.5, speedup_ci_high=2.5,
                                       acceptance_rate=0.5, mean_accepted_length=2.0))
    assert written(console)[-2:] == [
        "T point 1/3 baseline-t0-p1: ok, 3/3 requests (0 failed), 10.0 tok/s, in 0:01:00",
        "T point 2/3 ngram-g3-t0-p1: ok, 2/2 requests (0 failed), 20.0 tok/s, speedup 2.00x (95% CI 1.50-2.50), "
        "acceptance 50%, mean accepted length 2.00, in 0:01:00",
    ]
    lines.point_started(NGRAM, 5)  # a capacity probe: started, never finished
    lines.point_started(DRAFT, 1)
    assert lines.beat_text() == "point 3/3 small-g4-t0-p1: running, 0/1 requests, elapsed 0:00:00, eta -"


def test_a_heartbeat_comes_from_its_thread_while_a_point_runs_and_none_after_it():
    console = log_console()
    with SweepLines(console, heartbeat_s=0.05) as lines:
        lines.sweep_started([BASELINE], [BASELINE])
        lines.point_started(BASELINE, 3)
        lines.request_done(BASELINE)
        deadline = time.monotonic() + 30  # a loaded machine may delay the thread, not stop it
        while not any("running" in line for line in written(console)) and time.monotonic() < deadline:
            time.sleep(0.01)
        lines.point_finished(BASELINE, {"status": "failed", "error": "stopped"})
        time.sleep(0.3)  # six intervals with no point open
    out = written(console)
    finished = next(i for i, line in enumerate(out) if "failed after" in line)
    beats = [i for i, line in enumerate(out) if ": running, 1/3 requests, elapsed " in line]
    assert beats and max(beats) < finished, out
    assert len(out) == finished + 1  # nothing after the point finished


def test_lines_where_the_console_is_no_terminal_or_a_dumb_one_or_where_asked():
    pipe, terminal = log_console(), Console(file=io.StringIO(), force_terminal=True, _environ={"TERM": "xterm"})
    dumb = Console(file=io.StringIO(), force_terminal=True, _environ={"TERM": "dumb"})
    assert wants_lines(pipe) and wants_lines(dumb) and not wants_lines(terminal)
    assert wants_lines(terminal, ProgressStyle.lines) and not wants_lines(pipe, ProgressStyle.bars)
    assert isinstance(sweep_observer(pipe), SweepLines) and isinstance(sweep_observer(terminal), SweepProgress)
    assert isinstance(tune_observer(pipe), TuneLines) and isinstance(tune_observer(terminal), TuneProgress)


def test_a_tune_in_a_log_is_a_timestamped_line_per_trial_and_a_heartbeat():
    console, clock = log_console(), FakeClock()
    lines = TuneLines(console, clock=clock, stamp=lambda: "T")
    lines.message("warm start: 3 configurations")
    lines.trial_finished("quickstart-t0-p1", {"number": 0, "point_id": "ngram-g3-t0-p1", "state": "COMPLETE",
                                              "value": 41.256, "evaluated": True})
    lines.trial_finished("quickstart-t0-p1", {"number": 1, "point_id": "small-g4-t0-p1", "state": "FAIL",
                                              "error": "CUDA out of memory [x]"})
    clock.now += 75
    assert written(console) == ["T warm start: 3 configurations",
                                "T quickstart-t0-p1 #0 ngram-g3-t0-p1: done objective 41.26",
                                "T quickstart-t0-p1 #1 small-g4-t0-p1: failed CUDA out of memory [x]"]
    assert lines.beat_text() == "tune: running, 2 trials finished, elapsed 0:01:15"
    terminal = Console(file=io.StringIO(), force_terminal=True, color_system=None, width=200)
    TuneProgress(terminal).trial_finished("s", {"number": 2, "point_id": "p", "state": "PRUNED", "value": 3.0,
                                                "evaluated": False})
    assert terminal.file.getvalue() == "s #2 p: pruned objective 3 (recorded)\n"


def test_durations_read_as_hours_minutes_seconds():
    assert [duration(s) for s in (0, 59.6, 3725, 90061)] == ["0:00:00", "0:01:00", "1:02:05", "25:01:01"]

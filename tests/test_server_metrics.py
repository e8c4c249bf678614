"""What the server backend reads from an engine's /metrics besides acceptance: what the engine holds (KV-cache usage,
requests running and waiting, preemptions) sampled over a point and summarised into its columns, and the signs of
work that tell a hung engine from a slow one (`watch.hang_reason`, `watch.progress`, the window `watch.limits`
keeps between two silent stretches).

The /metrics texts under tests/fixtures/metrics/ were captured from the real engines installed here: vLLM 0.32.0's
CPU build (SmolLM2-135M fp32, eager, 4 sequences, 1 GiB of KV cache, n-gram speculation) idle, idle 5 s later, and
with 6 requests sent (4 running, 2 waiting); llama.cpp's llama-server build 11434 (the embedded SmolLM2 GGUF, 2
slots, --metrics) idle and with 3 requests sent (2 processing, 1 deferred). SGLang is not installed: its text below is
its documentation's example (docs/references/production_metrics.md), trimmed."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from specbench.backends.server import client, watch
from specbench.backends.server.measure import point_measurements
from specbench.backends.server.metrics import EngineLoad, engine_load, summarize_load, work_samples
from specbench.backends.server.process import ServerProcess, free_port
from specbench.backends.server.sampler import MetricsSampler
from test_server_client import answer, requests, standin  # noqa: F401 - standin is a fixture

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
VLLM_IDLE = (FIXTURES / "vllm-0.32.0-cpu-idle.prom").read_text()
VLLM_IDLE_LATER = (FIXTURES / "vllm-0.32.0-cpu-idle-5s-later.prom").read_text()
VLLM_BUSY = (FIXTURES / "vllm-0.32.0-cpu-busy.prom").read_text()
LLAMA_IDLE = (FIXTURES / "llamacpp-b11434-idle.prom").read_text()
LLAMA_BUSY = (FIXTURES / "llamacpp-b11434-busy.prom").read_text()
SGLANG_DOCS = """\
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:num_running_reqs The number of running requests
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 162.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2826.0
"""


# --- what the engine holds ----------------------------------------------------------------------------------------


def test_what_each_engine_holds_is_read_by_its_own_names_and_none_where_it_has_no_such_figure():
    # vLLM's queue-time histogram: its _sum (seconds) and _count (none had left the queue yet when captured)
    assert engine_load(VLLM_BUSY, prefix="vllm:") == EngineLoad(0.02209944751381221, 4.0, 2.0, 0.0, 117.0,
                                                                queue_time_s=0.0, queued_requests=0.0)
    assert engine_load(VLLM_IDLE, prefix="vllm:") == EngineLoad(0.0, 0.0, 0.0, 0.0, 0.0, queue_time_s=0.0,
                                                                queued_requests=0.0)
    # llama.cpp: slots processing and requests deferred; no KV-cache usage in this build, no preemption counter;
    # its output tokens counted as requests finish
    assert engine_load(LLAMA_BUSY, prefix="llamacpp:") == EngineLoad(None, 2.0, 1.0, None, 0.0)
    assert engine_load(LLAMA_IDLE, prefix="llamacpp:") == EngineLoad(None, 0.0, 0.0, None, 0.0)
    assert engine_load(SGLANG_DOCS, prefix="sglang:") == EngineLoad(0.28, 162.0, 2826.0, None)
    older = ("# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name=\"m\"} 0.5\n"
             "# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total{model_name=\"m\"} 3\n")
    assert engine_load(older, prefix="vllm:") == EngineLoad(0.5, None, None, 3.0)  # before v1's names
    two_engines = ("# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.2\n"
                   "vllm:kv_cache_usage_perc{engine=\"1\"} 0.7\n# TYPE vllm:num_requests_running gauge\n"
                   "vllm:num_requests_running{engine=\"0\"} 3\nvllm:num_requests_running{engine=\"1\"} 5\n")
    assert engine_load(two_engines, prefix="vllm:") == EngineLoad(0.7, 8.0, None, None)  # the fullest; the sum
    assert engine_load(VLLM_BUSY, prefix="other:") is None


def test_a_point_summary_takes_peaks_the_mean_and_the_preemption_counters_rise():
    samples = [EngineLoad(0.1, 1.0, 0.0, 5.0), EngineLoad(0.5, 4.0, 3.0, 6.0), EngineLoad(0.3, 2.0, 1.0, 7.0)]
    summary = summarize_load(samples)
    assert (summary.kv_cache_usage_peak, summary.requests_running_peak, summary.requests_waiting_peak) == (0.5, 4, 3)
    assert summary.kv_cache_usage_mean == pytest.approx(0.3)
    assert (summary.preemptions, summary.metrics_samples) == (2, 3)
    # the samples before the first request and after the last response bound the counter, not the peaks
    idle = EngineLoad(0.0, 0.0, 0.0, 4.0), EngineLoad(0.0, 0.0, 0.0, 9.0)
    bounded = summarize_load(samples, before=idle[0], after=idle[1])
    assert (bounded.kv_cache_usage_mean, bounded.preemptions, bounded.metrics_samples) == (summary.kv_cache_usage_mean,
                                                                                          5, 3)
    short = summarize_load([], before=idle[0], after=idle[1])  # a point shorter than the sampling interval
    assert (short.kv_cache_usage_peak, short.requests_running_peak, short.preemptions, short.metrics_samples) == \
        (None, None, 5, 0)
    llama = summarize_load([engine_load(LLAMA_IDLE, prefix="llamacpp:"), engine_load(LLAMA_BUSY, prefix="llamacpp:")])
    assert (llama.kv_cache_usage_peak, llama.kv_cache_usage_mean, llama.preemptions) == (None, None, None)
    assert (llama.requests_running_peak, llama.requests_waiting_peak, llama.metrics_samples) == (2, 1, 2)
    nothing = summarize_load([])
    assert (nothing.kv_cache_usage_peak, nothing.requests_running_peak, nothing.preemptions,
            nothing.metrics_samples, nothing.queue_time_ms_mean, nothing.series_t_ms) == (None, None, None, 0, None, None)


def test_the_mean_queue_time_is_the_histograms_rise_over_the_requests_that_left_the_queue():
    before = EngineLoad(0.0, 0.0, 0.0, 0.0, queue_time_s=1.5, queued_requests=10.0)
    after = EngineLoad(0.0, 0.0, 0.0, 0.0, queue_time_s=3.9, queued_requests=22.0)
    assert summarize_load([], before=before, after=after).queue_time_ms_mean == pytest.approx(200.0)  # 2.4 s / 12
    assert summarize_load([], before=before, after=before).queue_time_ms_mean is None  # nobody left the queue
    llama = engine_load(LLAMA_BUSY, prefix="llamacpp:")  # llama-server keeps no such histogram
    assert summarize_load([], before=llama, after=llama).queue_time_ms_mean is None


def test_point_measurements_carry_what_the_engine_held_and_none_without_samples():
    load = summarize_load([engine_load(VLLM_IDLE, prefix="vllm:"), engine_load(VLLM_BUSY, prefix="vllm:")])
    measured = point_measurements(None, None, [], peak_mb=512.0, load=load)
    assert {k: measured[k] for k in ("kv_cache_usage_peak", "requests_running_peak", "requests_waiting_peak",
                                     "preemptions", "metrics_samples")} == {
        "kv_cache_usage_peak": 0.02209944751381221, "requests_running_peak": 4, "requests_waiting_peak": 2,
        "preemptions": 0, "metrics_samples": 2}
    assert measured["kv_cache_usage_mean"] == pytest.approx(0.02209944751381221 / 2)
    unsampled = point_measurements(None, None, [], peak_mb=None)
    assert unsampled["kv_cache_usage_peak"] is None and unsampled["preemptions"] is None
    assert unsampled["metrics_samples"] == 0


def test_the_sampler_reads_metrics_while_the_point_runs_and_skips_what_does_not_answer(standin):
    server = standin(lambda body: answer(), metrics=VLLM_IDLE)
    def samples_reach(count: int) -> None:  # by count, not by sleeping: a busy machine delays the sampler's thread
        deadline = time.monotonic() + 30
        while len(sampler.samples) < count:
            assert time.monotonic() < deadline, f"{len(sampler.samples)} samples in 30 s"
            time.sleep(0.01)

    with MetricsSampler(server.url, prefix="vllm:", api_key=None, interval_s=0.05) as sampler:
        samples_reach(2)
        server.metrics = VLLM_BUSY  # requests arrive
        samples_reach(len(sampler.samples) + 2)  # the second after the change is a busy one
        server.metrics = VLLM_IDLE  # and finish before the last sample
    summary = sampler.summary()
    assert summary.metrics_samples >= 4  # one per interval while the requests ran
    untimed = [dataclasses.replace(s, t_ms=None) for s in (sampler.before, sampler.after)]
    assert untimed == [engine_load(VLLM_IDLE, prefix="vllm:")] * 2  # before and after the point
    # the point's time series: one entry per sample while the requests ran, ms from the sample before the first
    assert len(summary.series_t_ms) == summary.metrics_samples and sampler.before.t_ms == 0
    assert summary.series_t_ms == sorted(summary.series_t_ms) and summary.series_t_ms[0] > 0
    assert 4.0 in summary.series_requests_running and summary.series_requests_running[0] == 0.0
    assert set(summary.series_requests_waiting) == {0.0, 2.0} and set(summary.series_preemptions) == {0.0}
    assert (summary.kv_cache_usage_peak, summary.requests_running_peak, summary.requests_waiting_peak,
            summary.preemptions) == (0.02209944751381221, 4, 2, 0)
    assert 0 < summary.kv_cache_usage_mean < summary.kv_cache_usage_peak
    with MetricsSampler(server.url, prefix=None, api_key=None, interval_s=0.05) as unknown:
        time.sleep(0.1)
    assert unknown.summary().metrics_samples == 0  # an engine whose names are not known: nothing sampled
    nobody = f"http://127.0.0.1:{free_port()}"
    with MetricsSampler(nobody, prefix="vllm:", api_key=None, interval_s=0.05, timeout_s=0.2) as gone:
        time.sleep(0.1)
    assert gone.summary().metrics_samples == 0 and gone.summary().kv_cache_usage_peak is None


# --- signs of work -----------------------------------------------------------------------------------------------


def test_an_idle_engines_work_samples_do_not_move_and_a_busy_ones_do():
    assert VLLM_IDLE != VLLM_IDLE_LATER  # process_cpu_seconds_total and resident memory moved in those 5 s
    assert work_samples(VLLM_IDLE) == work_samples(VLLM_IDLE_LATER)
    assert work_samples(VLLM_IDLE) != work_samples(VLLM_BUSY)
    assert work_samples(LLAMA_IDLE) != work_samples(LLAMA_BUSY)
    assert not any(name.startswith(("process_", "python_", "http_")) for name, _ in work_samples(VLLM_IDLE))


def snapshot(at: float, work, log_bytes: int | None = 0) -> watch.Snapshot:
    return watch.Snapshot(at, work, log_bytes)


def test_progress_over_a_window_from_metrics_and_the_log_but_not_its_access_lines():
    idle, later = work_samples(VLLM_IDLE), work_samples(VLLM_IDLE_LATER)
    access = ('INFO:     127.0.0.1:36888 - "GET /health HTTP/1.1" 200 OK\n'
              'INFO:     127.0.0.1:36904 - "GET /metrics HTTP/1.1" 200 OK\n'
              'INFO:     127.0.0.1:36910 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n')
    still = watch.progress(snapshot(10.0, idle), snapshot(42.0, later), appended=access)
    assert (still.window_s, still.metrics, still.log, still.moved) == (32.0, "unchanged", "unchanged", False)
    throughput = ("(APIServer pid=22711) INFO 12-04 03:35:10 [loggers.py:335] Engine 000: Avg prompt throughput: 22.8 "
                  "tokens/s, Avg generation throughput: 23.3 tokens/s, Running: 4 reqs, Waiting: 2 reqs\n")
    assert watch.progress(snapshot(0, idle), snapshot(30, later), appended=access + throughput).log == "grew"
    assert watch.progress(snapshot(0, idle), snapshot(30, work_samples(VLLM_BUSY)), appended="").metrics == "moved"
    unanswered = watch.progress(snapshot(0, watch.UNANSWERED), snapshot(30, watch.UNANSWERED), appended="")
    assert (unanswered.metrics, unanswered.moved, unanswered.watched) == ("unanswered", False, True)
    # a /metrics that answers again (llama-server's loop was in one long batch) moved; none to read: not watched
    assert watch.progress(snapshot(0, watch.UNANSWERED), snapshot(30, idle), appended="").metrics == "moved"
    attached = watch.progress(snapshot(0, None, None), snapshot(30, None, None), appended=None)
    assert (attached.metrics, attached.log, attached.watched) == (None, None, False)


WINDOW = watch.Progress(32.0, "unchanged", "unchanged")


@pytest.mark.parametrize(("case", "expected"), [
    (dict(stopped=True, cpu_used=None, health_answers=None),
     "no byte from the server for 31 s and its process is stopped (SIGSTOP?)"),
    (dict(cpu_used=False, health_answers=False),
     "no byte from the server for 31 s, it used no CPU time for 2 s and its /health did not answer within 10 s: the "
     "engine is hung"),
    (dict(cpu_used=None, health_answers=False),  # attached
     "no byte from the server for 31 s and its /health did not answer within 10 s: the engine is hung"),
    # computing (a long prefill on a CPU): not hung when the silence is first noticed, nor while anything moves
    (dict(cpu_used=True, health_answers=None), None),
    (dict(cpu_used=True, health_answers=None, progress=watch.Progress(32.0, "moved", "unchanged")), None),
    (dict(cpu_used=True, health_answers=None, progress=watch.Progress(32.0, "unchanged", "grew")), None),
    (dict(cpu_used=True, health_answers=None, progress=watch.Progress(32.0, "unanswered", "grew")), None),
    (dict(cpu_used=None, health_answers=True, progress=watch.Progress(32.0, None, None)), None),  # nothing to watch
    # spinning on a deadlocked GPU: CPU used, /health answers, nothing it counts moved, its log silent
    (dict(cpu_used=True, health_answers=None, progress=WINDOW),
     "no byte from the server for 31 s; over the last 32 s its /metrics did not change and its log did not grow, "
     "though it used CPU time: the engine is hung"),
    (dict(cpu_used=False, health_answers=True, progress=WINDOW),
     "no byte from the server for 31 s; over the last 32 s its /metrics did not change and its log did not grow, "
     "though its /health answered: the engine is hung"),
    # a main loop busy in one long step (llama-server serves /metrics from it) answers nothing while it computes
    (dict(cpu_used=True, health_answers=None, progress=watch.Progress(32.0, "unanswered", "unchanged")), None),
    (dict(cpu_used=False, health_answers=True, progress=watch.Progress(32.0, "unanswered", "unchanged")),
     "no byte from the server for 31 s; over the last 32 s its /metrics did not answer within 5 s and its log did not "
     "grow, though its /health answered: the engine is hung"),
    (dict(cpu_used=None, health_answers=True, progress=watch.Progress(32.0, "unchanged", None)),  # attached
     "no byte from the server for 31 s; over the last 32 s its /metrics did not change, though its /health answered: "
     "the engine is hung"),
])
def test_hang_reason(case, expected):
    assert watch.hang_reason(silent_s=31.0, **case) == expected


class Spinning:
    """A launched engine's process as watch.limits sees it: never stopped, always using CPU time, with a log."""

    def __init__(self, log_path: Path):
        self.log_path, self.ticks = log_path, 0

    def progress(self) -> tuple[bool, int]:
        self.ticks += 10
        return False, self.ticks


def test_a_spinning_engine_is_hung_after_a_window_where_nothing_moved_and_not_while_something_does(
        standin, tmp_path, monkeypatch):
    monkeypatch.setattr(watch, "CPU_SAMPLE_S", 0.01)
    server = standin(lambda body: answer(), metrics=VLLM_BUSY)
    log = tmp_path / "engine.log"
    log.write_text("$ vllm serve\n")
    limits = watch.limits(url=server.url, server=Spinning(log), point_timeout=600.0)

    def ask(silent_s: float) -> str | None:
        return asyncio.run(limits.hung(silent_s))

    assert ask(31.0) is None  # the window starts: computing, as far as anyone knows
    with log.open("a") as out:
        out.write('INFO:     127.0.0.1:1 - "GET /metrics HTTP/1.1" 200 OK\n')  # a probe's access line only
    reason = ask(62.0)
    assert reason.startswith("no byte from the server for 62 s; over the last 0 s its /metrics did not change and its "
                             "log did not grow, though it used CPU time: the engine is hung"), reason
    time.sleep(0.02)
    assert ask(0.01) is None  # a byte arrived after the last look: a new silent stretch, a new window
    server.metrics = VLLM_IDLE  # tokens were generated meanwhile
    assert ask(62.0) is None
    with log.open("a") as out:
        out.write("INFO Engine 000: Avg prompt throughput: 11.4 tokens/s\n")
    assert ask(93.0) is None
    assert ask(124.0).endswith("the engine is hung")


def test_the_client_asks_again_after_each_silent_stretch_with_the_whole_silence(standin):
    server = standin(lambda body: [("sleep", 30.0)] + answer())
    asked = []

    async def hung(silent_s: float) -> str | None:
        asked.append(silent_s)
        return "hung at last" if len(asked) == 3 else None

    with pytest.raises(client.PointAborted, match=r"^hung at last, with 1 requests in flight$"):
        client.run(server.url, requests(1), model="m", concurrency=1, limits=client.Limits(hung=hung, stall_s=0.3))
    assert len(asked) == 3 and asked[0] >= 0.3
    assert asked[1] >= asked[0] + 0.3 and asked[2] >= asked[1] + 0.3  # the silence since the last byte, not reset


def test_a_stopped_engine_is_looked_at_once_a_second_after_a_short_silence_not_after_the_stall(standin):
    server = standin(lambda body: [("sleep", 30.0)] + answer())
    looks: list[float] = []

    def stopped(silent_s: float) -> str | None:
        looks.append(silent_s)
        return "stopped at last" if len(looks) == 2 else None

    limits = client.Limits(stopped=stopped, stopped_s=0.3, hung=None, stall_s=60.0)
    with pytest.raises(client.PointAborted, match=r"^stopped at last, with 1 requests in flight$") as aborted:
        client.run(server.url, requests(1), model="m", concurrency=1, limits=limits)
    assert aborted.value.engine_unusable and looks[0] >= 0.3 and looks[1] >= looks[0] + 1.0


def test_an_engine_is_stopped_at_two_looks_only_without_cpu_time_used_between_them(tmp_path):
    """What a launched engine's limits look at: its processes' state and CPU time in /proc. A stopped engine is hung
    at the second look that finds it stopped; one stopped for a moment and running between the looks (a debugger
    or strace flickers through stops) is not."""
    spin = "import time\nwhile True:\n    end = time.monotonic() + 0.2\n    while time.monotonic() < end: pass\n"
    server = ServerProcess([sys.executable, "-c", spin], log_path=tmp_path / "engine.log", port=free_port()).start()
    try:
        stopped = watch.limits(url=server.url, server=server, point_timeout=60.0).stopped
        deadline = time.monotonic() + 10
        while not server.engine_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        (engine,) = server.engine_pids()
        assert stopped(6.0) is None and stopped(7.0) is None  # running
        os.kill(engine, signal.SIGSTOP)
        time.sleep(0.1)  # the stop has taken
        assert stopped(8.0) is None  # stopped at one look: not yet
        os.kill(engine, signal.SIGCONT)
        time.sleep(0.5)  # it runs between the looks
        os.kill(engine, signal.SIGSTOP)
        time.sleep(0.1)
        assert stopped(9.0) is None  # stopped at two looks, but it used CPU time between them
        assert stopped(10.0) == "no byte from the server for 10 s and its process is stopped (SIGSTOP?)"
    finally:
        server.stop(grace_s=2.0)


# --- in the report ------------------------------------------------------------------------------------------------


def test_the_report_shows_what_the_engine_held_after_peak_memory_only_where_a_point_has_it():
    from specbench.core.results import POINT_COLUMNS, POINT_DTYPES
    from specbench.report import tables

    def frame(**engine) -> pd.DataFrame:
        rows = [{"point_id": point_id, "status": "ok", "method": method, "temperature": 0.0, "top_p": 1.0,
                 "speedup": speedup, "peak_memory_mb": 900.0, "outputs_match_baseline": True,
                 **{name: values[i] for name, values in engine.items()}}
                for i, (point_id, method, speedup) in enumerate((("baseline-t0-p1", "baseline", 1.0),
                                                                 ("ngram-g3-t0-p1", "ngram", 1.3)))]
        return pd.DataFrame(rows, columns=POINT_COLUMNS).astype(POINT_DTYPES)

    shown = tables.display_points(tables.points_table(frame(kv_cache_usage_peak=[0.42, 0.61],
                                                            requests_waiting_peak=[0, 3], preemptions=[0, None]),
                                                      run="r"))
    assert list(shown.columns) == ["point", "speedup", "95% CI", "tok/s", "accept", "MAL", "TPOT p50 ms",
                                   "TPOT p90 ms", "TTFT p50 ms", "peak MB", "KV peak", "waiting peak", "preempted",
                                   "status"]
    assert shown[["KV peak", "waiting peak", "preempted"]].values.tolist() == [["61%", "3", "-"], ["42%", "0", "0"]]
    llama = tables.display_points(tables.points_table(frame(requests_waiting_peak=[0, 1]), run="r"))
    assert list(llama.columns)[9:] == ["peak MB", "waiting peak", "status"]  # no KV usage, no preemption counter
    assert list(tables.display_points(tables.points_table(frame(), run="r")).columns) == list(tables.DISPLAY_COLUMNS)


def test_an_attached_server_that_generated_more_than_specbench_asked_carried_other_traffic():
    from specbench.backends.server.measure import point_measurements

    rows = [{"error": None, "output_tokens": 100, "drafted_tokens": None, "accepted_tokens": None}] * 4
    load = summarize_load([], before=EngineLoad(0.0, 0.0, 0.0, 0.0, 1000.0), after=EngineLoad(0.0, 0.0, 0.0, 0.0, 1900.0))
    assert load.engine_generated_tokens == 900.0
    busy = point_measurements(None, None, rows, peak_mb=None, speculates=False, load=load, attached=True)
    assert busy["other_traffic_tokens"] == 500.0  # 900 generated, 400 received
    quiet = summarize_load([], before=EngineLoad(0.0, 0.0, 0.0, 0.0, 0.0), after=EngineLoad(0.0, 0.0, 0.0, 0.0, 404.0))
    assert point_measurements(None, None, rows, peak_mb=None, speculates=False, load=quiet,
                              attached=True)["other_traffic_tokens"] == 0.0  # within the engine's own counting
    assert point_measurements(None, None, rows, peak_mb=None, speculates=False, load=load,
                              attached=False)["other_traffic_tokens"] is None  # launched: nobody else sends to it


def test_sglang_acceptance_comes_from_its_accepted_length_gauge_and_says_so():
    from specbench.backends.server.measure import point_measurements
    from specbench.core.results import PointSpec
    from specbench.core.summary import engine_acceptance

    text = ('# TYPE sglang:spec_accept_length gauge\nsglang:spec_accept_length{model_name="m"} 2.5\n'
            '# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name="m"} 3\n')
    sample = engine_load(text, prefix="sglang:")
    assert sample.accept_length == 2.5
    load = summarize_load([sample, dataclasses.replace(sample, accept_length=3.5)])
    assert load.engine_accept_length_gauge == 3.0
    rows = [{"error": None, "output_tokens": 50, "drafted_tokens": None, "accepted_tokens": None}]
    measured = point_measurements(None, None, rows, peak_mb=None, speculates=True, load=load)
    assert measured["acceptance_source"] == "gauge"
    spec = PointSpec(point_id="eagle3-g3-t0-p1", method="eagle3", draft="eagle3", gamma=3, temperature=0.0, top_p=1.0)
    assert engine_acceptance(measured, spec, decode_tokens=49) == {"mean_accepted_length": 3.0,
                                                                  "acceptance_rate": pytest.approx(2 / 3)}


def test_the_prefix_cache_reset_says_whether_the_engine_emptied_it_and_is_not_tried_where_it_cannot_be():
    import http.server
    import threading
    import types

    from specbench.backends.server.measure import reset_prefix_cache
    from specbench.engines import ENGINES

    answers = {"/reset_prefix_cache": (200, b'{"success": true}'), "/flush_cache": (200, b"Cache flushed.")}
    posted = []

    class Engine(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            posted.append((self.path, self.headers.get("Authorization")))
            status, body = answers.get(self.path, (404, b"Not Found"))
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    def session(engine: str, *, attached=False, api_key=None):
        return types.SimpleNamespace(engine=ENGINES[engine], attached=attached, api_key=api_key)

    try:
        assert reset_prefix_cache(session("vllm", api_key="k"), url) is True
        assert posted == [("/reset_prefix_cache", "Bearer k")]
        answers["/reset_prefix_cache"] = (200, b'{"success": false}')  # vLLM while requests hold blocks
        assert reset_prefix_cache(session("vllm"), url) is False
        del answers["/reset_prefix_cache"]  # vLLM launched without its dev mode: 404
        assert reset_prefix_cache(session("vllm"), url) is False
        assert reset_prefix_cache(session("sglang"), url) is True  # SGLang answers in plain text
        posted.clear()
        assert reset_prefix_cache(session("vllm", attached=True), url) is None  # another's cache: not tried
        assert reset_prefix_cache(session("llama.cpp"), url) is None  # no endpoint for the whole cache
        assert posted == []
        assert reset_prefix_cache(session("vllm"), f"http://127.0.0.1:{free_port()}", timeout_s=1) is False
    finally:
        server.shutdown()
    assert ENGINES["vllm"].launch_env == {"VLLM_SERVER_DEV_MODE": "1"}  # the endpoint is served only in dev mode

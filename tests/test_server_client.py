"""The server backend's client side, against a stand-in HTTP server (pure client behaviour: what the engine does is
tested against real engines in test_server*.py): a failed request is a row, not the end of the point; a point fails
only when more than half its requests fail; a client stalled on purpose records its send lateness and its point is
flagged; reasoning chunks count for TTFT; unreadable /metrics and llama.cpp responses without draft counts fall back
instead of failing; the schedule is vLLM's; what is refused up front is one line."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import time
from types import SimpleNamespace

import pandas as pd
import pytest
from aiohttp import web

from specbench.core import summary
from specbench.backends.server import checks, client, watch
from specbench.backends.server.measure import check_failures, counters, point_measurements, request_row
from specbench.backends.server.metrics import SpecCounters
from specbench.backends.server.process import end_leftovers, start_time
from specbench.profile import ProfileError
from specbench.core.results import PointSpec
from specbench.workloads.prompts import Prompt


class StandIn:
    """A stand-in OpenAI-compatible server on a thread: each request streams the chunks `script(body)` returns
    (dicts sent as `data:` events; ("sleep", s) pauses; ("status", code) answers with that status instead)."""

    def __init__(self, script, metrics: str = ""):
        self.script, self.metrics, self.bodies, self.peers = script, metrics, [], []
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        self.runner = web.AppRunner(app, shutdown_timeout=0.5)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        ready.set()
        self.loop.run_forever()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.peers.append(request.transport.get_extra_info("peername")[1])  # the client's port: one per connection
        steps = self.script(body)
        if steps and steps[0][0] == "status":
            return web.Response(status=steps[0][1], text="overloaded")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for step in steps:
                if step[0] == "sleep":
                    await asyncio.sleep(step[1])
                else:
                    await response.write(f"data: {json.dumps(step[1])}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
        except ConnectionError:  # the client gave up on the request
            pass
        return response

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def chunk(content=None, reasoning=None, finish=None):
    delta = {k: v for k, v in (("content", content), ("reasoning_content", reasoning)) if v is not None}
    return ("data", {"choices": [{"delta": delta, "finish_reason": finish}]})


def answer(words: int = 3, usage: bool = True):
    steps = [chunk(content=f"w{i} ") for i in range(words)] + [chunk(finish="stop")]
    return steps + ([("data", {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": words}})] if usage else [])


@pytest.fixture
def standin():
    servers = []

    def make(script, metrics: str = ""):
        servers.append(StandIn(script, metrics))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def requests(count: int, timeout_s: float = 30.0) -> list[client.Request]:
    return [client.Request(i, [{"role": "user", "content": f"prompt {i}"}], 0.0, 1.0, 8, i, timeout_s=timeout_s)
            for i in range(count)]


SESSION = SimpleNamespace(tokenizer=None)
PROMPT = Prompt("p0", [{"role": "user", "content": "hi"}], "qa")


def rows_of(spec: PointSpec, responses: list[client.Response]) -> list[dict]:
    return [request_row(spec, r, session=SESSION, point_key="k", prompt=Prompt(f"p{r.index}", PROMPT.messages, "qa"),
                        repeat=0, seed=0) for r in responses]


def test_a_failed_request_is_a_row_with_its_error_and_the_point_is_measured_without_it(standin):
    server = standin(lambda body: [("status", 503)] if body["messages"][0]["content"] == "prompt 2" else answer())
    responses = client.run(server.url, requests(4), model="m", concurrency=2)
    assert [r.error for r in responses] == [None, None, "HTTP 503: overloaded", None]
    spec = PointSpec.baseline(0.0, 1.0, concurrency=2)
    rows = rows_of(spec, responses)
    check_failures(rows)  # 1 of 4: measured
    failed = rows[2]
    assert failed["error"] == "HTTP 503: overloaded" and failed["start_ms"] is not None
    assert all(failed[name] is None for name in ("ttft_ms", "e2e_ms", "output_tokens", "tpot_ms", "output_sha"))
    point = summary.summarize([spec], pd.DataFrame(rows), failures={}, context={}, slo={"ttft_ms": 10_000.0}).iloc[0]
    assert (point["status"], point["n_requests"], point["failed_requests"]) == ("ok", 3, 1)
    assert point["request_errors"] == "1 x HTTP 503: overloaded"
    assert point["output_tokens"] == 9 and point["slo_met_fraction"] == 0.75  # the failed request met no SLO
    with pytest.raises(client.PointAborted, match=r"^more than 50% of the requests failed \(3 of 4: 3 x HTTP 503"):
        check_failures([{**failed}] * 3 + [rows[0]])
    with pytest.raises(client.PointAborted, match=r"^every request failed \(2 of 2: 2 x HTTP 503: overloaded\)$"):
        check_failures([failed, failed])


def test_a_request_past_its_deadline_fails_alone_and_more_than_half_failing_stops_the_point_at_once(standin):
    slow = {"prompt 1"}
    server = standin(lambda body: [("sleep", 5.0)] + answer() if body["messages"][0]["content"] in slow else answer())
    responses = client.run(server.url, requests(4, timeout_s=0.5), model="m", concurrency=4)
    assert [r.error for r in responses] == [None, "timed out after 0.5 s (server.request_timeout_s)", None, None]
    slow.update({"prompt 0", "prompt 2", "prompt 3", "prompt 4", "prompt 5"})
    patient = [client.Request(r.index, r.messages, 0.0, 1.0, 8, 0, timeout_s=0.5 if r.index < 4 else 30.0)
               for r in requests(6)]
    started = time.monotonic()
    with pytest.raises(client.PointAborted, match=r"^more than 50% of the requests failed \(4 of 6 so far: 4 x timed "
                                                  r"out after 0.5 s") as aborted:
        client.run(server.url, patient, model="m", concurrency=6)
    assert time.monotonic() - started < 3.0 and not aborted.value.engine_unusable  # not waiting for the other two


def test_a_silent_engine_is_asked_whether_it_hung_and_the_point_deadline_stops_the_rest(standin):
    server = standin(lambda body: [("sleep", 30.0)] + answer())
    asked = []

    async def hung(silent_s: float) -> str | None:
        asked.append(silent_s)
        return "no byte for a while: the engine is hung"

    limits = client.Limits(hung=hung, stall_s=0.6)
    with pytest.raises(client.PointAborted, match=r"^no byte for a while: the engine is hung, with 2 requests in "
                                                  r"flight$") as aborted:
        client.run(server.url, requests(2), model="m", concurrency=2, limits=limits)
    assert aborted.value.engine_unusable and asked and asked[0] >= 0.6
    deadline = client.Limits(deadline=time.monotonic() + 0.8, point_timeout_s=0.8)
    with pytest.raises(client.PointAborted, match=r"^the point's deadline of 0.8 s passed \(server.point_timeout_s\) "
                                                  r"with 3 of 3 requests unfinished$"):
        client.run(server.url, requests(3), model="m", concurrency=1, limits=deadline)


@pytest.mark.alone  # the unstalled run must send within 5 ms of every arrival: nothing beside it
def test_a_client_stalled_on_purpose_records_its_lateness_and_its_point_is_flagged(standin):
    server = standin(lambda body: answer())
    arrivals = client.arrival_times(12, request_rate=20.0, burstiness=1.0, seed=1)

    async def stalled() -> list[client.Response]:
        # the client's event loop blocked for 150 ms just before request 5 is due: it and every request due meanwhile
        # go late, then all at once
        asyncio.get_running_loop().call_later(arrivals[5] - 0.02, time.sleep, 0.15)
        return await client.run_load(server.url, requests(12), model="m", arrivals_s=arrivals)

    spec = PointSpec.baseline(0.0, 1.0, request_rate=20.0)
    rows = rows_of(spec, asyncio.run(stalled()))
    lateness = [row["send_lateness_ms"] for row in rows]
    assert lateness[5] > 100 and min(lateness) >= 0
    point = summary.summarize([spec], pd.DataFrame(rows), failures={}, context={}).iloc[0]
    assert point["send_lateness_ms_p99"] > 50 and point["unstable"]
    assert "the client sent requests late of their arrival times (p99" in point["unstable_reason"]
    assert point["achieved_request_rate"] == pytest.approx(20.0, rel=0.05)  # the last on time: the rate cannot see it
    on_time = rows_of(spec, client.run_open_loop(server.url, requests(12), arrivals, model="m"))
    assert max(row["send_lateness_ms"] for row in on_time) < summary.LATENESS_LIMIT_MS


def test_ttft_counts_the_first_reasoning_token_and_the_answer_is_timed_apart(standin):
    script = [chunk(reasoning="Let me think."), ("sleep", 0.3), chunk(reasoning=" Yes."), ("sleep", 0.3),
              chunk(content="Paris."), chunk(finish="stop"),
              ("data", {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7,
                                                  "completion_tokens_details": {"reasoning_tokens": 5}}})]
    server = standin(lambda body: script)
    spec = PointSpec.baseline(0.0, 1.0)
    row = rows_of(spec, client.run(server.url, requests(1), model="m", concurrency=1))[0]
    assert row["ttft_ms"] < 250 and row["first_content_ms"] >= 550  # the first token, not the first answer token
    assert row["reasoning_tokens"] == 5 and len(row["itl_ms"]) == 2
    plain = rows_of(spec, client.run(standin(lambda body: answer()).url, requests(1), model="m", concurrency=1))[0]
    assert plain["first_content_ms"] == plain["ttft_ms"] and plain["reasoning_tokens"] == 0


def test_unreadable_metrics_fall_back_and_llama_cpp_responses_without_draft_counts_drafted_nothing(standin):
    server = standin(lambda body: answer(), metrics="llamacpp:spec_decode_num_drafts{ this is not prometheus\n")
    assert counters(server.url, "llamacpp:", None) is None  # not a failed point
    spec = PointSpec("ngram-g3-t0-p1", "ngram", "ngram", 3, 0.0, 1.0)
    drafted = client.Response(0, 0.0, chunk_times_s=[0.1], text="a", end_s=0.2, usage={"completion_tokens": 4},
                              timings={"draft_n": 6, "draft_n_accepted": 3})
    nothing = client.Response(1, 0.0, chunk_times_s=[0.1], text="b", end_s=0.2, usage={"completion_tokens": 4},
                              timings={"predicted_n": 4})  # llama.cpp omits draft_n where it drafted nothing
    failed = client.Response(2, 0.0, error="HTTP 500: boom")
    rows = rows_of(spec, [drafted, nothing, failed])
    assert [(r["drafted_tokens"], r["accepted_tokens"]) for r in rows] == [(6, 3), (0, 0), (None, None)]
    measured = point_measurements(None, None, rows, peak_mb=None)
    assert (measured["acceptance_source"], measured["engine_draft_tokens"], measured["engine_accepted_tokens"]) == \
        ("responses", 6.0, 3.0)
    moved = point_measurements(SpecCounters(1, 3, 1, ()), SpecCounters(4, 12, 6, ()), rows, peak_mb=None)
    assert (moved["acceptance_source"], moved["engine_draft_tokens"]) == ("metrics", 9.0)
    baseline = rows_of(PointSpec.baseline(0.0, 1.0), [nothing])[0]
    assert baseline["drafted_tokens"] is None


def test_vllms_per_request_acceptance_is_each_rows_own_and_the_points_measured_requests(standin):
    # the final chunk of a response from vLLM with --per-request-spec-decode-metrics detailed: 4 verify steps that
    # proposed 3, 3, 2 and 1 tokens (n-gram lookup proposes fewer where its match is short) and accepted 3, 1, 0, 1
    final = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 10}, "metrics": {
        "speculative_decoding": {"mean_acceptance_length": 2.25, "draft_acceptance_rate": 5 / 9,
                                 "acceptance_histogram": [1, 2, 0, 1], "num_spec_steps": 4,
                                 "num_accepted_draft_tokens": 5, "num_draft_tokens": 9, "num_spec_tokens": 3,
                                 "per_step_accepted": [3, 1, 0, 1], "per_step_drafted": [3, 3, 2, 1]}}}
    server = standin(lambda body: answer(usage=False) + [("data", final)])
    spec = PointSpec("ngram-g3-t0-p1", "ngram", "ngram", 3, 0.0, 1.0)
    rows = rows_of(spec, client.run(server.url, requests(2), model="m", concurrency=1))
    for row in rows:
        assert (row["drafted_tokens"], row["accepted_tokens"]) == (9, 5)
        assert row["accepted_per_position"] == [3, 1, 1]  # steps that accepted more than 0, 1, 2 tokens
        assert row["drafted_per_position"] == [4, 3, 2]  # steps that proposed more than 0, 1, 2
    # the measured requests' own, preferred to the counters (which also count the warm-up, lead-in and tail)
    measured = point_measurements(SpecCounters(0, 0, 0, ()), SpecCounters(20, 60, 30, (12, 10, 8)), rows,
                                  peak_mb=None)
    assert (measured["acceptance_source"], measured["engine_drafts"], measured["engine_draft_tokens"],
            measured["engine_accepted_tokens"], measured["engine_accepted_per_position"]) == \
        ("requests", 8.0, 18.0, 10.0, [6.0, 2.0, 2.0])
    # the histogram alone (--per-request-spec-decode-metrics summary) says what was accepted per position, not
    # what was proposed there: the point takes the counters then, never a guess
    summary_only = {k: v for k, v in final["metrics"]["speculative_decoding"].items() if not k.startswith("per_step")}
    row = rows_of(spec, [client.Response(0, 0.0, chunk_times_s=[0.1], text="a", end_s=0.2,
                                         usage={"completion_tokens": 10}, spec_decoding=summary_only)])[0]
    assert (row["accepted_per_position"], row["drafted_per_position"], row["drafted_tokens"]) == ([3, 1, 1], None, 9)
    assert point_measurements(SpecCounters(0, 0, 0, ()), SpecCounters(4, 9, 5, ()), [row],
                              peak_mb=None)["acceptance_source"] == "metrics"
    baseline = rows_of(PointSpec.baseline(0.0, 1.0), [client.Response(0, 0.0, chunk_times_s=[0.1], text="a", end_s=0.2,
                                                                     usage={"completion_tokens": 10},
                                                                     spec_decoding=summary_only)])[0]
    assert (baseline["drafted_tokens"], baseline["accepted_per_position"]) == (None, [])


def test_keep_alive_reuses_connections_where_the_server_keeps_them(standin):
    server = standin(lambda body: answer())
    client.run(server.url, requests(8), model="m", concurrency=2, keep_alive=True)
    kept = len(set(server.peers))
    server.peers.clear()
    client.run(server.url, requests(8), model="m", concurrency=2, keep_alive=False)
    assert kept == 2 and len(set(server.peers)) == 8


def test_arrivals_follow_vllms_schedule():
    times = client.arrival_times(8, request_rate=2.0, burstiness=1.0, seed=0)
    assert times[0] > 0 and times[-1] == pytest.approx(8 / 2.0) and times == sorted(times)
    assert client.arrival_times(1, request_rate=2.0, burstiness=1.0, seed=0) == pytest.approx([0.5])


def test_default_deadlines_come_from_the_workload():
    assert watch.request_timeout_s(None, 64) == 124.0 and watch.request_timeout_s(30.0, 64) == 30.0
    assert watch.point_timeout_s(None, timeouts=[124.0] * 8, concurrency=4, request_rate=None, warmup=4) == 3 * 124.0
    assert watch.point_timeout_s(None, timeouts=[124.0] * 8, concurrency=None, request_rate=2.0, warmup=1) == \
        124.0 + 4.0 + 124.0
    assert watch.point_timeout_s(90.0, timeouts=[124.0], concurrency=1, request_rate=None, warmup=1) == 90.0


def test_what_specbench_chooses_or_fills_in_is_refused_up_front_in_one_line():
    checks.check_command(("llama-server", "-m", "{target}", "--port", "{port}", "{{literal}}"), "p.toml: ")
    with pytest.raises(ProfileError) as error:
        checks.check_command(("llama-server", "-m", "{target}", "--alias", "{nope}"), "p.toml: ")
    assert str(error.value) == ("p.toml: server.command: unknown placeholder {nope} in '{nope}'; the known placeholders "
                                "are {target}, {draft}, {host}, {port} (write {{ and }} for literal braces)")
    for args, flag in ((("-t", "2", "--port", "8080"), "--port"), (("--host=0.0.0.0",), "--host")):
        with pytest.raises(ProfileError) as error:
            checks.check_extra_args(args, "p.toml: ")
        assert str(error.value) == (f"p.toml: server.extra_args: {flag} is chosen by specbench (it launches the engine "
                                    "on 127.0.0.1 and a free port); remove it, or start the server yourself and set "
                                    "server.url")


def test_the_served_context_is_the_models_or_the_engines_flags():
    assert checks.served_window("vllm", (), 8192) == (8192, "the target's max_position_embeddings")
    assert checks.served_window("vllm", ("--max-model-len", "1024"), 8192) == (1024, "--max-model-len 1024 in "
                                                                                     "server.extra_args")
    assert checks.served_window("vllm", ("--max-model-len=99999",), 8192)[0] == 8192
    assert checks.served_window("sglang", ("--context-length", "512"), None) == (512, "--context-length 512 in "
                                                                                       "server.extra_args")
    # llama.cpp: -c shared by the -np slots (measured: -c 0 -np 4 gives each slot the model's whole window)
    assert checks.served_window("llama.cpp", ("-t", "2", "-np", "4"), 8192)[0] == 8192
    assert checks.served_window("llama.cpp", ("-c", "4096", "-np", "4"), 8192) == (
        1024, "-c 4096 shared by -np 4 slots in server.extra_args")
    assert checks.served_window("llama.cpp", ("--ctx-size", "4096", "-np", "4", "-kvu"), 8192)[0] == 4096
    assert checks.model_window("builtin:smollm2-135m-instruct") == 8192


def test_a_leftover_engine_of_this_folder_is_ended_and_a_running_launchers_is_not(tmp_path):
    def planted(owner: subprocess.Popen | None) -> subprocess.Popen:
        engine = subprocess.Popen(["sleep", "60"], start_new_session=True)
        owner_pid = owner.pid if owner is not None else engine.pid + 100000  # a launcher that is gone
        record = {"owner_pid": owner_pid, "owner_start": start_time(owner.pid) if owner else 1, "pgid": engine.pid,
                  "started": start_time(engine.pid), "argv": ["sleep", "60"], "log": "server-logs/01.log"}
        (tmp_path / f".engine-{owner_pid}.json").write_text(json.dumps(record))
        return engine

    live_owner = subprocess.Popen(["sleep", "60"])
    kept, orphan = planted(live_owner), planted(None)
    stale = {"owner_pid": 1 << 22, "owner_start": 1, "pgid": orphan.pid, "started": 1, "argv": ["x"], "log": "l"}
    (tmp_path / ".engine-4194304.json").write_text(json.dumps(stale))  # pid reused: another start time
    try:
        ended = end_leftovers(tmp_path)
        assert [e["pid"] for e in ended] == [orphan.pid] and ended[0]["argv"] == ["sleep", "60"]
        assert orphan.wait(5) == -signal.SIGKILL and kept.poll() is None
        assert sorted(p.name for p in tmp_path.iterdir()) == [f".engine-{live_owner.pid}.json"]
    finally:
        for process in (kept, orphan, live_owner):
            process.kill()
            process.wait()


def test_warm_up_sends_no_measured_prompt_but_one_of_about_their_length():
    from specbench.backends.server.measure import warmup_requests
    from specbench.models.load import load_tokenizer
    from specbench.workloads.prompts import load_prompts

    tokenizer, _ = load_tokenizer("builtin:smollm2-135m-instruct")
    prompts = load_prompts("builtin:mixed", max_prompts=8, categories=None)
    lengths = [len(tokenizer.apply_chat_template(p.messages, add_generation_prompt=True)) for p in prompts]
    session = SimpleNamespace(tokenizer=tokenizer, prompt_tokens=lengths, profile=SimpleNamespace(run=SimpleNamespace(seed=0)),
                              workload=SimpleNamespace(ignore_eos=False))
    measured = [client.Request(i, p.messages, 0.0, 1.0, 16 + i, i, timeout_s=70.0) for i, p in enumerate(prompts)]
    warmup = warmup_requests(session, PointSpec.baseline(0.0, 1.0, concurrency=4), measured, 4)
    texts = [r.messages[0]["content"] for r in warmup]
    assert len(set(texts)) == 4 and not {t for t in texts} & {m["content"] for p in prompts for m in p.messages}
    assert len({t[:20] for t in texts}) == 4  # no two share a prefix a cache could reuse
    sent = sorted(len(tokenizer.apply_chat_template(r.messages, add_generation_prompt=True)) for r in warmup)
    median = sorted(lengths)[len(lengths) // 2]
    assert all(abs(n - median) <= 0.2 * median + 10 for n in sent), (sent, median)
    assert [r.max_tokens for r in warmup] == [16, 17, 18, 19] and all(r.timeout_s == 70.0 for r in warmup)


def test_an_engines_mean_accepted_length_counts_every_target_pass_not_only_those_that_drafted():
    from specbench.core.summary import engine_acceptance

    ngram = PointSpec("ngram-g3-t0-p1", "ngram", "ngram", 3, 0.0, 1.0, ngram_min=1, ngram_max=3)
    counters = {"acceptance_source": "metrics", "engine_drafts": 20.0, "engine_draft_tokens": 60.0}
    # 90 tokens after the prefills, 30 of them accepted drafts: 60 passes, of which only 20 had a draft
    figures = engine_acceptance({**counters, "engine_accepted_tokens": 30.0}, ngram, decode_tokens=90)
    assert figures["mean_accepted_length"] == 1.5 and figures["acceptance_rate"] == 0.5
    # a self-draft accepting everything, its last pass cut by max_tokens: accepted 60 counted, 75 sent; 20 passes
    figures = engine_acceptance({**counters, "engine_accepted_tokens": 60.0}, ngram, decode_tokens=75)
    assert figures["mean_accepted_length"] == 75 / 20
    assert engine_acceptance({**counters, "engine_accepted_tokens": 0.0}, ngram, decode_tokens=90)[
        "mean_accepted_length"] == 1.0

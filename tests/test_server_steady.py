"""Steady-state points (backends/server/steady.py) against the stand-in HTTP server of test_server_client.py (pure
client behaviour): requests of the lead-in are sent and not measured, the window's are, the tail keeps the load up
until the last measured request finished and is then cancelled; phases follow the scheduled arrivals (open loop) or
the send times (closed loop); only measured requests' failures can fail the point."""

from __future__ import annotations

import dataclasses
import itertools
import time

from test_server_client import answer, standin  # noqa: F401 - the fixture

from specbench.backends.server import client
from specbench.backends.server.steady import LEAD_IN, TAIL, WINDOW, Window, gamma_arrivals, run_steady


def make_request(index: int) -> client.Request:
    return client.Request(index, [{"role": "user", "content": f"prompt {index}"}], 0.0, 1.0, 8, index, timeout_s=30.0)


def slow(seconds: float):
    return lambda body: [("sleep", seconds)] + answer()


def test_a_request_is_in_the_lead_in_the_window_or_the_tail_by_when_it_is_sent():
    window = Window(lead_in_s=2.0, window_s=3.0, at_least=4)
    assert window.phase(1.9, 0) == LEAD_IN
    assert window.phase(2.0, 0) == WINDOW and window.phase(4.9, 10) == WINDOW
    assert window.phase(5.0, 4) == TAIL
    assert window.phase(7.0, 3) == WINDOW  # the window stays open until at least 4 were sent
    assert Window(at_least=2).phase(0.0, 2) == TAIL  # no lead-in, no duration: a count


def test_open_loop_phases_follow_the_scheduled_arrivals_and_the_tail_ends_with_the_last_measured_request(standin):
    server = standin(slow(0.4))
    window = Window(lead_in_s=0.3, window_s=0.5, at_least=3)
    arrivals = list(itertools.islice(gamma_arrivals(request_rate=20.0, burstiness=1.0, seed=7), 400))
    result = run_steady(server.url, make_request, window, model="m", arrivals_s=iter(arrivals))
    expected, measured = [], 0
    for at in arrivals:  # the same rule, replayed on the schedule
        phase = window.phase(at, measured)
        if phase == TAIL:
            break
        expected.append(phase)
        measured += phase == WINDOW
    sent_before_tail = [result.phases[i] for i in sorted(result.phases) if result.phases[i] != TAIL]
    assert sent_before_tail == expected and result.lead_in == expected.count(LEAD_IN) > 0
    assert len(result.responses) == expected.count(WINDOW) >= 3
    assert all(r.error is None and 0.3 <= r.scheduled_s for r in result.responses)
    assert all(r.scheduled_s < 0.8 for r in result.responses[:-1])
    # the tail kept arriving while the last measured request ran (0.4 s at 20/s: ~8), and nothing after it
    last_end = max(r.scheduled_s + r.end_s for r in result.responses)
    tail = [arrivals[i] for i, phase in result.phases.items() if phase == TAIL]
    assert tail and max(tail) <= last_end + 0.05
    assert result.cancelled <= result.lead_in + result.tail


def test_closed_loop_keeps_its_concurrency_through_the_window_and_measures_what_is_sent_in_it(standin):
    server = standin(slow(0.1))
    result = run_steady(server.url, make_request, Window(lead_in_s=0.25, window_s=0.4, at_least=2), model="m",
                        concurrency=3)
    # the first three go out at once, in the lead-in; the window measures what was sent from 0.25 s to 0.65 s, or
    # after that while fewer than two were (a busy machine can stretch the lead-in's 0.1 s requests past the window:
    # CI met one where the first window request went out at 0.98 s); the tail keeps the other slots busy meanwhile
    assert result.lead_in >= 3 and len(result.responses) >= 2 and result.tail >= 1
    starts = sorted(r.start_s for r in result.responses)
    assert starts[0] >= 0.25 and (len(starts) <= 2 or all(start < 0.65 for start in starts))
    # never more than three in flight among the measured ones
    assert all(sum(r.start_s <= start < r.start_s + r.end_s for r in result.responses) <= 3 for start in starts)
    # a tail request cancelled as it was sent may never reach the server
    assert result.lead_in + len(result.responses) <= len(server.bodies) <= result.lead_in + len(result.responses) + result.tail


def test_requests_still_in_flight_when_the_last_measured_one_finishes_are_cancelled(standin):
    # the lead-in's and the tail's requests take 20 s, the measured one 0.5 s: the point ends with it, not 20 s later
    server = standin(lambda body: [("sleep", 20.0 if body["messages"][0]["content"] != "prompt 3" else 0.5)]
                     + answer())
    started = time.monotonic()
    result = run_steady(server.url, make_request, Window(lead_in_s=0.3, at_least=1), model="m",
                        arrivals_s=iter([0.0, 0.1, 0.2, 0.35, 0.5, 0.6, 30.0]))
    assert time.monotonic() - started < 10  # liveness: it does not wait for the lead-in's 20 s
    assert [r.index for r in result.responses] == [3] and result.responses[0].error is None
    assert result.lead_in == 3 and result.tail == 2 and result.cancelled == 5


def test_failed_lead_in_requests_do_not_fail_the_point_but_failed_measured_ones_do(standin):
    first_four = {f"prompt {i}" for i in range(4)}
    server = standin(lambda body: [("status", 503)] if body["messages"][0]["content"] in first_four else answer())
    # without a lead-in they are measured (a point with them fails after its requests: measure.check_failures)
    result = run_steady(server.url, make_request, Window(at_least=8), model="m", concurrency=1)
    assert [r.error is not None for r in result.responses] == [True] * 4 + [False] * 4
    arrivals = iter([0.0, 0.01, 0.02, 0.03, 0.5, 0.6, 0.7, 5.0])  # the four failing ones in the lead-in
    result = run_steady(server.url, make_request, Window(lead_in_s=0.3, at_least=3), model="m", arrivals_s=arrivals,
                        limits=client.Limits(fail_share=0.1))
    assert result.lead_in == 4 and [r.error for r in result.responses] == [None] * 3


def test_a_steady_point_draws_its_prompts_the_same_for_every_configuration_at_a_level(standin):
    from types import SimpleNamespace

    from specbench.backends.server.measure import steady_point
    from specbench.core.results import PointSpec
    from test_load import session_of

    server = standin(slow(0.05))
    session = session_of(6)
    profile = session.profile
    session.profile = profile.model_copy(update={"load": profile.load.model_copy(update={"lead_in_s": 0.2})})
    session.request_timeout_s = lambda budget: 30.0
    session.workload = SimpleNamespace(max_new_tokens=[8] * len(session.prompts), ignore_eos=False)
    call = dict(model="m", api_key=None, keep_alive=True, limits=client.Limits())

    def measured(spec: PointSpec) -> tuple[list, dict]:
        recorded = []
        columns = steady_point(session, spec, url=server.url, call=call,
                               record=lambda response, prompt, repeat, seed: recorded.append(
                                   (response.index, prompt.prompt_id, repeat, seed)))
        return recorded, columns

    baseline, columns = measured(PointSpec.baseline(0.0, 1.0, request_rate=20.0))
    draft, _ = measured(dataclasses.replace(PointSpec.baseline(0.0, 1.0, request_rate=20.0), point_id="ngram-g3-r20",
                                            method="ngram", draft="ngram", gamma=3))
    assert len(baseline) == 6 and columns["lead_in_requests"] > 0 and columns["window_s"] > 0
    # the same requests (index, prompt) at the same level for both configurations; each prompt's repeats count its
    # measured requests, so request ids are unique within the point
    assert [(i, p) for i, p, _, _ in baseline] == [(i, p) for i, p, _, _ in draft]
    assert len({(p, r) for _, p, r, _ in baseline}) == 6
    # the prompts taken round and round: any 4 consecutive requests (4 prompts) hold each prompt once
    prompts = [p for _, p, _, _ in baseline]
    assert all(len(set(prompts[i:i + 4])) == 4 for i in range(len(prompts) - 3))
    other, _ = measured(PointSpec.baseline(0.0, 1.0, request_rate=10.0))
    assert [p for _, p, _, _ in other] != [p for _, p, _, _ in baseline]  # another level, another draw

"""Steady-state load: a point measured once the engine is loaded, while it stays loaded. Requests are sent at the
point's load (arrival times, or a concurrency) from the start; those sent during a lead-in are not measured (the
engine's ramp-up from idle), those sent in the measured window are (at least `at_least` of them: the window stays
open until that many were sent), and after the window the same load goes on — the tail — until every measured request
finished, so that none of them is measured while the engine drains. Then whatever is still in flight is cancelled.

A request's phase is decided when it is sent — at its scheduled arrival (open loop: the same for every configuration
at one level) or when a worker takes it (closed loop) — so attainment, goodput and throughput count the requests that
arrive in the window, as GuideLLM and AIPerf count theirs."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import aiohttp
import numpy as np

from specbench.backends.server.client import KEEPALIVE_S, Limits, Request, Response, attempt, InFlight, supervise

LEAD_IN, WINDOW, TAIL = "lead-in", "window", "tail"


@dataclass(frozen=True, kw_only=True)
class Window:
    """Which requests of a point are measured: those sent after `lead_in_s` and before `lead_in_s + window_s`, and
    until at least `at_least` were (the window stays open for them)."""

    lead_in_s: float = 0.0
    window_s: float = 0.0
    at_least: int = 1

    def phase(self, at_s: float, measured: int) -> str:
        """The phase of a request sent `at_s` seconds after the point started, `measured` requests of the window
        having been sent before it."""
        if at_s < self.lead_in_s:
            return LEAD_IN
        if at_s < self.lead_in_s + self.window_s or measured < self.at_least:
            return WINDOW
        return TAIL


@dataclass
class SteadyResult:
    """The measured requests' responses (in the order they were sent), and how many requests the lead-in and the
    tail sent around them (cancelled ones included: `cancelled` of them were still in flight at the end)."""

    responses: list[Response]
    lead_in: int = 0
    tail: int = 0
    cancelled: int = 0
    window_s: float | None = None  # from the first measured request's send (or arrival) to the last's
    phases: dict[int, str] = field(default_factory=dict)  # every request sent, by index


def gamma_arrivals(*, request_rate: float, burstiness: float, seed: int) -> Iterator[float]:
    """Arrival times (seconds after the point starts) of a seeded renewal process without end: gamma-distributed
    gaps of shape `burstiness` (1: Poisson) and mean 1 / request_rate, the first before the first request. Unlike
    `client.arrival_times`, not rescaled to a count: a steady window is a duration."""
    rng = np.random.default_rng(seed)
    at = 0.0
    while True:
        for gap in rng.gamma(burstiness, 1.0 / (request_rate * burstiness), size=256):
            at += float(gap)
            yield at


def run_steady(url: str, make_request: Callable[[int], Request], window: Window, *, model: str,
               arrivals_s: Iterator[float] | None = None, concurrency: int | None = None, api_key: str | None = None,
               keep_alive: bool = True, limits: Limits = Limits()) -> SteadyResult:
    """A steady-state point: `make_request(i)` is the i-th request sent (0, 1, ...; its index i), sent at the i-th of
    `arrivals_s` (open loop) or as soon as one of `concurrency` requests in flight finishes (closed loop). Raises
    `client.PointAborted` when the point stops early (the engine exited or hung, more than `limits.fail_share` of the
    measured requests failed, the deadline passed)."""
    if (arrivals_s is None) == (concurrency is None):
        raise ValueError("give arrival times (open loop) or a concurrency (closed loop)")
    return asyncio.run(_steady(url, make_request, window, model=model, arrivals_s=arrivals_s,
                               concurrency=concurrency, api_key=api_key, keep_alive=keep_alive, limits=limits))


class _Point:
    """What the senders share: the phases so far, the measured requests in flight, and when the point is done (the
    window closed and every measured request finished)."""

    def __init__(self, window: Window):
        self.window = window
        self.phases: dict[int, str] = {}
        self.sent_at: dict[int, float] = {}
        self.measured: list[Response] = []
        self.measuring = 0  # measured requests in flight
        self.others_finished = 0  # lead-in and tail requests that finished (not cancelled)
        self.closed = False  # the window: no request sent from now on is measured
        self.done = asyncio.Event()
        self.tasks: set[asyncio.Task] = set()

    @property
    def window_sent(self) -> int:
        return sum(1 for phase in self.phases.values() if phase == WINDOW)

    def take(self, index: int, at_s: float) -> str | None:
        """The phase of request `index` sent at `at_s`, or None where nothing is to be sent any more."""
        phase = self.window.phase(at_s, self.window_sent)
        if phase == TAIL:
            self.close()
        if self.done.is_set():
            return None
        self.phases[index], self.sent_at[index] = phase, at_s
        if phase == WINDOW:
            self.measuring += 1
        return phase

    def close(self) -> None:
        self.closed = True
        if self.measuring == 0:
            self.done.set()

    def finished(self, response: Response, phase: str) -> None:
        if phase != WINDOW:
            self.others_finished += 1
            return
        self.measured.append(response)
        self.measuring -= 1
        if self.closed and self.measuring == 0:
            self.done.set()


async def _steady(url: str, make_request: Callable[[int], Request], window: Window, *, model: str,
                  arrivals_s: Iterator[float] | None, concurrency: int | None, api_key: str | None, keep_alive: bool,
                  limits: Limits) -> SteadyResult:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    connector = aiohttp.TCPConnector(limit=concurrency or 0, force_close=not keep_alive,
                                     keepalive_timeout=KEEPALIVE_S if keep_alive else None)
    state = InFlight(window.at_least)  # the supervisor's: failures of measured requests against at least at_least
    point = _Point(window)
    origin = time.perf_counter()
    indices = itertools.count()

    def now_s() -> float:
        return time.perf_counter() - origin

    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        async def send(index: int, phase: str, scheduled_s: float | None) -> None:
            response = await attempt(session, url, make_request(index), model=model, origin=origin, headers=headers,
                                      state=state, scheduled_s=scheduled_s, counted=phase == WINDOW)
            state.total = max(window.at_least, point.window_sent)
            point.finished(response, phase)

        async def open_loop() -> None:
            for index, at_s in zip(indices, arrivals_s):
                # the window closes at the first arrival past it: known ahead, so the point ends when its measured
                # requests do, not at the next arrival
                if window.phase(at_s, point.window_sent) == TAIL:
                    point.close()
                try:  # sleep until the arrival, or until the point is done
                    await asyncio.wait_for(point.done.wait(), max(0.0, at_s - now_s()))
                    return
                except asyncio.TimeoutError:
                    pass
                phase = point.take(index, at_s)
                if phase is None:
                    return
                task = asyncio.ensure_future(send(index, phase, at_s))
                point.tasks.add(task)
                task.add_done_callback(point.tasks.discard)
            point.close()  # no arrival is left: the window ends with the requests it has

        async def worker() -> None:
            while not point.done.is_set():
                index = next(indices)
                phase = point.take(index, now_s())
                if phase is None:
                    return
                await send(index, phase, None)

        senders = [asyncio.ensure_future(open_loop())] if arrivals_s is not None else \
            [asyncio.ensure_future(worker()) for _ in range(concurrency)]
        work = asyncio.ensure_future(point.done.wait())
        aborted = await supervise(work, state, limits)
        for task in [*senders, *point.tasks, work]:
            task.cancel()
        await asyncio.gather(*senders, *list(point.tasks), work, return_exceptions=True)
        if aborted is not None:
            raise aborted
    phases = point.phases
    measured_at = [point.sent_at[r.index] for r in point.measured]
    return SteadyResult(sorted(point.measured, key=lambda r: r.index),
                        lead_in=sum(1 for p in phases.values() if p == LEAD_IN),
                        tail=sum(1 for p in phases.values() if p == TAIL),
                        cancelled=len(phases) - len(point.measured) - point.others_finished,
                        window_s=max(measured_at) - min(measured_at) if measured_at else None, phases=dict(phases))

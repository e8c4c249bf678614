"""The load generator: streaming OpenAI-compatible chat completions from one asyncio client, with exactly
`concurrency` requests in flight (closed loop), or sent at scheduled arrival times whatever the server's state
(open loop). Per request it keeps what was observed on the wire (`stream.py`): when the request was sent (and, open
loop, when it was due), when each chunk of tokens arrived, what the server reported — or why the request failed.

A failed request is data, not the end of the point: it fails alone (its error kept), and the point stops early only
when the engine exited or hung, more than half its requests failed, or its deadline passed (`PointAborted`)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from specbench.backends.server.stream import Request, RequestFailed, Response, payload, stream_response

__all__ = ["PointAborted", "Request", "RequestFailed", "Response", "Limits", "InFlight", "arrival_times", "attempt",
           "describe_errors", "payload", "run", "run_open_loop", "supervise", "get_json", "get_text", "answers"]

# Pooled connections idle at most this long. llama-server and uvicorn (vLLM, SGLang) close a kept-alive connection
# after 5 s idle; a pooled connection the server already closed fails the next request written on it.
KEEPALIVE_S = 4.0
STALL_S = 30.0  # no byte from the server for this long with requests in flight: ask whether the engine is hung
# A stopped engine (SIGSTOP, a debugger) does no work whatever it was doing, so it is not given STALL_S: after this
# long without a byte it is looked at once a second (`Limits.stopped`).
STOPPED_S = 5.0


class PointAborted(RuntimeError):
    """The point stopped before its requests finished. `engine_unusable`: the engine exited, hung, or outlived the
    point's deadline, and must be killed (and launched again for the next point)."""

    def __init__(self, message: str, *, engine_unusable: bool):
        super().__init__(message)
        self.engine_unusable = engine_unusable


@dataclass(frozen=True)
class Limits:
    """How long a point may run, and what tells a dead or hung engine (`watch`: None where nothing is known)."""

    deadline: float | None = None  # time.monotonic() by which the point must be done
    point_timeout_s: float | None = None  # the setting behind the deadline, for the message
    exited: Callable[[], str | None] | None = None  # why the engine is gone, or None while it runs
    # every `stall_s` of silence: why it is hung after `s` silent seconds (the whole silence), or None while working
    hung: Callable[[float], Awaitable[str | None]] | None = None
    fail_share: float = 0.5  # more than this share of the requests failed: the point fails
    stall_s: float = STALL_S
    # every second of a silence past `stopped_s`: why the engine is hung because it is stopped, or None (cheap: /proc)
    stopped: Callable[[float], str | None] | None = None
    stopped_s: float = STOPPED_S


class InFlight:
    """What the supervisor sees of the requests in flight."""

    def __init__(self, total: int):
        self.total, self.in_flight, self.finished = total, 0, 0
        self.errors: list[str] = []
        self.last_byte = self.last_asked = time.monotonic()  # the last byte; when `Limits.hung` last said "working"
        self.last_looked = 0.0  # when `Limits.stopped` was last asked

    def touch(self) -> None:
        self.last_byte = time.monotonic()


def describe_errors(errors: list[str], *, kinds: int = 3) -> str:
    """Errors grouped, the most frequent first: "3 x timed out after 124 s; 1 x HTTP 503: ..."."""
    counted = Counter(errors).most_common()
    text = "; ".join(f"{n} x {error}" for error, n in counted[:kinds])
    return text + (f"; and {len(counted) - kinds} other errors" if len(counted) > kinds else "")


async def attempt(session: aiohttp.ClientSession, url: str, request: Request, *, model: str, origin: float,
                   headers: dict[str, str], state: InFlight, scheduled_s: float | None = None,
                   counted: bool = True) -> Response:
    """One request within its deadline; a failure is recorded on its response, never raised (and, where it is
    `counted`, among the failures that may fail the point)."""
    response = Response(request.index, start_s=time.perf_counter() - origin, scheduled_s=scheduled_s)
    state.in_flight += 1
    try:
        await asyncio.wait_for(stream_response(session, url, request, response, model=model, headers=headers,
                                               on_bytes=state.touch), request.timeout_s)
    except asyncio.TimeoutError:
        response.error = f"timed out after {request.timeout_s:g} s (server.request_timeout_s)"
    except RequestFailed as error:
        response.error = str(error)
    except (aiohttp.ClientError, OSError, ValueError) as error:  # refused, reset, or a stream that is not JSON
        response.error = f"{type(error).__name__}: {str(error)[:200]}"
    finally:
        state.in_flight -= 1
        state.finished += 1
        state.touch()
    if response.error is not None and counted:
        state.errors.append(response.error)
    return response


async def supervise(work: asyncio.Future, state: InFlight, limits: Limits) -> PointAborted | None:
    """Wait for the point's requests; stop them (returns why) when the engine exits or hangs, when more than
    `fail_share` of them failed, or at the point's deadline."""
    while True:
        await asyncio.wait({work}, timeout=0.5)
        if work.done():
            return None
        now = time.monotonic()
        if limits.exited is not None and (gone := limits.exited()) is not None:
            return PointAborted(gone, engine_unusable=True)
        if len(state.errors) > limits.fail_share * state.total:
            return PointAborted(f"more than {limits.fail_share:.0%} of the requests failed ({len(state.errors)} of "
                                f"{state.total} so far: {describe_errors(state.errors)})", engine_unusable=False)
        if limits.deadline is not None and now > limits.deadline:
            return PointAborted(f"the point's deadline of {limits.point_timeout_s:g} s passed (server.point_timeout_s) "
                                f"with {state.total - state.finished} of {state.total} requests unfinished",
                                engine_unusable=True)
        silent_s = now - state.last_byte  # the whole silence, also across answers that it is working
        asked_s = now - max(state.last_byte, state.last_asked)
        looked_s = now - state.last_looked
        if state.in_flight and limits.stopped is not None and silent_s > limits.stopped_s and looked_s >= 1:
            state.last_looked = now
            if (reason := limits.stopped(silent_s)) is not None:
                return PointAborted(f"{reason}, with {state.in_flight} requests in flight", engine_unusable=True)
        if state.in_flight and limits.hung is not None and asked_s > limits.stall_s:
            reason = await limits.hung(silent_s)
            if reason is not None:
                return PointAborted(f"{reason}, with {state.in_flight} requests in flight", engine_unusable=True)
            state.last_asked = time.monotonic()  # working (a long prefill): ask again after another silent stretch


async def run_load(url: str, requests: list[Request], *, model: str, concurrency: int | None = None,
                   arrivals_s: list[float] | None = None, api_key: str | None = None, keep_alive: bool = True,
                   limits: Limits = Limits()) -> list[Response]:
    """All `requests`: at most `concurrency` in flight (a new one starts as soon as one finishes), or each sent at
    its arrival time (seconds after the start, `arrivals_s`) however many are in flight. Responses in request
    order, failed ones with their error; raises `PointAborted` when the point stops early."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    connector = aiohttp.TCPConnector(limit=concurrency or 0, force_close=not keep_alive,
                                     keepalive_timeout=KEEPALIVE_S if keep_alive else None)
    state = InFlight(len(requests))
    responses: list[Response] = []
    origin = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        call = dict(model=model, origin=origin, headers=headers, state=state)
        if arrivals_s is None:
            queue = list(reversed(requests))

            async def worker() -> None:
                while queue:
                    responses.append(await attempt(session, url, queue.pop(), **call))

            tasks = [worker() for _ in range(min(concurrency or 1, len(requests)))]
        else:
            async def send(request: Request, at_s: float) -> None:
                await asyncio.sleep(max(0.0, at_s - (time.perf_counter() - origin)))
                responses.append(await attempt(session, url, request, scheduled_s=at_s, **call))

            tasks = [send(request, at) for request, at in zip(requests, arrivals_s)]
        work = asyncio.ensure_future(asyncio.gather(*tasks))
        aborted = await supervise(work, state, limits)
        if aborted is not None:
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            raise aborted
        await work
    return sorted(responses, key=lambda r: r.index)


def arrival_times(count: int, *, request_rate: float, burstiness: float, seed: int) -> list[float]:
    """`count` arrival times (seconds after the point starts) of a seeded renewal process, as vLLM's benchmark client
    draws them: `count` gamma-distributed gaps of shape `burstiness` (1: Poisson), the first before the first
    request, scaled so the last arrives at exactly count / request_rate (a short draw strays from its rate by about
    1/sqrt(count); the shape of the gaps is kept). Every point of a level gets the same times."""
    import numpy as np

    if count < 1:
        return []
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (request_rate * burstiness), size=count)
    gaps *= count / request_rate / gaps.sum()
    return np.cumsum(gaps).tolist()


def run_open_loop(url: str, requests: list[Request], arrivals_s: list[float], *, model: str,
                  api_key: str | None = None, keep_alive: bool = True, limits: Limits = Limits()) -> list[Response]:
    return asyncio.run(run_load(url, requests, model=model, arrivals_s=arrivals_s, api_key=api_key,
                                keep_alive=keep_alive, limits=limits))


def run(url: str, requests: list[Request], *, model: str, concurrency: int, api_key: str | None = None,
        keep_alive: bool = True, limits: Limits = Limits()) -> list[Response]:
    return asyncio.run(run_load(url, requests, model=model, concurrency=concurrency, api_key=api_key,
                                keep_alive=keep_alive, limits=limits))


async def get_json(url: str, *, api_key: str | None = None, timeout_s: float = 5.0) -> object:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async with session.get(url, headers=headers) as http:
            http.raise_for_status()
            return await http.json(content_type=None)


async def get_text(url: str, *, api_key: str | None = None, timeout_s: float = 5.0) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async with session.get(url, headers=headers) as http:
            return http.status, await http.text()


async def answers(url: str, *, timeout_s: float) -> bool:
    """Whether anything answers `url` within `timeout_s` (any HTTP status: the server is alive)."""
    try:
        await get_text(url, timeout_s=timeout_s)
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
        return False
    return True

"""How long a request and a point may take on a server, and what tells an engine that exited or hung from one that
is only slow. Every wait has a deadline; the error says what was waited for and for how long.

- A request may take `server.request_timeout_s`; by default 60 s plus 1 s per token of its output budget (an
  engine slower than 1 token/s is not being benchmarked).
- A point may take `server.point_timeout_s`; by default as long as its requests could take if each used its whole
  deadline, in waves of its concurrency (at a request rate: the schedule, then one request's deadline) — a backstop.
- Faster than either: when no byte arrived for `client.STALL_S` with requests in flight, a launched engine whose
  processes are stopped (SIGSTOP), or that used no CPU time for 2 s while its /health did not answer, is hung; an
  attached one is hung when its /health does not answer. The point then fails at once and the engine is killed."""

from __future__ import annotations

import asyncio
import math
import time

from specbench.backends.server import client
from specbench.backends.server.process import ServerProcess, log_tail

REQUEST_BASE_S = 60.0
SLOWEST_TOKENS_PER_S = 1.0
HEALTH_TIMEOUT_S = 10.0
CPU_SAMPLE_S = 2.0


def request_timeout_s(configured: float | None, budget: int) -> float:
    """The most one request with an output budget of `budget` tokens may take."""
    return configured if configured is not None else REQUEST_BASE_S + budget / SLOWEST_TOKENS_PER_S


def point_timeout_s(configured: float | None, *, timeouts: list[float], concurrency: int | None,
                    request_rate: float | None, warmup: int) -> float:
    """The most a point may take: its warm-up and its requests, each using its whole deadline, in waves of the
    point's concurrency; at a request rate, warm-up one at a time, then the schedule and one request's deadline."""
    if configured is not None:
        return configured
    longest = max(timeouts, default=REQUEST_BASE_S)
    if request_rate is not None:
        return warmup * longest + len(timeouts) / request_rate + longest
    return math.ceil((len(timeouts) + warmup) / max(concurrency or 1, 1)) * longest


def limits(*, url: str, server: ServerProcess | None, point_timeout: float) -> client.Limits:
    """The load generator's limits for one point starting now, on a launched engine (`server`) or an attached one."""

    def exited() -> str | None:
        if server is None or server.alive():
            return None
        return (f"the server exited with code {server.exit_code()} during the point; log {server.log_path}: "
                f"{log_tail(server.log_path)}")

    async def hung(silent_s: float) -> str | None:
        waited = f"no byte from the server for {silent_s:.0f} s"
        if server is not None:
            stopped, ticks = server.progress()
            if stopped:
                return f"{waited} and its process is stopped (SIGSTOP?)"
            await asyncio.sleep(CPU_SAMPLE_S)
            if server.progress()[1] > ticks:
                return None  # computing: a long prefill or a deep queue, not a hang
        if await client.answers(f"{url}/health", timeout_s=HEALTH_TIMEOUT_S):
            return None
        idle = f", it used no CPU time for {CPU_SAMPLE_S:g} s" if server is not None else ""
        return f"{waited}{idle} and its /health did not answer within {HEALTH_TIMEOUT_S:g} s: the engine is hung"

    return client.Limits(deadline=time.monotonic() + point_timeout, point_timeout_s=point_timeout, exited=exited,
                         hung=hung)

"""How long a request and a point may take on a server, and what tells an engine that exited or hung from one that
is only slow. Every wait has a deadline; the error says what was waited for and for how long.

- A request may take `server.request_timeout_s`; by default 60 s plus 1 s per token of its output budget (an
  engine slower than 1 token/s is not being benchmarked).
- A point may take `server.point_timeout_s`; by default as long as its requests could take if each used its whole
  deadline, in waves of its concurrency (at a request rate: the schedule, then one request's deadline) — a backstop.
- Faster than either, when no byte arrived for `client.STALL_S` with requests in flight (`hang_reason`):
  - a launched engine whose processes are stopped (SIGSTOP) is hung — looked at sooner, once a second from
    `client.STOPPED_S` of silence on: stopped at two looks with no CPU time used between them;
  - one that used no CPU time for 2 s while its /health did not answer is hung (an attached one: its /health did
    not answer);
  - otherwise it may be computing (a long prefill on a CPU) or spinning on a deadlocked GPU, which uses CPU and may
    still answer /health: it is watched for `client.STALL_S` more, and is hung when over that window nothing it
    counts moved (`metrics.work_samples`: tokens, requests, KV blocks, drafts) and its log did not grow (vLLM logs
    its throughput every 10 s while it generates; llama.cpp each prompt batch and every few seconds of decoding).
    Access-log lines (specbench's own /health and /metrics requests, new arrivals) are not growth. An engine that
    shows either sign of work is asked again after another silent stretch; with neither signal to read (an attached
    engine without /metrics) only the rules above apply. A long prefill on a CPU shows one or the other — vLLM
    allocates KV blocks for each chunk of it, llama.cpp logs each prompt batch (2048 tokens of a 1.5B model: ~10-20 s
    on two cores); a /metrics that does not answer at all while the engine uses CPU is a main loop busy in one long
    step (llama-server serves it from that loop), not a hang.
  The point then fails at once and the engine is killed."""

from __future__ import annotations

import asyncio
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from specbench.backends.server import client
from specbench.backends.server.metrics import work_samples
from specbench.backends.server.process import ServerProcess, log_tail

REQUEST_BASE_S = 60.0
SLOWEST_TOKENS_PER_S = 1.0
HEALTH_TIMEOUT_S = 10.0
METRICS_TIMEOUT_S = 5.0
CPU_SAMPLE_S = 2.0
LOG_READ_BYTES = 65536  # of what the log gained over a window: enough to find a line that is not an access log's
# a line that logs an HTTP request (uvicorn's access log in vLLM and SGLang, llama-server's at a higher
# verbosity) says its front end accepts requests — specbench's own /health and /metrics probes, new arrivals —
# not that it works
ACCESS_LINE = re.compile(r"\b(GET|POST|PUT|DELETE|HEAD|OPTIONS) /")


def request_timeout_s(configured: float | None, budget: int) -> float:
    """The most one request with an output budget of `budget` tokens may take."""
    return configured if configured is not None else REQUEST_BASE_S + budget / SLOWEST_TOKENS_PER_S


def point_timeout_s(configured: float | None, *, timeouts: list[float], concurrency: int | None,
                    request_rate: float | None, warmup: int, lead_in_s: float = 0.0, window_s: float = 0.0) -> float:
    """The most a point may take: its warm-up and its requests, each using its whole deadline, in waves of the
    point's concurrency; at a request rate, warm-up one at a time, then the schedule and one request's deadline. In a
    steady state (`lead_in_s`, `window_s`: the measured requests `timeouts` at least), the lead-in and the window
    first: at a request rate, then the measured requests' schedule or the window, whichever is longer, and one
    request's deadline; at a concurrency, the lead-in's requests in flight, the window, and the measured requests in
    waves."""
    if configured is not None:
        return configured
    longest = max(timeouts, default=REQUEST_BASE_S)
    waves = max(concurrency or 1, 1)
    if lead_in_s > 0 or window_s > 0:
        if request_rate is not None:
            return warmup * longest + lead_in_s + max(window_s, len(timeouts) / request_rate) + longest
        return math.ceil(warmup / waves) * longest + lead_in_s + window_s + (math.ceil(len(timeouts) / waves) + 1) * longest
    if request_rate is not None:
        return warmup * longest + len(timeouts) / request_rate + longest
    return math.ceil((len(timeouts) + warmup) / waves) * longest


# --- signs of work over a window --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """What the engine showed at one moment. work: the samples of its /metrics that mean work, UNANSWERED (no answer
    within METRICS_TIMEOUT_S), or None (nothing to read: not Prometheus text, an error status, no such sample);
    log_bytes: its log's size (None: no log, an attached engine)."""

    taken_s: float  # time.monotonic()
    work: dict | str | None
    log_bytes: int | None


UNANSWERED = "unanswered"


@dataclass(frozen=True)
class Progress:
    """What moved over `window_s`. metrics: "moved", "unchanged", "unanswered" (at both ends) or None (nothing to
    read); log: "grew", "unchanged" or None (no log)."""

    window_s: float
    metrics: str | None
    log: str | None

    @property
    def moved(self) -> bool:
        return self.metrics == "moved" or self.log == "grew"

    @property
    def watched(self) -> bool:
        return self.metrics is not None or self.log is not None


def progress(before: Snapshot, after: Snapshot, *, appended: str | None) -> Progress:
    """What moved between two snapshots: the engine's work samples, and its log (`appended`: what it gained, None
    without a log), where an access-log line (ACCESS_LINE) is not growth. /metrics that changed state (answered at one
    end only) counts as moved: a blocked loop serves again."""
    if before.work is None and after.work is None:
        metrics = None
    elif before.work == UNANSWERED and after.work == UNANSWERED:
        metrics = UNANSWERED
    elif isinstance(before.work, dict) and isinstance(after.work, dict):
        metrics = "moved" if before.work != after.work else "unchanged"
    else:
        metrics = "moved"
    log = None if appended is None else "grew" if _work_lines(appended) else "unchanged"
    return Progress(after.taken_s - before.taken_s, metrics, log)


def _work_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not ACCESS_LINE.search(line)]


def hang_reason(*, silent_s: float, stopped: bool = False, cpu_used: bool | None, health_answers: bool | None,
                progress: Progress | None = None) -> str | None:
    """Why an engine that sent no byte for `silent_s` with requests in flight is hung, or None while it may be
    working. `cpu_used` (None: attached, unknown): whether its processes used CPU time over a short sample;
    `health_answers` (None: not asked, it was using CPU); `progress`: what moved over the window since the silence
    was first noticed (None: the window starts now)."""
    waited = f"no byte from the server for {silent_s:.0f} s"
    if stopped:
        return f"{waited} and its process is stopped (SIGSTOP?)"
    if not cpu_used and health_answers is False:
        idle = f", it used no CPU time for {CPU_SAMPLE_S:g} s" if cpu_used is False else ""
        return f"{waited}{idle} and its /health did not answer within {HEALTH_TIMEOUT_S:g} s: the engine is hung"
    if progress is None or progress.moved or not progress.watched:
        return None  # computing (a long prefill, a deep queue), or nothing to tell it by: ask again later
    if progress.metrics == UNANSWERED and cpu_used:
        return None  # llama-server answers /metrics from its main loop: one long step blocks it while it computes
    still = [text for text, shown in (("its /metrics did not change", progress.metrics == "unchanged"),
                                      (f"its /metrics did not answer within {METRICS_TIMEOUT_S:g} s",
                                       progress.metrics == UNANSWERED),
                                      ("its log did not grow", progress.log == "unchanged")) if shown]
    busy = "it used CPU time" if cpu_used else "its /health answered"
    return f"{waited}; over the last {progress.window_s:.0f} s {' and '.join(still)}, though {busy}: the engine is hung"


class ProgressWatch:
    """Snapshots of one engine's signs of work: its /metrics (`url`) and its log (`log_path`, None if attached)."""

    def __init__(self, url: str, log_path: Path | None):
        self.url, self.log_path = url, log_path
        self.start: Snapshot | None = None  # the window's first snapshot

    async def snapshot(self) -> Snapshot:
        try:
            status, text = await client.get_text(f"{self.url}/metrics", timeout_s=METRICS_TIMEOUT_S)
            work = (work_samples(text) or None) if status == 200 else None
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            work = UNANSWERED
        except ValueError:  # not Prometheus text
            work = None
        size = None
        if self.log_path is not None:
            try:
                size = self.log_path.stat().st_size
            except OSError:
                size = 0
        return Snapshot(time.monotonic(), work, size)

    def appended(self, since: Snapshot) -> str | None:
        """What the log gained after `since` (its first LOG_READ_BYTES), None without a log."""
        if self.log_path is None or since.log_bytes is None:
            return None
        try:
            with self.log_path.open("rb") as log:
                log.seek(since.log_bytes)
                return log.read(LOG_READ_BYTES).decode("utf-8", errors="replace")
        except OSError:
            return ""

    async def over_window(self, silence_began: float) -> Progress | None:
        """What moved since the window's start if it started within this silent stretch; else the window starts now
        (None)."""
        now = await self.snapshot()
        start, self.start = self.start, now
        if start is None or start.taken_s < silence_began:  # a byte arrived after it: a new stretch
            return None
        return progress(start, now, appended=self.appended(start))


def limits(*, url: str, server: ServerProcess | None, point_timeout: float) -> client.Limits:
    """The load generator's limits for one point starting now, on a launched engine (`server`) or an attached one."""
    watch = ProgressWatch(url, server.log_path if server is not None else None)

    def exited() -> str | None:
        if server is None or server.alive():
            return None
        return (f"the server exited with code {server.exit_code()} during the point; log {server.log_path}: "
                f"{log_tail(server.log_path)}")

    looked = (False, -1)  # the last look at the engine's processes: stopped, CPU ticks

    def stopped(silent_s: float) -> str | None:
        # stopped at two looks with no CPU time used between them (a traced engine flickers through a stop and runs)
        nonlocal looked
        if server is None:
            return None
        before, looked = looked, server.progress()
        if not (before[0] and looked[0] and before[1] == looked[1]):
            return None
        return hang_reason(silent_s=silent_s, stopped=True, cpu_used=None, health_answers=None)

    async def hung(silent_s: float) -> str | None:
        silence_began = time.monotonic() - silent_s
        cpu_used = health = None
        if server is not None:
            stopped, ticks = server.progress()
            if stopped:
                return hang_reason(silent_s=silent_s, stopped=True, cpu_used=None, health_answers=None)
            await asyncio.sleep(CPU_SAMPLE_S)
            cpu_used = server.progress()[1] > ticks
        if not cpu_used:
            health = await client.answers(f"{url}/health", timeout_s=HEALTH_TIMEOUT_S)
        reason = hang_reason(silent_s=silent_s, cpu_used=cpu_used, health_answers=health)
        if reason is not None:
            return reason
        return hang_reason(silent_s=silent_s, cpu_used=cpu_used, health_answers=health,
                           progress=await watch.over_window(silence_began))

    return client.Limits(deadline=time.monotonic() + point_timeout, point_timeout_s=point_timeout, exited=exited,
                         hung=hung, stopped=stopped)

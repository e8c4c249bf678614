"""Liveness tied to progress. A trial of a shared tune sends Optuna's heartbeats from a thread of its own, which
would keep beating while the worker's main thread hangs; specbench's storage records a heartbeat only while this
process has made progress lately (`mark`: a trial begun or finished, a request answered in-process, a prompt done, a
launch polled, bytes streamed from the engine). A worker stuck longer than the stall limit stops beating, its trial goes stale after
Optuna's grace period, and a worker elsewhere retries it."""

from __future__ import annotations

import os
import time

STALL_ENV = "SPECBENCH_STALL_S"  # seconds without progress after which this worker stops counting as alive
DEFAULT_STALL_S = 900.0  # longer than any silent phase a healthy worker has: one request, one launch poll

_last = time.monotonic()


def mark() -> None:
    """This process made progress now."""
    global _last
    _last = time.monotonic()


def stall_limit_s() -> float:
    return max(1.0, float(os.environ.get(STALL_ENV) or DEFAULT_STALL_S))


def stalled() -> bool:
    """Whether this process has made no progress for longer than the stall limit."""
    return time.monotonic() - _last > stall_limit_s()

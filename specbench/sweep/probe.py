"""How a capacity probe is sent and read: the session's load while it runs (`sending`: a steady state of a lead-in,
a measured window and a tail), about how long it takes, how long its requests took, and whether requests sent one
at a time already miss the SLO (then no load can hold it). Used by `specbench.sweep.capacity`."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import pandas as pd

from specbench.sweep.context import RunContext


def serial_misses(rows: pd.DataFrame, slo: dict[str, float], *, target: float) -> str | None:
    """Why no rate can hold the SLO, judged from requests sent one at a time (no queue: a rate only adds to their
    times), or None: where a limit lies below the median of its figure, more than half the requests miss it even
    alone, so no load reaches an attainment above one half."""
    if target <= 0.5:
        return None
    for name, limit in slo.items():
        values = pd.to_numeric(rows[name], errors="coerce").dropna() if name in rows else pd.Series(dtype=float)
        if len(values) and float(values.median()) > limit:
            return (f"one request at a time already misses it ({name} p50 {float(values.median()):.4g} > {limit:g}, "
                    f"{len(values)} requests)")
    return None


@contextmanager
def sending(ctx: RunContext, n_requests: int, *, open_loop: bool, steady: bool = True) -> Iterator[int]:
    """While the session sends a probe: `n_requests` at a request rate ([load] requests), or every prompt as many
    times as it takes at a concurrency (run.repeats); in the search's steady state ([capacity] lead_in_s, window_s as
    [load]'s, measuring at least `n_requests`). Yields the requests it will measure at least."""
    profile, capacity = ctx.session.profile, ctx.profile.capacity
    window = {"lead_in_s": capacity.lead_in_s, "window_s": capacity.window_s} if steady else {}
    load = profile.load.model_copy(update={"requests": n_requests, **window})
    if open_loop:
        changed = profile.model_copy(update={"load": load})
        sent = n_requests
    else:
        repeats = max(profile.run.repeats, math.ceil(n_requests / len(ctx.session.prompts)))
        changed = profile.model_copy(update={"run": profile.run.model_copy(update={"repeats": repeats}),
                                             "load": load if load.steady else profile.load})
        sent = n_requests if load.steady else repeats * len(ctx.session.prompts)
    ctx.session.profile = changed
    try:
        yield sent
    finally:
        ctx.session.profile = profile


def probe_seconds(capacity, *, load: float, n_requests: int, request_s: float | None, open_loop: bool) -> float | None:
    """About how long a probe takes: its lead-in, its window (or the time its requests take to arrive, if longer) and
    one request's own time (the tail's wait for the last measured one); None where that is unknown (at a
    concurrency, or without a serial request's time)."""
    if request_s is None or not open_loop:
        return None
    return capacity.lead_in_s + max(capacity.window_s, n_requests / load) + request_s


def span_s(rows: pd.DataFrame) -> float:
    if "start_ms" in rows and rows["start_ms"].notna().all() and len(rows):
        return float(((rows["start_ms"] + rows["e2e_ms"]).max() - rows["start_ms"].min()) / 1e3)
    return float(rows["e2e_ms"].sum() / 1e3)

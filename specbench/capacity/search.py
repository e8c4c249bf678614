"""Capacity search, the decisions only: the highest load (a request rate, or a concurrency) at which a
configuration still meets its SLO for a target share of its requests. Pure: history in, next probe out, so the
search is tested on stand-ins whose attainment curve is known.

A probe sends `n` requests at one load; `met` of them met every SLO limit (a failed request never does). Its
attainment met / n is a proportion, decided by its Wilson score interval: pass when the whole interval lies at
or above the target, fail when it lies below; in between it is undecided and leans the way its point estimate
does.

The search brackets like GuideLLM's goodput profile and vLLM's SLA sweep: from the start (the rate the engine
serves one request at a time) it grows the load by `growth` until a probe fails — or shrinks it until one passes,
down to `lowest` — then bisects (geometric mean for a relative resolution) between the highest passing probe and
the lowest failing one until they are within the resolution, moving on each probe's leaning. Requests are spent
where a decision counts: an end of the final bracket whose interval straddles the target is probed again with
twice the requests (up to `max_requests`, where the point estimate decides, and the decision says so) — and if
that flips it, the search goes on from the new bracket. A failing probe that saturated the engine (it completed
requests clearly slower than they arrived) measures the knee, the engine's saturation throughput: no load above
it can hold the SLO, so the next probe goes there before bisecting.

A void probe (the client could not send on time at its load: what it measured is the client's limit, not the
engine's) is neither: it caps the loads this machine can measure, and the search goes on below it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import pandas as pd

from specbench.core.summary import meets_slo


@dataclass(frozen=True, kw_only=True)
class SearchSettings:
    target: float = 0.95  # the attainment to hold
    confidence: float = 0.95  # of each probe's Wilson interval
    resolution: float = 0.1  # relative (the bracket's high end within this fraction of its low end) or absolute
    relative: bool = True
    requests: int = 16  # per probe
    max_requests: int = 64  # an undecided probe is repeated with twice the requests up to this
    max_probes: int = 12
    max_time_s: float | None = None
    start: float  # the first load probed
    lowest: float  # no probe below
    highest: float | None = None  # no probe above
    growth: float = 2.0
    # placed near its answer (a rate search from the concurrency capacity): the k-th step in a row to bracket is
    # growth ** k, fine first, yet any distance in a few probes
    accelerating: bool = False
    integer: bool = False  # concurrency: whole numbers


@dataclass(frozen=True, kw_only=True)
class Probe:
    """One measured probe: `met` of `n_requests` met the SLO at `load`."""

    load: float
    n_requests: int
    met: int
    duration_s: float = 0.0
    completed_per_s: float | None = None  # requests finished per second (open loop): the knee once saturated
    void: str | None = None  # why the probe cannot be trusted (the client sent late): neither a pass nor a fail
    # why the load cannot be sustained although its window met the SLO (the engine's queue still grew): a fail whose
    # attainment is not a measurement of the steady state (the fit leaves its requests out)
    unsustained: str | None = None


@dataclass(frozen=True)
class Decision:
    verdict: str | None  # "pass", "fail", or None: undecided (its interval straddles the target)
    label: str  # as recorded: "pass", "fail", "undecided (leans pass)", "pass (point estimate ...)"
    attainment: float
    ci_low: float
    ci_high: float
    leaning: str  # "pass" or "fail": the verdict, or where the point estimate lies while undecided


@dataclass(frozen=True)
class Next:
    load: float
    n_requests: int
    reason: str  # why this probe, in words
    narrowing: bool = False  # a new draw after the bracket was resolved (`narrowing_probe`): its reason is said


@dataclass(frozen=True)
class Done:
    reason: str  # "found", "probe limit", "time limit", "lowest", "highest"


@dataclass(frozen=True)
class Outcome:
    status: str  # "found", "not bracketed: ...", as capacity.json holds it
    capacity: float | None  # the highest passing load (a lower bound when not bracketed above)
    passing: Probe | None  # the highest passing probe below the lowest failing one
    failing: Probe | None  # the lowest failing probe
    note: str | None = None


def wilson_interval(met: int, n: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a proportion met / n: (p + z²/2n ± z·sqrt(p(1−p)/n + z²/4n²)) / (1 + z²/n)."""
    if n <= 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = met / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def fewest_to_confirm(target: float, *, confidence: float = 0.95, limit: int = 1 << 20) -> int | None:
    """The fewest requests whose Wilson interval can lie wholly at or above `target` (all of them meeting it):
    with fewer, a probe is never a confirmed pass, however well the engine does (0.9 at 95 %: 35 requests).
    None when even `limit` cannot (a target of 1)."""
    def confirms(n: int) -> bool:
        return wilson_interval(n, n, confidence=confidence)[0] >= target

    high = 1
    while not confirms(high):  # the lower bound of n / n grows with n: double, then bisect
        if high >= limit:
            return None
        high *= 2
    low = high // 2  # does not confirm (or is 0)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if confirms(middle) else (middle, high)
    return high


def decide(probe: Probe, settings: SearchSettings) -> Decision:
    """pass / fail by the Wilson interval against the target; undecided while it straddles the target and the
    probe may still grow (leaning the way its point estimate does), then the point estimate decides."""
    attainment = probe.met / probe.n_requests if probe.n_requests else 0.0
    low, high = wilson_interval(probe.met, probe.n_requests, confidence=settings.confidence)
    if probe.unsustained is not None:
        return Decision("fail", f"fail: {probe.unsustained}", attainment, low, high, "fail")
    leaning = "pass" if attainment >= settings.target else "fail"
    if low >= settings.target:
        return Decision("pass", "pass", attainment, low, high, "pass")
    if high < settings.target:
        return Decision("fail", "fail", attainment, low, high, "fail")
    if probe.n_requests < settings.max_requests:
        return Decision(None, f"undecided (leans {leaning})", attainment, low, high, leaning)
    return Decision(leaning, f"{leaning} (point estimate: the interval still straddles the target at "
                             f"{probe.n_requests} requests)", attainment, low, high, leaning)


def next_probe(history: Sequence[Probe], settings: SearchSettings) -> Next | Done:
    """The next probe of a search that has measured `history` (in order), or why it is done. The bracket moves on
    each probe's leaning; requests are added only where a decision counts: at the bracket's two ends, once they are
    within the resolution (or at the lowest or highest load allowed)."""
    if not history:
        return Next(_rounded(settings.start, settings), settings.requests, "the start")
    if len(history) >= settings.max_probes:
        return Done("probe limit")
    if settings.max_time_s is not None and sum(p.duration_s for p in history) >= settings.max_time_s:
        return Done("time limit")
    passing, failing = bracket(history, settings)
    ceiling = client_ceiling(history)
    if passing is None and failing is None:  # only void probes: below the lowest, down to the lowest allowed
        down = max(_rounded(ceiling / settings.growth, settings, below=ceiling), _rounded(settings.lowest, settings))
        return Next(down, settings.requests, "below what the client could send on time") if down < ceiling else \
            Done("client ceiling")
    if failing is None:  # every probe passed: grow, up to the highest allowed and below what the client could send
        up = _rounded(passing.load * _factor(history, settings, down=False), settings, above=passing.load)
        up = min(up, _rounded(settings.highest, settings)) if settings.highest is not None else up
        if ceiling is not None and up >= ceiling:
            if resolved(passing.load, ceiling, settings):
                return _confirm(passing, settings) or Done("client ceiling")
            up = _rounded(math.sqrt(passing.load * ceiling) if settings.relative and not settings.integer
                          else (passing.load + ceiling) / 2, settings, above=passing.load, below=ceiling)
            if not passing.load < up < ceiling:
                return _confirm(passing, settings) or Done("client ceiling")
        return Next(up, settings.requests, "growing to bracket") if up > passing.load else \
            _confirm(passing, settings) or Done("highest")
    if passing is None:  # every probe failed: shrink, down to the lowest allowed
        down = _rounded(failing.load / _factor(history, settings, down=True), settings, below=failing.load)
        down = max(down, _rounded(settings.lowest, settings))
        return Next(down, settings.requests, "shrinking to bracket") if down < failing.load else \
            _confirm(failing, settings) or Done("lowest")
    if not resolved(passing.load, failing.load, settings):
        knee = _knee(failing, passing, history, settings)
        if knee is not None and (ceiling is None or knee < ceiling):
            return Next(knee, settings.requests, f"the knee: {failing.load:g} saturated the engine")
        middle = (math.sqrt(passing.load * failing.load) if settings.relative and not settings.integer
                  else (passing.load + failing.load) / 2)
        middle = _rounded(middle, settings, above=passing.load, below=failing.load)
        if passing.load < middle < failing.load and not (ceiling is not None and middle >= ceiling):
            return Next(middle, settings.requests, "bisecting")  # else nothing is left between them to measure
    return _confirm(passing, settings) or _confirm(failing, settings) or Done("found")


def _factor(history: Sequence[Probe], settings: SearchSettings, *, down: bool) -> float:
    """The step to bracket: `growth`, or, accelerating, growth to the power k of the steps in a row that went that
    way — the latest probes each below (`down`) or above every load before them. A bracket end that flipped on a new
    draw is a load probed before: the search steps finely from it again."""
    if not settings.accelerating:
        return settings.growth
    loads = [p.load for p in history if p.void is None]
    steps = 0
    for index in range(len(loads) - 1, -1, -1):
        before = loads[:index]
        if before and not (loads[index] < min(before) if down else loads[index] > max(before)):
            break
        steps += 1
    return settings.growth ** max(1, steps)


def narrowing_probe(history: Sequence[Probe], settings: SearchSettings, *, reaches_above: bool, reaches_below: bool,
                    draws_at_most: int = 3) -> Next | None:
    """Once the bracket is resolved: a new draw, with the most requests, at an end of the bracket that the capacity's
    interval reaches past (`capacity.estimate`: its bootstrap resamples neighbouring requests together, so misses
    that came in one burst weigh as one event; a probe's Wilson interval counts its requests as independent and can
    call the same probe decided) — the failing end where the interval reaches above it, the passing end where below.
    At most `draws_at_most` draws of one load, within the probe limit; a failing end whose requests the fit leaves
    out (the engine's queue still grew) is not drawn again (its draws would be left out too). None: nothing to
    narrow."""
    passing, failing = bracket(history, settings)
    if passing is None or failing is None or len(history) >= settings.max_probes:
        return None
    for probe, reaches, side in ((failing, reaches_above, "above"), (passing, reaches_below, "below")):
        draws = sum(p.load == probe.load for p in history)
        if reaches and probe.unsustained is None and draws < draws_at_most:
            return Next(probe.load, settings.max_requests,
                        f"the capacity's interval reaches {side} {probe.load:g}: a new draw there with "
                        f"{settings.max_requests} requests", narrowing=True)
    return None


def bracket(history: Sequence[Probe], settings: SearchSettings) -> tuple[Probe | None, Probe | None]:
    """(the highest passing probe below the lowest failing one, the lowest failing probe), each load judged by its
    last probe's leaning; a pass above a failure (noise) does not count."""
    latest = {p.load: p for p in history if p.void is None}
    leanings = {load: decide(p, settings).leaning for load, p in latest.items()}
    fails = [latest[load] for load, v in leanings.items() if v == "fail"]
    failing = min(fails, key=lambda p: p.load) if fails else None
    passes = [latest[load] for load, v in leanings.items() if v == "pass"
              and (failing is None or load < failing.load)]
    return (max(passes, key=lambda p: p.load) if passes else None), failing


def client_ceiling(history: Sequence[Probe]) -> float | None:
    """The lowest load of a void probe: at it the client could not send on time, so no load from it up is measured."""
    return min((p.load for p in history if p.void is not None), default=None)


def resolved(low: float, high: float, settings: SearchSettings) -> bool:
    if settings.integer and high - low <= 1:
        return True
    if settings.relative:
        return high <= low * (1 + settings.resolution) * (1 + 1e-9)
    return high - low <= settings.resolution * (1 + 1e-9)


def conclude(history: Sequence[Probe], settings: SearchSettings, *, unit: str = "rate") -> Outcome:
    """What the probes say: the capacity with its bracket, or why there is none. `unit` names the axis in the
    status ("rate", "concurrency")."""
    passing, failing = bracket(history, settings)
    if failing is None and passing is None and client_ceiling(history) is None:
        return Outcome("not bracketed: nothing was probed", None, None, None)
    done = next_probe(history, settings)
    stopped = done.reason if isinstance(done, Done) and done.reason in ("probe limit", "time limit") else None
    ceiling = client_ceiling(history)
    unconfirmed = [p for p in (passing, failing) if p is not None and decide(p, settings).verdict is None]
    notes = ([f"stopped at the {stopped}"] if stopped else []) + (
        ["the bracket is wider than the resolution"] if stopped and passing and failing
        and not resolved(passing.load, failing.load, settings) else []) + (
        [f"not confirmed at {', '.join(f'{p.load:g}' for p in unconfirmed)}: the interval straddles the target"]
        if unconfirmed else [])
    if ceiling is not None:
        notes.append(f"the client could not send on time at {ceiling:g}: no {unit} from there up was measured")
    note = "; ".join(notes) or None
    if passing is None and failing is None:
        return Outcome(f"not bracketed: the client could not send on time even at {ceiling:g}", None, None, None, note)
    if passing is None:
        lowest = min(p.load for p in history if p.void is None)
        return Outcome(f"not bracketed: misses the SLO at its lowest {unit} {lowest:g}", None, None, failing, note)
    if failing is None:
        return Outcome(f"not bracketed: meets it at the highest {unit} probed {passing.load:g}", passing.load,
                       passing, None, note)
    return Outcome("found", passing.load, passing, failing, note)


def _confirm(probe: Probe, settings: SearchSettings) -> Next | None:
    """The same load again with twice the requests, where the probe's interval straddles the target."""
    if decide(probe, settings).verdict is not None:
        return None
    more = min(2 * probe.n_requests, settings.max_requests)
    return Next(probe.load, more, f"the interval straddles {settings.target:g}: again with {more} requests")


def _knee(failing: Probe, passing: Probe, history: Sequence[Probe], settings: SearchSettings) -> float | None:
    """Where a saturated failing probe says the engine tops out, when that lies well inside the bracket and has
    not been probed yet."""
    completed = failing.completed_per_s
    if settings.integer or completed is None or completed * (1 + _step(settings, failing.load)) >= failing.load:
        return None
    knee = _rounded(completed, settings)
    if knee <= passing.load * (1 + _step(settings, passing.load)) or knee in {p.load for p in history}:
        return None
    return knee


def _step(settings: SearchSettings, load: float) -> float:
    """The resolution as a fraction of `load`."""
    return settings.resolution if settings.relative else settings.resolution / load


def _rounded(load: float, settings: SearchSettings, *, above: float | None = None, below: float | None = None) -> float:
    """A load as probed: a whole concurrency, or a rate to 3 significant figures (short point ids), kept
    strictly between `above` and `below` where the rounding allows."""
    if settings.integer:
        value = float(round(load))
        if above is not None and value <= above:
            value = above + 1
        if below is not None and value >= below:
            value = below - 1
        return value
    return float(f"{load:.3g}")


# --- from request rows --------------------------------------------------------------------


def met_slo(rows: pd.DataFrame, slo: Mapping[str, float]) -> np.ndarray:
    """Per request: whether it met every SLO limit, as goodput counts it (`core.summary.meets_slo`: TTFT and end to
    end from the scheduled arrival where the client sent late); a failed request (a non-empty `error`) meets none."""
    met = meets_slo(rows, slo)
    if "error" in rows:
        met &= ~rows["error"].map(lambda e: isinstance(e, str) and e != "").to_numpy(bool)
    return met


def completed_per_s(rows: pd.DataFrame) -> float | None:
    """Requests finished per second between the first and the last finish: the arrival rate while the engine
    keeps up, its saturation throughput once it does not (no drain time in it, unlike a point's throughput)."""
    if len(rows) < 2 or "start_ms" not in rows or rows["start_ms"].isna().any():
        return None
    finish_s = (rows["start_ms"] + rows["e2e_ms"]).to_numpy(float) / 1e3
    span = finish_s.max() - finish_s.min()
    return (len(rows) - 1) / span if span > 0 else None


def late_sends(rows: pd.DataFrame, slo: Mapping[str, float], *, share: float,
               request_ms: float | None = None) -> str | None:
    """Why a probe cannot be trusted, or None: its client sent late — the p99 of its requests' send lateness above
    `share` of the TTFT limit (else of the end-to-end limit, else of one request's own time, `request_ms`). Then it
    measured the client's limit (a busy machine, a stalled event loop), not the engine's."""
    late = pd.to_numeric(rows["send_lateness_ms"], errors="coerce").dropna() if "send_lateness_ms" in rows else []
    basis = next(((name, slo[name]) for name in ("ttft_ms", "e2e_ms") if name in slo), None) or (
        ("one request's time", request_ms) if request_ms else None)
    if not len(late) or basis is None:
        return None
    p99 = float(np.quantile(late.to_numpy(float), 0.99))
    if p99 <= share * basis[1]:
        return None
    return f"the client sent late (p99 {p99:.0f} ms > {share:g} x {basis[0]} {basis[1]:.4g})"


def growing_queue(growth: float | None, *, running_peak: int | None) -> str | None:
    """Why a rate probe's load cannot be sustained, or None: the engine's queue was still growing over it (requests
    waiting, the last quarter of its /metrics samples against the second, up by more than 2 and than a quarter of the
    most requests it ran at once). Requests arrived faster than they were served: held longer, they would wait ever
    longer, whatever its window met."""
    if growth is None or growth <= max(2.0, 0.25 * (running_peak or 0)):
        return None
    return f"the engine's queue was still growing (requests waiting +{growth:.1f} over the probe): not sustainable"


def probe_of(rows: pd.DataFrame, *, load: float, slo: Mapping[str, float], duration_s: float = 0.0,
             open_loop: bool = True, void: str | None = None) -> Probe:
    return Probe(load=load, n_requests=len(rows), met=int(met_slo(rows, slo).sum()), duration_s=duration_s,
                 completed_per_s=completed_per_s(rows) if open_loop else None, void=void)

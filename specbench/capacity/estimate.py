"""Capacity as an estimate with an interval, from every request of every probe of one configuration's search.

The bisection of `specbench.capacity.search` decides where to probe; this module says what the probes, all of them
pooled, put the capacity at and how sure that is. Attainment is fitted against load as a non-increasing step function
(weighted pool-adjacent-violators: more load never helps), and the capacity is where the fit crosses the target,
interpolated in log load between the last load at or above the target and the first below it. The interval is a
moving-block bootstrap: within each probe, blocks of neighbouring requests (in the order they arrived, so requests
that shared a queue stay together) are resampled, the fit and the crossing redone; its percentiles are the interval,
widened where needed to the two probed loads the crossing lies between (the probes cannot place it closer: a search
stopped with a wide bracket is as uncertain as its bracket, however decided its probes were).
A curve flat near the target gives a wide interval: the estimate is then flagged ill-conditioned, however many
probes passed or failed.

A probe's requests are not its only noise: each probe is one draw of arrivals, and near capacity one burst decides
a whole window (on vLLM CPU, one load drew 24 of 24 met, its next draw 28 of 48). Blocks within a probe cannot see
that spread; the probes' scatter about the fit can. Its dispersion (Pearson's X² of the probes' shares about the
fitted curve, binomial variances at the fit, over the probes less the fit's distinct levels — the fit's own degrees
of freedom — counting only levels strictly between 0 and 1) says how many times more the probes scatter than
independent requests would; where it exceeds 1, each replicate moves each probe's share by a normal draw bringing
its spread up to that many binomial variances (one met and one missed request added, so that a probe that met every
request moves too; not beyond what its blocks already gave). A search with fewer than two degrees of freedom
left cannot tell (`dispersion` None); repeats, pooled, give it probes to tell from, and so do the other searches of
the run on the same axis: one engine, one machine, one way of sending load, so their scatter pooled (X² over
degrees of freedom, summed over searches: `run_dispersion`) is a steadier figure than one search's few probes give,
and each interval allows for the larger of the two.

One search sees the machine only while it runs. Repeats of it spread over the run ([capacity] repeats, the
configurations taking turns) see it move: where their own estimates lie further apart than their intervals allow,
the spread between them (DerSimonian and Laird's between-repeat variance of log capacity, `between_repeats`) widens
the pooled interval, as a random effect on the pooled mean.

Two configurations are compared by the ratio of their capacities, with an interval from theirs (log-normal: the
half-widths of the two log intervals add in quadrature, conservative where the two searches shared their arrival
draws). `compare` is the one rule for "measurably higher": the whole interval of the gain above zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Literal

import numpy as np

ESTIMATED = "estimated"
BELOW = "below the lowest load probed"  # the fit misses the target at every load: no capacity
ABOVE = "above the highest load probed"  # the fit meets it at every load: the highest is a lower bound


@dataclass(frozen=True)
class ProbeRequests:
    """One probe's requests in arrival order: whether each met every SLO limit."""

    load: float
    met: np.ndarray  # [n] bool


@dataclass(frozen=True)
class CapacityEstimate:
    capacity: float | None  # where the fitted attainment crosses the target (None: below the lowest load probed)
    ci_low: float | None  # None where the interval reaches below the lowest load probed
    ci_high: float | None  # None where it reaches above the highest
    confidence: float
    status: str  # ESTIMATED, BELOW or ABOVE
    curve: tuple[tuple[float, int, float], ...]  # (load, requests, fitted attainment) per load probed
    note: str | None = None  # why it is ill-conditioned: wider than `max_half_width` either side, or open at an end
    dispersion: float | None = None  # the probes' scatter about the fit over independent requests' (None: too few)
    run_dispersion: float | None = None  # the same pooled over the run's searches on this axis, where given

    @property
    def ill_conditioned(self) -> bool:
        return self.note is not None

    @property
    def half_width(self) -> float | None:
        """Half the interval as a fraction of the estimate (0.1: ±10 %); None where it is open or there is none."""
        return half_width(self.capacity, self.ci_low, self.ci_high)


def half_width(capacity: float | None, low: float | None, high: float | None) -> float | None:
    """Half the interval [low, high] as a fraction of `capacity` (0.1: ±10 %); None where it is open or there is
    none."""
    if capacity is None or low is None or high is None or capacity <= 0:
        return None
    return (high - low) / (2 * capacity)


def pooled(probes: Sequence[ProbeRequests]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(loads ascending, requests met, requests sent) with the probes at one load pooled."""
    loads = np.array(sorted({float(p.load) for p in probes}))
    met = np.zeros(len(loads))
    sent = np.zeros(len(loads))
    for probe in probes:
        at = np.searchsorted(loads, float(probe.load))
        met[at] += np.count_nonzero(probe.met)
        sent[at] += len(probe.met)
    return loads, met, sent


def fit_attainment(met: np.ndarray, sent: np.ndarray) -> np.ndarray:
    """The non-increasing attainment closest to met / sent in the least squares weighted by `sent` (loads in
    ascending order): pool adjacent violators, each block's value its pooled share."""
    values: list[float] = []
    weights: list[float] = []
    sizes: list[int] = []
    for m, n in zip(met, sent):
        values.append(m / n if n else 0.0)
        weights.append(float(n))
        sizes.append(1)
        while len(values) > 1 and values[-2] < values[-1]:  # a rise with load: pool the two blocks
            w = weights[-2] + weights[-1]
            v = (values[-2] * weights[-2] + values[-1] * weights[-1]) / w if w else 0.0
            s = sizes[-2] + sizes[-1]
            del values[-1], weights[-1], sizes[-1]
            values[-1], weights[-1], sizes[-1] = v, w, s
    return np.repeat(values, sizes)


def crossing(loads: np.ndarray, fitted: np.ndarray, target: float, *, integer: bool = False) -> tuple[float | None, str]:
    """Where the non-increasing `fitted` attainment crosses `target`: log-linear between the last load at or above it
    and the first below (a whole number at or below that, for a concurrency), with its status."""
    if fitted[0] < target:
        return None, BELOW
    if fitted[-1] >= target:
        return float(loads[-1]), ABOVE
    k = int(np.flatnonzero(fitted >= target)[-1])
    share = (fitted[k] - target) / (fitted[k] - fitted[k + 1])
    value = math.exp(math.log(loads[k]) + share * (math.log(loads[k + 1]) - math.log(loads[k])))
    return (float(max(math.floor(value + 1e-9), loads[k])) if integer else value), ESTIMATED


def estimate_capacity(probes: Sequence[ProbeRequests], *, target: float, confidence: float = 0.95,
                      resamples: int = 1000, seed: int = 0, integer: bool = False, max_half_width: float = 0.15,
                      run_dispersion: float | None = None) -> CapacityEstimate | None:
    """The capacity the probes put at `target` attainment, with a `confidence` block-bootstrap interval; None
    without a probe that sent a request. `run_dispersion`: the scatter of every search of the run on this axis
    (`run_dispersion`); the interval allows for it where it exceeds this search's own."""
    probes = [p for p in probes if len(p.met)]
    if not probes:
        return None
    loads, met, sent = pooled(probes)
    fitted = fit_attainment(met, sent)
    capacity, status = crossing(loads, fitted, target, integer=integer)
    spread = dispersion(probes, loads, fitted)
    replicates = _bootstrap(probes, loads, sent, fitted, target=target, resamples=resamples, seed=seed,
                            integer=integer, dispersion=max(spread or 1.0, run_dispersion or 1.0))
    alpha = 1 - confidence
    low = float(np.quantile(replicates, alpha / 2, method="lower"))
    high = float(np.quantile(replicates, 1 - alpha / 2, method="higher"))
    # an open end is None; the other end of a replicate at an open end is the load probed there
    ci_low = None if low == -math.inf else float(loads[-1]) if low == math.inf else low
    ci_high = None if high == math.inf else float(loads[0]) if high == -math.inf else high
    sampled = (ci_low, ci_high)
    if capacity is None:
        ci_low = ci_high = None
    elif status == ESTIMATED:  # nor can it be placed closer than the two probed loads the crossing lies between;
        # an end the resamples left open (they met the target at every load, or missed it at every one) stays open
        below, above = _between(loads, fitted, target, integer=integer)
        ci_low = None if ci_low is None else min(ci_low, below)
        ci_high = None if ci_high is None else max(ci_high, above)
    estimate = CapacityEstimate(capacity, ci_low, ci_high, confidence, status,
                                tuple((float(x), int(n), float(f)) for x, n, f in zip(loads, sent, fitted)),
                                dispersion=spread, run_dispersion=run_dispersion)
    return replace(estimate, note=_conditioning(estimate, target=target, max_half_width=max_half_width,
                                                integer=integer, sampled=sampled))


def _between(loads: np.ndarray, fitted: np.ndarray, target: float, *, integer: bool) -> tuple[float, float]:
    """The last load whose fitted attainment meets `target` and the first that misses it (for a concurrency, the
    highest whole number below that): the probes say nothing of the curve between them."""
    k = int(np.flatnonzero(fitted >= target)[-1])
    return float(loads[k]), float(max(loads[k + 1] - 1, loads[k]) if integer else loads[k + 1])


def dispersion(probes: Sequence[ProbeRequests], loads: np.ndarray, fitted: np.ndarray) -> float | None:
    """Pearson's X² of each probe's share met about the fitted attainment at its load, over the probes less the
    fit's distinct levels (those strictly between 0 and 1); None with fewer than two degrees of freedom. 1: the
    probes scatter as independent requests would; 4: four times that variance (draws of arrivals differ more than
    their requests)."""
    x2, freedom = scatter(probes, loads, fitted)
    return x2 / freedom if freedom >= 2 else None


def run_dispersion(searches: Sequence[Sequence[ProbeRequests]]) -> float | None:
    """The dispersion of several searches' probes (one run, one axis) pooled: their X² summed over their degrees of
    freedom summed, each about its own fit; None with fewer than two degrees of freedom in all."""
    x2, freedom = 0.0, 0
    for probes in searches:
        probes = [p for p in probes if len(p.met)]
        if probes:
            loads, met, sent = pooled(probes)
            one = scatter(probes, loads, fit_attainment(met, sent))
            x2, freedom = x2 + one[0], freedom + one[1]
    return x2 / freedom if freedom >= 2 else None


def scatter(probes: Sequence[ProbeRequests], loads: np.ndarray, fitted: np.ndarray) -> tuple[float, int]:
    """(Pearson's X² of the probes' shares about the fit, its degrees of freedom): `dispersion`'s parts."""
    at = np.searchsorted(loads, [float(p.load) for p in probes])
    n = np.array([len(p.met) for p in probes], dtype=float)
    share = np.array([np.count_nonzero(p.met) for p in probes]) / n
    # a level fitted at 0 or 1 holds probes that all missed or all met: they cannot scatter, nor tell how much
    inner = (fitted[at] > 0) & (fitted[at] < 1)
    freedom = int(np.count_nonzero(inner)) - len(np.unique(fitted[at][inner]))
    p = fitted[at][inner]
    return float(((share[inner] - p) ** 2 / (p * (1 - p) / n[inner])).sum()), max(freedom, 0)


def _binomial_variance(p: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The variance of a share of n independent requests met with probability p, one met and one missed added (so
    a share of 1 or 0 still has some)."""
    smoothed = (p * n + 1) / (n + 2)
    return smoothed * (1 - smoothed) / n


def _bootstrap(probes: Sequence[ProbeRequests], loads: np.ndarray, sent: np.ndarray, fitted: np.ndarray, *,
               target: float, resamples: int, seed: int, integer: bool, dispersion: float) -> np.ndarray:
    """[resamples] capacities, each from every probe's requests resampled in moving blocks of ~√n neighbours (and,
    where `dispersion` > 1, moved by a normal draw up to that many binomial variances at the fit); -inf where a
    replicate misses the target at every load, +inf where it meets it at every load (open ends)."""
    rng = np.random.default_rng(seed)
    met = np.zeros((resamples, len(loads)))  # [R, loads]: requests met per replicate, `sent` as pooled
    for probe in probes:
        at = np.searchsorted(loads, float(probe.load))
        flags = np.asarray(probe.met, dtype=float)
        n = len(flags)
        block = max(1, math.isqrt(n))
        starts = rng.integers(0, n - block + 1, size=(resamples, -(-n // block)))  # [R, blocks]
        taken = (starts[:, :, None] + np.arange(block)).reshape(resamples, -1)[:, :n]  # [R, n]
        counts = flags[taken].sum(axis=1)  # [R]
        if dispersion > 1:  # the spread between draws the blocks of one draw cannot show
            wanted = dispersion * float(_binomial_variance(fitted[at], np.float64(n))) * n * n
            extra = max(0.0, wanted - float(counts.var()))
            counts = np.clip(counts + math.sqrt(extra) * rng.standard_normal(resamples), 0, n)
        met[:, at] += counts
    values = np.empty(resamples)
    for r in range(resamples):
        value, status = crossing(loads, fit_attainment(met[r], sent), target, integer=integer)
        values[r] = -math.inf if status == BELOW else math.inf if status == ABOVE else value
    return values


def _conditioning(estimate: CapacityEstimate, *, target: float, max_half_width: float, integer: bool,
                  sampled: tuple[float | None, float | None]) -> str | None:
    """Why the estimate cannot be budgeted on as it stands, in words; None when its interval is narrow enough.
    `sampled`: the bootstrap's own ends, before the interval was widened to the loads either side of the crossing
    (which tells a flat curve from probes too far apart)."""
    level = f"{estimate.confidence * 100:g} %"
    if estimate.status == BELOW:
        return None  # nothing to condition: there is no capacity
    if estimate.ci_low is None:
        return f"its {level} interval reaches below the lowest load probed"
    if estimate.ci_high is None:
        return f"its {level} interval reaches above the highest load probed"
    width = estimate.half_width
    if integer and estimate.ci_high - estimate.ci_low <= 1:  # a concurrency cannot be known finer than one
        return None
    if width is not None and width > max_half_width:
        flat = None not in sampled and (sampled[1] - sampled[0]) / (2 * estimate.capacity) > max_half_width
        why = f"the attainment curve is flat near {target:g}" if flat else \
            "the loads probed either side of it are far apart"
        return f"ill-conditioned: {why}, the capacity is known to ±{width * 100:.0f} % ({level} interval)"
    return None


# --- repeats of one search ----------------------------------------------------------------------------------------


def between_repeats(estimates: Sequence[tuple[float | None, float | None, float | None]], *,
                    confidence: float) -> float | None:
    """τ, the spread of log capacity between repeats beyond what their own intervals allow (DerSimonian-Laird):
    from each repeat's (capacity, low, high), its log estimate with the standard error its interval implies (at
    least 1 %); 0 where they agree within their intervals; None with fewer than two repeats whose intervals are
    closed."""
    z = _z(confidence)
    closed = [(c, lo, hi) for c, lo, hi in estimates if c and lo and hi and 0 < lo <= c <= hi]
    if len(closed) < 2:
        return None
    y = np.log([c for c, _, _ in closed])
    w = 1 / np.maximum([math.log(hi / lo) / (2 * z) for _, lo, hi in closed], 0.01) ** 2
    q = float((w * (y - (w * y).sum() / w.sum()) ** 2).sum())
    return math.sqrt(max(0.0, (q - (len(closed) - 1)) / (w.sum() - (w ** 2).sum() / w.sum())))


def widened(capacity: float, low: float | None, high: float | None, *, tau: float, repeats: int,
            confidence: float) -> tuple[float | None, float | None]:
    """The pooled interval with the between-repeat spread τ added to each side's log half-width in quadrature, as
    the random effect of the mean of `repeats` repeats (z x τ / √repeats); an open end stays open."""
    extra = _z(confidence) * tau / math.sqrt(repeats)
    return (None if low is None else capacity * math.exp(-math.hypot(math.log(capacity / low), extra)),
            None if high is None else capacity * math.exp(math.hypot(math.log(high / capacity), extra)))


def _z(confidence: float) -> float:
    return float(NormalDist().inv_cdf(0.5 + confidence / 2))


# --- two configurations ------------------------------------------------------------------------------------------


def gain_interval(capacity: float, ci: tuple[float, float], baseline: float,
                  baseline_ci: tuple[float, float]) -> tuple[float, float, float] | None:
    """(gain, low, high): capacity / baseline - 1 with its interval at the intervals' own confidence, the half-widths
    of the two log intervals (z x SE each) added in quadrature; None where a capacity or an end of an interval is
    missing or not positive."""
    values = (capacity, *ci, baseline, *baseline_ci)
    if any(v is None or not v > 0 for v in values):
        return None
    half = math.hypot(math.log(ci[1] / ci[0]) / 2, math.log(baseline_ci[1] / baseline_ci[0]) / 2)
    centre = math.log(capacity / baseline)
    return math.exp(centre) - 1, math.exp(centre - half) - 1, math.exp(centre + half) - 1


def compare(low: float, high: float) -> Literal["higher", "lower", "within"]:
    """The one rule for a measurable difference: higher when the gain's whole interval lies above zero, lower when
    below, within otherwise."""
    return "higher" if low > 0 else "lower" if high < 0 else "within"

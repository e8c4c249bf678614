"""The profile's [capacity] table: what a capacity search holds and how finely it searches. Validated where the
profile enters (one-line errors naming the key)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Strict, StrictBool, model_validator

from specbench.profile.fields import NonNegativeFloat, PositiveFloat, PositiveInt, Share, Table
from specbench.capacity.search import fewest_to_confirm
from specbench.profile.validation import check, rule

_Confidence = Annotated[float, Strict(), check(lambda v: 0 < v < 1, "a number in (0, 1), e.g. 0.95")]
_Growth = Annotated[float, Strict(), check(lambda v: v > 1, "a number > 1")]


class CapacitySpec(Table):
    """A capacity search per launch configuration: the highest request rate (and, with `concurrency = true`,
    the highest concurrency) at which at least `attainment` of the requests meet every [slo] limit."""

    attainment: Share = 0.95  # the share of requests that must meet every [slo] limit
    confidence: _Confidence = 0.95  # the level of each probe's Wilson interval
    resolution: PositiveFloat | None = None  # relative: stop once the bracket's ends are within this fraction (0.1)
    resolution_rps: PositiveFloat | None = None  # or absolute, in requests/s
    requests: PositiveInt = 40  # measured per probe, at least
    max_requests: PositiveInt | None = None  # a probe whose interval straddles the target is repeated with twice the
    # requests, up to this (default 4 x requests); then its point estimate decides. It must be able to confirm the
    # attainment: all of max_requests meeting the SLO put the interval above it (0.95 at 95 %: 73 requests)
    # each probe in a steady state ([load] lead_in_s and window_s, for the probes): a lead-in at the probe's load that
    # is not measured, then the requests sent in a window of window_s seconds (and until `requests` were) measured,
    # the load kept up until they finished. 0 and 0: every request measured, from an idle engine to its drain
    lead_in_s: NonNegativeFloat = 10.0
    window_s: NonNegativeFloat = 30.0
    # a rate probe whose client sent late — p99 send lateness above this share of the TTFT limit (else of the
    # end-to-end limit, else of one request's time) — is void: neither a pass nor a fail, and no higher rate is probed
    max_lateness: Share = 0.25
    # the whole search this many times per configuration, each repeat with draws of its own and the configurations'
    # launches in turn (each repeat in the order the last one ended: A B, B A, A B, ... so that a drift of the machine
    # cancels between them); the capacity is fitted to every repeat's requests pooled, each repeat's own beside it
    repeats: PositiveInt = 1
    max_probes: PositiveInt = 12  # per configuration, axis and repeat
    max_time_s: PositiveFloat | None = None  # per configuration, axis and repeat: no new probe once its probes took this long
    start_rps: PositiveFloat | None = None  # the first rate probed (default: 1 / mean e2e at concurrency 1)
    lowest_rps: PositiveFloat | None = None  # no probe below (default: the start / 4)
    highest_rps: PositiveFloat | None = None  # no probe above (default: none)
    growth: _Growth = 2.0  # the factor between probes until the bracket closes (up from a pass, down from a fail)
    rate: StrictBool = True  # the highest request rate (open loop)
    concurrency: StrictBool = False  # the highest concurrency (closed loop), from 1 (too, with `rate`)
    max_concurrency: PositiveInt | None = None  # no concurrency probe above

    @model_validator(mode="after")
    def _consistent(self) -> "CapacitySpec":
        if not (self.rate or self.concurrency):
            raise rule("searches no axis: set rate = true (the highest request rate) or concurrency = true (the "
                       "highest concurrency), or both", at=("rate",))
        if self.resolution is not None and self.resolution_rps is not None:
            raise rule("give one of resolution (relative, e.g. 0.1) and resolution_rps (requests/s), not both",
                       at=("resolution_rps",))
        if self.max_requests is not None and self.max_requests < self.requests:
            raise rule(f"must be >= requests = {self.requests} (got {self.max_requests})", at=("max_requests",))
        fewest = fewest_to_confirm(self.attainment, confidence=self.confidence)
        if fewest is None:
            raise rule(f"{self.attainment:g} can never be confirmed: a probe's interval never reaches it, however many "
                       f"requests meet the SLO; use a share below 1, e.g. 0.99", at=("attainment",))
        if fewest > self.requests_at_most:
            key = "max_requests" if self.max_requests is not None else "requests"
            raise rule(f"{self.requests_at_most} requests per probe can never confirm attainment {self.attainment:g} at "
                       f"confidence {self.confidence:g}, even when every one meets the SLO (it takes {fewest} requests): "
                       + ("raise max_requests" if key == "max_requests" else
                          "raise requests (probes grow to 4 x requests) or set max_requests")
                       + f" to {fewest}, or lower attainment or confidence", at=(key,))
        for key in ("lowest_rps", "highest_rps"):
            value = getattr(self, key)
            if value is not None and self.start_rps is not None and (
                    value > self.start_rps if key == "lowest_rps" else value < self.start_rps):
                raise rule(f"must be {'<=' if key == 'lowest_rps' else '>='} start_rps = {self.start_rps:g} "
                           f"(got {value:g})", at=(key,))
        return self

    @property
    def relative(self) -> bool:
        return self.resolution_rps is None

    @property
    def resolution_value(self) -> float:
        """The resolution in its unit: a fraction (relative, default 0.1) or requests/s."""
        return self.resolution_rps if self.resolution_rps is not None else (self.resolution or 0.1)

    @property
    def requests_at_most(self) -> int:
        return self.max_requests if self.max_requests is not None else 4 * self.requests


def capacity_problem(*, backend: str, slo_limits: dict[str, float | str], capacity: CapacitySpec | None):
    """The first reason a profile's [capacity] cannot run (a pydantic rule naming the key), or None."""
    if capacity is None:
        return None
    if backend != "server":
        return rule(f'a capacity search sends requests at rates to a serving engine: set backend = "server" '
                    f'(backend "{backend}" runs one request at a time), or remove [capacity]', at=("capacity",))
    if not slo_limits:
        return rule("a capacity search needs an SLO to hold: add an [slo] table (ttft_ms, tpot_ms and/or e2e_ms)",
                    at=("slo",))
    return None

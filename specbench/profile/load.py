"""The profile's [load] table: how a request-rate level sends (requests, burstiness), whether a server point is
measured in a steady state (lead-in, window), and the load mix that `specbench tune` weighs the levels by."""

from __future__ import annotations

from pydantic import StrictStr

from specbench.profile.fields import NonNegativeFloat, PositiveFloat, PositiveInt, Table


class LoadSpec(Table):
    """How a request-rate level sends: how many requests, and how bursty their arrivals are."""

    requests: PositiveInt | None = None  # per request-rate level; default: every prompt x repeat once
    # the gaps between arrivals are gamma-distributed with this shape (as vLLM's benchmark client draws them):
    # 1 is a Poisson process, below 1 burstier, above 1 more regular
    burstiness: PositiveFloat = 1.0
    # steady state, at every load level of a server point (a request rate or a concurrency): the requests sent in the
    # first lead_in_s seconds are not measured (the engine's ramp-up from idle), those sent in the next window_s
    # seconds are — and until `requests` were (default: every prompt x repeat) —, and the load goes on until every
    # measured request finished (none is measured while the engine drains), then what is in flight is cancelled.
    # Both 0 (the default): every request is measured, from an idle engine to its drain.
    lead_in_s: NonNegativeFloat = 0.0
    window_s: NonNegativeFloat = 0.0
    # the share of each load level in the traffic, "1:0.5,4:0.3,r0.5:0.2" (concurrency levels by number, request
    # rates as rN): `specbench tune` weighs the levels so (default: equally); checked against the sweep's levels
    mix: StrictStr | None = None

    @property
    def steady(self) -> bool:
        return self.lead_in_s > 0 or self.window_s > 0

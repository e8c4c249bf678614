"""The profile's [load] table: how a request-rate level sends (requests, burstiness) and the load mix that
`specbench tune` weighs the levels by."""

from __future__ import annotations

from pydantic import StrictStr

from specbench.profile.fields import PositiveFloat, PositiveInt, Table


class LoadSpec(Table):
    """How a request-rate level sends: how many requests, and how bursty their arrivals are."""

    requests: PositiveInt | None = None  # per request-rate level; default: every prompt x repeat once
    # the gaps between arrivals are gamma-distributed with this shape (as vLLM's benchmark client draws them):
    # 1 is a Poisson process, below 1 burstier, above 1 more regular
    burstiness: PositiveFloat = 1.0
    # the share of each load level in the traffic, "1:0.5,4:0.3,r0.5:0.2" (concurrency levels by number, request
    # rates as rN): `specbench tune` weighs the levels so (default: equally); checked against the sweep's levels
    mix: StrictStr | None = None

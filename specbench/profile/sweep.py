"""The profile's [sweep] table: the axes every draft is swept along (gamma, temperature, top_p) and the load levels
(closed-loop concurrency, open-loop request rates)."""

from __future__ import annotations

from typing import Annotated

from specbench.profile.fields import Axis, PositiveFloat, PositiveInt, Table, Temperature, TopP


class SweepSpec(Table):
    gamma: Annotated[tuple[PositiveInt, ...], Axis]
    temperature: Annotated[tuple[Temperature, ...], Axis]
    top_p: Annotated[tuple[TopP, ...], Axis] = (1.0,)
    concurrency: Annotated[tuple[PositiveInt, ...], Axis] = (1,)  # requests in flight; > 1 on the server backend
    # open-loop load levels besides the closed-loop concurrency ones: requests/s arriving as a (seeded) Poisson
    # process, whatever the server's state; the server backend only
    request_rate: Annotated[tuple[PositiveFloat, ...], Axis] = ()

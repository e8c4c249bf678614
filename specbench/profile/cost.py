"""The profile's [cost] table: the price of a replica-hour, and the traffic to size the fleet for."""

from __future__ import annotations

from specbench.profile.fields import PositiveFloat, Table


class CostSpec(Table):
    """What one replica costs, and the traffic to size the fleet for."""

    usd_per_hour: PositiveFloat | None = None  # the price of one replica (the engine's machine) per hour
    traffic_rps: PositiveFloat | None = None  # requests/s to serve: replicas needed = ceil(traffic / capacity)

"""The profile's [cost] table: the price of a replica-hour (or of a GPU-hour, times the GPUs a replica uses), and
the traffic to size the fleet for."""

from __future__ import annotations

from pydantic import model_validator

from specbench.profile.fields import PositiveFloat, Table
from specbench.profile.validation import rule


class CostSpec(Table):
    """What one replica costs, and the traffic to size the fleet for."""

    usd_per_hour: PositiveFloat | None = None  # the price of one replica (the engine's machine) per hour
    usd_per_gpu_hour: PositiveFloat | None = None  # or the price of one GPU per hour: x server.tensor_parallel
    traffic_rps: PositiveFloat | None = None  # requests/s to serve: replicas needed = ceil(traffic / capacity)

    @model_validator(mode="after")
    def _one_price(self) -> "CostSpec":
        if self.usd_per_hour is not None and self.usd_per_gpu_hour is not None:
            raise rule("give the price of a replica-hour or of a GPU-hour, not both (remove one)",
                       at=("usd_per_gpu_hour",))
        return self

    def replica_usd_per_hour(self, gpus_per_replica: int) -> float | None:
        """What one replica costs per hour: its price, or its GPUs' price."""
        if self.usd_per_gpu_hour is not None:
            return self.usd_per_gpu_hour * gpus_per_replica
        return self.usd_per_hour

"""The profile's [slo] table: the latency limits a request must meet to count towards goodput and SLO attainment."""

from __future__ import annotations

from specbench.profile.fields import PositiveFloat, Table


class SloSpec(Table):
    """Service-level objectives: a request meets them when each one given holds (goodput counts those)."""

    ttft_ms: PositiveFloat | None = None
    tpot_ms: PositiveFloat | None = None
    e2e_ms: PositiveFloat | None = None

    def limits(self) -> dict[str, float]:
        """{request column: limit} of the objectives given."""
        return {name: value for name, value in self.model_dump().items() if value is not None}

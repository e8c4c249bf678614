"""The profile's [slo] table: the latency limits a request must meet to count towards goodput and SLO attainment. A
limit is absolute (milliseconds) or relative to the baseline's serial figures ("2x serial": twice the median of the
baseline's requests one at a time), so that a shipped profile asks the same of any machine."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

import pandas as pd

from specbench.profile.fields import Table
from specbench.profile.validation import check

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*x\s+serial\s*$")


def relative_factor(value: object) -> float | None:
    """The factor of a relative limit ("2x serial" -> 2.0), else None."""
    match = _RELATIVE.match(value) if isinstance(value, str) else None
    return float(match.group(1)) if match and float(match.group(1)) > 0 else None


def _limit(value: object) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return (number and value > 0) or relative_factor(value) is not None


Limit = Annotated[Any, check(_limit, 'a number > 0 (milliseconds) or "Nx serial", e.g. "2x serial"')]


class SloSpec(Table):
    """Service-level objectives: a request meets them when each one given holds (goodput counts those)."""

    ttft_ms: Limit | None = None
    tpot_ms: Limit | None = None
    e2e_ms: Limit | None = None

    def given(self) -> dict[str, float | str]:
        """{request column: limit as written} of the objectives given."""
        return {name: value for name, value in self.model_dump().items() if value is not None}

    def relative(self) -> dict[str, float]:
        """{request column: factor} of the limits relative to the baseline's serial figures."""
        return {name: factor for name, value in self.given().items()
                if (factor := relative_factor(value)) is not None}

    def limits(self) -> dict[str, float]:
        """{request column: limit in ms} of the objectives given; only for a table without relative limits (else
        `resolved`)."""
        if self.relative():
            raise ValueError("relative SLO limits are resolved against the baseline's serial point: use resolved()")
        return {name: float(value) for name, value in self.given().items()}

    def resolved(self, serial: pd.DataFrame | None) -> dict[str, float] | None:
        """{request column: limit in ms}, a relative limit as its factor times the median of that column over
        `serial` (the baseline's requests one at a time); None while a relative limit has nothing to be resolved
        against (that point is not measured yet, or measured nothing)."""
        limits: dict[str, float] = {}
        for name, value in self.given().items():
            factor = relative_factor(value)
            if factor is None:
                limits[name] = float(value)
                continue
            figures = pd.to_numeric(serial[name], errors="coerce").dropna() if serial is not None and name in serial \
                else pd.Series(dtype=float)
            if not len(figures):
                return None
            limits[name] = factor * float(figures.median())
        return limits


def describe_limits(limits: Mapping[str, float]) -> str:
    return ", ".join(f"{name} {value:.4g}" for name, value in limits.items())

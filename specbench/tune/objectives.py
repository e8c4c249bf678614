"""What `specbench tune` optimises: the objective (one point column, or tokens/s against peak memory), the
constraints, and the one-line `TuneError` for bad options. Validated here, where the options enter; importable
without Optuna (the CLI's help lists the objectives)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specbench.core.errors import OneLineError


class TuneError(OneLineError, ValueError):
    """Bad input to `specbench tune`; the message is one line."""


@dataclass(frozen=True)
class Objective:
    """One or two point columns: a single objective, or the throughput-vs-memory Pareto mode."""

    name: str
    columns: tuple[str, ...]
    directions: tuple[str, ...]  # "maximize" | "minimize", per column

    @property
    def is_pareto(self) -> bool:
        return len(self.columns) > 1

    def better(self, a: float, b: float) -> bool:
        """Whether `a` beats `b` on the first (the deciding) column."""
        return a > b if self.directions[0] == "maximize" else a < b


OBJECTIVES = {
    "tokens_per_s": Objective("tokens_per_s", ("tokens_per_s",), ("maximize",)),
    "speedup": Objective("speedup", ("speedup",), ("maximize",)),
    "tpot_ms_p50": Objective("tpot_ms_p50", ("tpot_ms_p50",), ("minimize",)),
    "e2e_ms_p50": Objective("e2e_ms_p50", ("e2e_ms_p50",), ("minimize",)),
    "e2e_ms_p99": Objective("e2e_ms_p99", ("e2e_ms_p99",), ("minimize",)),
    "ttft_ms_p99": Objective("ttft_ms_p99", ("ttft_ms_p99",), ("minimize",)),
    "tpot_ms_p99": Objective("tpot_ms_p99", ("tpot_ms_p99",), ("minimize",)),
    "goodput": Objective("goodput", ("goodput",), ("maximize",)),  # requests/s meeting every SLO of [slo]
    "capacity": Objective("capacity", ("capacity_rps",), ("maximize",)),  # a capacity search per trial ([capacity])
    "pareto": Objective("pareto", ("tokens_per_s", "peak_memory_mb"), ("maximize", "minimize")),
}


def parse_objective(name: str) -> Objective:
    if name not in OBJECTIVES:
        raise TuneError(f"--objective: unknown objective {name!r} (known: {', '.join(OBJECTIVES)})")
    return OBJECTIVES[name]


@dataclass(frozen=True)
class Constraints:
    max_peak_memory_mb: float | None = None
    min_acceptance_rate: float | None = None

    def __post_init__(self) -> None:
        if self.max_peak_memory_mb is not None and self.max_peak_memory_mb <= 0:
            raise TuneError(f"--max-peak-memory-mb: must be > 0 (got {self.max_peak_memory_mb:g})")
        if self.min_acceptance_rate is not None and not 0 <= self.min_acceptance_rate <= 1:
            raise TuneError(f"--min-acceptance-rate: must be in [0, 1] (got {self.min_acceptance_rate:g})")

    def violations(self, metrics: dict[str, Any]) -> list[float]:
        """Optuna's convention: one value per constraint, feasible when every value is <= 0. A metric
        that was not measured (HF backend acceptance, a pruned trial) violates its constraint."""
        values = []
        if self.max_peak_memory_mb is not None:
            memory = metrics.get("peak_memory_mb")
            values.append(float("inf") if memory is None else memory - self.max_peak_memory_mb)
        if self.min_acceptance_rate is not None:
            rate = metrics.get("acceptance_rate")
            values.append(float("inf") if rate is None else self.min_acceptance_rate - rate)
        return values

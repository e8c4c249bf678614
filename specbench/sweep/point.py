"""What crosses the sweep's module borders: the observer a sweep reports to (the terminal's progress, a job log's
lines, nothing in a worker) and one point's outcome. Imported by the loop, the files it writes and the capacity
search, which import nothing of each other's for them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from specbench.core.results import PointSpec


class SweepObserver(Protocol):
    def sweep_started(self, points: list[PointSpec], to_run: list[PointSpec]) -> None: ...
    def point_started(self, spec: PointSpec, n_requests: int) -> None: ...
    def request_done(self, spec: PointSpec) -> None: ...
    def point_finished(self, spec: PointSpec, row: dict[str, Any]) -> None: ...
    def message(self, text: str) -> None: ...


class SilentObserver:
    """An observer that shows nothing (library calls, worker processes)."""

    def sweep_started(self, points, to_run): pass
    def point_started(self, spec, n_requests): pass
    def request_done(self, spec): pass
    def point_finished(self, spec, row): pass
    def message(self, text): pass
    def trial_finished(self, study, row): pass


@dataclass(frozen=True)
class PointRun:
    rows: list[dict[str, Any]]  # one per request; none when the point failed
    error: str | None  # the one-line reason it failed
    conditions: dict[str, Any]  # how quiet the machine was (contention.Conditions), the engine's counters

"""The seam between specbench and whatever runs a point's requests: a `Backend` opens a `Session` for a
profile; the run loop, the grid runner, tune and bench talk to the session and never ask which backend
they hold."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the profile validates backend names against this package: no import at run time
    from specbench.profile import Profile
    from specbench.core.results import PointSpec
    from specbench.workloads.build import Workload
    from specbench.workloads.prompts import Prompt

OnRequest = Callable[[], None]  # called after each measured request (progress)
AfterPrompt = Callable[[list[dict[str, Any]]], None]  # the rows so far, after each prompt's repeats (pruning)


class Observer(Protocol):
    def message(self, text: str) -> None: ...


class Session(Protocol):
    """What one process holds open to run any number of points of a profile."""

    backend: str
    workload: Workload  # what is sent: prompts, their token ids, each request's output budget
    prompts: list[Prompt]
    prompt_tokens: list[int]  # per prompt, in the target's tokenizer

    @property
    def identity(self) -> dict[str, Any]:
        """Plain data that makes measurements comparable (hashed into the run key): the target's identity,
        the backend, and where and how it runs."""
        ...

    def draft_identity(self, spec: PointSpec) -> str | None:
        """The identity of the point's draft model, if it has one (hashed into the point key)."""
        ...

    def point_context(self, spec: PointSpec) -> dict[str, Any]:
        """Constant columns of the point's row: backend, target_model, weight_mb."""
        ...

    def run_point(self, spec: PointSpec, *, point_key: str, on_request: OnRequest,
                  after_prompt: AfterPrompt | None) -> list[dict[str, Any]]:
        """Warm up, then measure every prompt x repeat: one `results.request_row` each. Raises on failure;
        an `after_prompt` that raises a BaseException (a pruned trial) stops the point."""
        ...

    def gpu_uuids(self) -> tuple[str, ...]:
        """The GPUs the current point runs on (NVML UUIDs), where other processes disturb its timing; () for none."""
        ...

    def gpu_claimed(self) -> frozenset[int]:
        """NVML's numbers for the processes the run put on those GPUs (core/gpus.py Claim: in a container not the
        run's own pids); frozenset() where nothing was claimed."""
        ...

    def point_measurements(self) -> dict[str, Any]:
        """Point-level figures of the last `run_point` that no request row holds (a serving engine's
        acceptance counters and peak memory); {} for none."""
        ...

    def own_pids(self) -> list[int]:
        """The processes whose CPU time is this run's own (the rest counts as contention)."""
        ...

    def verify_costs(self, max_tokens: int) -> tuple[float, ...]:
        """The target's time in ms to verify 1..max_tokens tokens, for the analytic model; () when the
        backend cannot time it."""
        ...

    def describe(self) -> dict[str, Any]:
        """For the manifest: {"models": ..., "environment": ...}."""
        ...

    def close(self) -> None: ...


class Backend(Protocol):
    name: str
    pins_local_devices: bool  # local workers each take a GPU of their own (in-process backends)

    def launch_key(self, spec: PointSpec) -> Hashable:
        """Points with the same key run without a restart in between; the run orders points so that each
        key's points run together."""
        ...

    def open(self, profile: Profile, *, observer: Observer, out_dir: Path | None = None) -> Session:
        """Load or launch what the profile needs (logs of what it launches go under `out_dir`). Bad input
        raises a ValueError with one line."""
        ...

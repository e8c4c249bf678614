"""`specbench run --shard I/N`: the sweep split the way cluster schedulers run jobs (a Kubernetes Indexed Job, a Slurm
job array: N copies of one command, each knowing its index). The units split are launch groups — every point one engine
launch serves (in-process: every point of one draft x gamma configuration) — so each engine configuration is launched
by one shard only; every shard measures its own baselines, so each speedup and capacity gain is computed on one
machine; each shard writes its own folder (its own resume and lock: no shared file system). `specbench merge` joins
the folders. The split is deterministic: units in plan order, each to the shard with the fewest points so far (the
lowest index on a tie)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

from specbench.core.errors import OneLineError
from specbench.core.host import host_name
from specbench.core.results import PointSpec

# where schedulers put a copy's index: Kubernetes Indexed Jobs (from 0), Slurm job arrays (from the array's minimum)
K8S_INDEX, SLURM_INDEX, SLURM_MIN = "JOB_COMPLETION_INDEX", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN"


class ShardError(OneLineError, ValueError):
    """A --shard that cannot be used."""


@dataclass(frozen=True)
class Shard:
    index: int  # 1..count
    count: int
    host: str

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str, environ: Mapping[str, str] = os.environ) -> Shard:
    """"I/N" (1 <= I <= N), or "auto/N": the index from the scheduler's environment (JOB_COMPLETION_INDEX + 1, or
    SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN + 1)."""
    found = re.fullmatch(r"\s*(\d+|auto)\s*/\s*(\d+)\s*", text or "")
    if found is None:
        raise ShardError(f"--shard {text}: expected I/N (this copy's index from 1, and the number of copies), or "
                         "auto/N to take the index from JOB_COMPLETION_INDEX (Kubernetes) or SLURM_ARRAY_TASK_ID")
    count = int(found.group(2))
    index = _scheduler_index(environ, text) if found.group(1) == "auto" else int(found.group(1))
    if count < 1 or not 1 <= index <= count:
        raise ShardError(f"--shard {text}: the index must lie in 1..{count} (the shards are 1/{count} to "
                         f"{count}/{count})" if count >= 1 else f"--shard {text}: the number of shards must be >= 1")
    return Shard(index, count, host_name(environ))


def _scheduler_index(environ: Mapping[str, str], text: str) -> int:
    if environ.get(K8S_INDEX, "").isdigit():
        return int(environ[K8S_INDEX]) + 1
    if environ.get(SLURM_INDEX, "").isdigit():
        return int(environ[SLURM_INDEX]) - int(environ.get(SLURM_MIN) or 0) + 1
    raise ShardError(f"--shard {text}: neither {K8S_INDEX} (a Kubernetes Indexed Job) nor {SLURM_INDEX} (a Slurm "
                     "array) is set: give the index, e.g. --shard 1/4")


def unit_key(spec: PointSpec, launch_key: Callable[[PointSpec], Hashable]) -> Hashable:
    """What one shard runs whole: the point's launch (a server's engine configuration) and its configuration."""
    return (launch_key(spec), spec.method, spec.draft, spec.gamma, spec.gamma_schedule, spec.imposed_acceptance)


def shard_points(planned: list[PointSpec], launch_key: Callable[[PointSpec], Hashable], shard: Shard) -> list[PointSpec]:
    """The planned points shard `shard` runs, in plan order: every baseline, and the units assigned to it."""
    units: dict[Hashable, list[PointSpec]] = {}
    for spec in planned:
        if spec.method != "baseline":
            units.setdefault(unit_key(spec, launch_key), []).append(spec)
    loads, mine = [0] * shard.count, set()
    for key, specs in units.items():
        chosen = min(range(shard.count), key=lambda i: (loads[i], i))
        loads[chosen] += len(specs)
        if chosen == shard.index - 1:
            mine.add(key)
    return [spec for spec in planned if spec.method == "baseline" or unit_key(spec, launch_key) in mine]

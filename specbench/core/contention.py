"""Was the machine quiet while a point ran? On a shared box another process can make the same sweep report
half the speedup it would on a quiet one. Measured per point: the share of the machine's CPU time that
other processes took (Linux /proc/stat, minus this run's own processes), and the other processes holding
a context on the GPUs the point runs on (NVML: only those GPUs, so a sibling worker on another GPU does not count,
and never the run's own process tree nor the processes its launch claimed: an engine's workers are its own, also in a
container where NVML numbers them in the host's pid namespace, core/gpus.py `Claim`). `results` adds the spread of per-request TPOT
within the point and of each prompt's time across repeats, and flags a point that exceeds any limit."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from specbench.core import gpus as gpu_facts

OTHER_CPU_SHARE_LIMIT = 0.10  # other processes took more than 10 % of the machine's CPU time
REPEAT_SPREAD_LIMIT = 0.15  # a prompt's repeats differ by more than 15 % (median over prompts)
TPOT_SPREAD_LIMIT = 3.0  # p90 / p10 of per-request TPOT within a point
ADVICE = "repeat them on a quiet machine (--fresh), or stop the other load"


@dataclass(frozen=True)
class Conditions:
    other_cpu_share: float | None  # of the machine's CPU time (all cores) during the point; None without /proc
    gpu_other_processes: int | None  # other processes with a context on the GPU; None when not measured

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def _cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all CPUs since boot; busy includes time stolen by the hypervisor."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq + steal  # guest time is already inside user
    return busy, busy + idle + iowait


def _process_jiffies(pids: list[int]) -> dict[int, int]:
    """CPU ticks used so far by each of `pids` and their waited-for children (threads included)."""
    ticks = {}
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue  # gone: its time in the window is lost, which can only hide contention, never invent it
        fields = stat.rsplit(")", 1)[1].split()
        ticks[pid] = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return ticks


def _own_ticks(start: dict[int, int], end: dict[int, int]) -> int:
    """This run's CPU ticks in the window: per process, its ticks at the end less those at the start (all of
    them for one started meanwhile, e.g. a server launched for the point). A process stopped meanwhile (the
    previous launch's server) is left out: subtracting its lifetime ticks would invent contention."""
    return sum(ticks - start.get(pid, 0) for pid, ticks in end.items())


def process_tree(roots: Sequence[int]) -> set[int]:
    """`roots` and every process descended from them, from /proc (an engine forks workers; torch compiles in them)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo += children.get(pid, [])
    return tree


def others_on_gpus(samples: Sequence[gpu_facts.Sample], own: set[int]) -> int:
    """Processes on these GPUs that are not the run's own."""
    return len({pid for sample in samples for pid in sample.process_memory_mb} - own)


class ConditionsProbe:
    """Around a point: `with ConditionsProbe(own_pids, gpus=...) as probe: ...; probe.conditions`. `gpus` gives the
    UUIDs of the GPUs the point ran on, asked at its end (a server's are known once it is launched); none: not
    measured. `claimed` gives NVML's numbers for the launched engine's processes (its launch's claim)."""

    def __init__(self, own_pids: Callable[[], list[int]] = lambda: [os.getpid()], *,
                 gpus: Callable[[], Sequence[str]] = tuple, claimed: Callable[[], Collection[int]] = frozenset,
                 nvml: gpu_facts.Nvml | None = None):
        self.own_pids = own_pids
        self.gpus = gpus
        self.claimed = claimed
        self.nvml = nvml
        self.conditions = Conditions(None, None)

    def __enter__(self) -> "ConditionsProbe":
        self._start = _cpu_jiffies(), _process_jiffies(self.own_pids()), time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        (start, own_start, _), end = self._start, _cpu_jiffies()
        share = None
        if start is not None and end is not None and end[1] > start[1]:
            other = (end[0] - start[0]) - _own_ticks(own_start, _process_jiffies(self.own_pids()))
            share = min(1.0, max(0.0, other / (end[1] - start[1])))
        gpu_others = None
        uuids = tuple(self.gpus())
        nvml = self.nvml or (gpu_facts.open_nvml() if uuids else None)
        if uuids and nvml is not None:
            gpu_others = others_on_gpus(nvml.sample(uuids), process_tree(self.own_pids()) | set(self.claimed()))
        self.conditions = Conditions(share, gpu_others)


def repeat_spread(e2e_ms_by_prompt: list[list[float]]) -> float | None:
    """Median over prompts of (slowest / fastest repeat - 1); None with one repeat."""
    spreads = sorted(max(t) / min(t) - 1 for t in e2e_ms_by_prompt if len(t) > 1 and min(t) > 0)
    if not spreads:
        return None
    middle = len(spreads) // 2
    return spreads[middle] if len(spreads) % 2 else (spreads[middle - 1] + spreads[middle]) / 2


def unstable_reasons(*, other_cpu_share: float | None, gpu_other_processes: int | None,
                     repeat_spread: float | None, tpot_spread: float | None) -> list[str]:
    """Why a point's timing cannot be trusted; empty when nothing says so."""
    reasons = []
    if other_cpu_share is not None and other_cpu_share > OTHER_CPU_SHARE_LIMIT:
        reasons.append(f"other processes used {other_cpu_share:.0%} of the CPU")
    if gpu_other_processes:
        reasons.append(f"{gpu_other_processes} other process(es) on the GPU")
    if repeat_spread is not None and repeat_spread > REPEAT_SPREAD_LIMIT:
        reasons.append(f"repeats differ by {repeat_spread:.0%}")
    if tpot_spread is not None and tpot_spread > TPOT_SPREAD_LIMIT:
        reasons.append(f"TPOT p90/p10 {tpot_spread:.1f}")
    return reasons

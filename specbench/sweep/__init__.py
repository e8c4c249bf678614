"""`specbench run`: plan the points of a profile (plan), run them in one process (loop), one shard of them (shard) or
in local worker processes sharing the folder (local), and record every request (files)."""

from __future__ import annotations

from pathlib import Path

from specbench.profile import Profile, ProfileError
from specbench.core.results import default_out_dir
from specbench.sweep.files import ResumeError, RunFiles
from specbench.sweep.shard import Shard, ShardError
from specbench.sweep.loop import PointRun, RunResult, SilentObserver, SweepObserver, evaluate_point, run_sweep


def run_profile(profile: Profile, *, out: Path | None = None, fresh: bool = False, workers: int = 1,
                observer: SweepObserver | None = None, shard: Shard | None = None) -> RunResult:
    """Run (or resume) `profile` into `out` (default results/<profile name>, or results/<name>-shard<I>of<N>): in
    this process — all of it, or one shard — or in `workers` local processes."""
    if workers < 1:
        raise ShardError(f"--workers: must be an integer >= 1 (got {workers})")
    if shard is not None and workers != 1:
        raise ShardError("--shard: each shard runs its part in one process with its own folder; drop --workers")
    suffix = f"-shard{shard.index}of{shard.count}" if shard is not None else ""
    out_dir = out if out is not None else default_out_dir(profile.name, suffix=suffix)
    if workers == 1:
        return run_sweep(profile, out_dir=out_dir, fresh=fresh, observer=observer, shard=shard)
    if profile.capacity is not None:
        raise ProfileError(f"{profile.source or 'profile'}: capacity: a capacity search decides each probe from the "
                           "last, in one process: drop --workers")
    from specbench.sweep.local import run_local

    return run_local(profile, out_dir=out_dir, workers=workers, fresh=fresh, observer=observer)


__all__ = ["PointRun", "ResumeError", "RunFiles", "RunResult", "SilentObserver", "SweepObserver", "evaluate_point",
           "run_profile", "run_sweep"]

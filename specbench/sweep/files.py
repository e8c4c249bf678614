"""A run's files in its output folder: requests.parquet (one row per request), points.parquet (derived
from the requests every time it is written) and manifest.json; resuming what an earlier run left.

Every change re-reads the files under a file lock and rewrites them atomically, so concurrent workers
keep each other's points, every point is written once, and a run killed at any moment resumes with each
point exactly once."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

import specbench
from specbench.core.manifest import MANIFEST_FILE, Manifest, ManifestError, read_manifest, write_manifest
from specbench.core import results, summary
from specbench.core.contention import ADVICE
from specbench.profile import dump_profile
from specbench.core.results import PointSpec
from specbench.sweep.context import RunContext

if TYPE_CHECKING:
    from specbench.sweep.point import PointRun
from specbench.workloads.prompts import workload_fingerprint
from specbench.core.errors import OneLineError

# a point's constant columns: what ran it, how quiet the machine was meanwhile, and what a serving engine
# counted over the point (acceptance, peak memory, what it held: KV cache, queue, preemptions), what the point's GPUs
# showed (NVML), attached, the tokens other traffic took, and in a steady state what was sent around the window
CONTEXT_COLUMNS = ("backend", "target_model", "weight_mb", "point_key", "other_cpu_share", "gpu_other_processes",
                   "acceptance_source", "engine_drafts", "engine_draft_tokens", "engine_accepted_tokens",
                   "engine_accepted_per_position", "server_peak_rss_mb", "kv_cache", "kv_cache_reason",
                   "kv_cache_usage_peak", "kv_cache_usage_mean", "requests_running_peak", "requests_waiting_peak",
                   "preemptions", "metrics_samples", "gpu_count", "gpu_peak_memory_mb", "gpu_memory_source",
                   "gpu_process_match", "gpu_utilization_pct", "gpu_energy_j", "gpu_window_s", "gpu_samples", "gpu_peak_reserved_mb",
                   "engine_generated_tokens", "other_traffic_tokens", "engine_accept_length_gauge",
                   "lead_in_requests", "tail_requests", "window_s", "requests_waiting_growth", "queue_time_ms_mean",
                   "prefix_cache_reset", "vocabulary", "shared_tokens", "tree_breadth",
                   "series_t_ms", "series_requests_running", "series_requests_waiting", "series_kv_cache_usage",
                   "series_preemptions")


class ResumeError(OneLineError, ValueError):
    """The output folder holds a run of another configuration."""


class RunFiles:
    """The run's files in `out_dir`, shared by every process that writes to the folder."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.manifest_path = out_dir / MANIFEST_FILE

    @contextmanager
    def lock(self, name: str = "files") -> Iterator[None]:
        """An exclusive lock between the processes of this machine that share the folder."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / f".{name}.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def check_shard(self, shard, *, fresh: bool) -> None:
        """A folder written by one shard (or by a whole run) resumes only as the same: ResumeError otherwise."""
        if fresh or not self.manifest_path.exists():
            return
        previous = _recorded(self.manifest_path).shard
        was = f"shard {previous['index']}/{previous['count']}" if previous else "a whole run"
        now = f"shard {shard.label}" if shard is not None else "a whole run"
        if was != now:
            raise ResumeError(f"{self.out_dir}: holds {was}, this is {now}; use --fresh to replace it or --out DIR "
                              "to keep both")

    def open(self, ctx: RunContext, planned: list[PointSpec], *, fresh: bool, shard=None) -> list[PointSpec]:
        """Check the folder holds this run (or nothing), drop what cannot be resumed, write the
        manifest; returns the specs of done points that `planned` no longer holds."""
        with self.lock():
            keys = {spec.point_id: ctx.point_key(spec) for spec in planned}
            requests, context, earlier = _resume(self.out_dir, ctx.run_key, keys, fresh=fresh)
            if len(requests):  # the points it resumes were predicted with its verify timing: keep it
                ctx.reuse_verify_ms_by_tokens(_recorded(self.manifest_path).verify_ms_by_tokens)
            if not len(requests):
                (self.out_dir / results.REQUESTS_FILE).unlink(missing_ok=True)
            _write(self.out_dir, planned + earlier, requests, {}, context, slo=ctx.slo_limits(requests),
                   usd_per_hour=ctx.profile.usd_per_replica_hour,
                   verify_ms_by_tokens=ctx.verify_ms_by_tokens())
            started = _previous_start(self.manifest_path, fresh)
            written = manifest(ctx, started=started)
            if shard is not None:
                written.shard = {"index": shard.index, "count": shard.count, "host": shard.host,
                                 "points": [spec.point_id for spec in planned]}
            write_manifest(written, self.manifest_path)
        return earlier

    def recorded(self, spec: PointSpec, ctx: RunContext) -> pd.DataFrame | None:
        """The request rows of `spec` if the folder holds it done with the same configuration. Call it under
        `lock()` where other processes may be writing."""
        points = results.read_parquet(self.out_dir / results.POINTS_FILE)
        requests = results.read_parquet(self.out_dir / results.REQUESTS_FILE)
        if points is None or requests is None or not len(points):
            return None
        key = ctx.point_key(spec)
        done = points[(points["point_id"] == spec.point_id) & (points["status"] == "ok") & (points["point_key"] == key)]
        return requests[requests["point_key"] == key].reset_index(drop=True) if len(done) else None

    def record(self, spec: PointSpec | None, ctx: RunContext, run: PointRun | None = None, *,
               order: list[PointSpec] = ()) -> pd.DataFrame:
        """Add one point (its rows, or its failure) to the files, replacing an earlier record of it;
        points are listed in `order` first. Returns the points table as written."""
        with self.lock():
            specs, requests, failures, context = self._load()
            if spec is not None and run is not None:
                rows, error = run.rows, run.error
                if len(requests):
                    requests = requests[requests["point_id"] != spec.point_id]
                failures.pop(spec.point_id, None)
                if error is not None:
                    failures[spec.point_id] = error
                if rows:
                    requests = pd.concat([requests, pd.DataFrame(rows)], ignore_index=True) if len(requests) else pd.DataFrame(rows)
                context[spec.point_id] = {**ctx.point_context(spec), **run.conditions}
                specs = [s for s in specs if s.point_id != spec.point_id] + [spec]
            ordered = [s for s in order if s.point_id in {x.point_id for x in specs}]
            specs = ordered + [s for s in specs if s.point_id not in {x.point_id for x in ordered}]
            return _write(self.out_dir, specs, requests.reset_index(drop=True), failures, context,
                          slo=ctx.slo_limits(requests), usd_per_hour=ctx.profile.usd_per_replica_hour,
                   verify_ms_by_tokens=ctx.verify_ms_by_tokens())

    def finish(self, points: pd.DataFrame, ctx: RunContext | None = None) -> Manifest:
        """Mark the manifest finished (with what a server backend launched meanwhile); returns it."""
        with self.lock():
            data = read_manifest(self.manifest_path)
            described = ctx.session.describe() if ctx is not None else {}
            launched = described.get("server")
            if "compile" in described:  # buckets compiled after the start (a gamma beyond the profile's)
                data.compile = described["compile"]
            if launched is not None:
                previous = (data.server or {}).get("launches", [])
                data.server = {**launched, "launches": previous + [
                    launch for launch in launched["launches"] if launch not in previous]}
            data.finished_at = _now()
            data.status = "failed points" if (points["status"] == "failed").any() else "complete"
            data.conditions = conditions(points)
            write_manifest(data, self.manifest_path)
        return data

    def read(self) -> tuple[pd.DataFrame | None, pd.DataFrame]:
        """points and requests as the files hold them (requests empty when there are none)."""
        with self.lock():
            points = results.read_parquet(self.out_dir / results.POINTS_FILE)
            requests = results.read_parquet(self.out_dir / results.REQUESTS_FILE)
        return points, requests if requests is not None else pd.DataFrame()

    def _load(self):
        """specs, requests, failures and per-point context as the files hold them."""
        points = results.read_parquet(self.out_dir / results.POINTS_FILE)
        requests = results.read_parquet(self.out_dir / results.REQUESTS_FILE)
        if points is None or not len(points):
            return [], pd.DataFrame(), {}, {}
        specs = [PointSpec.from_row(row) for row in points.to_dict("records")]
        failures = {row["point_id"]: row["error"] for row in points[points["status"] == "failed"].to_dict("records")}
        return specs, requests if requests is not None else pd.DataFrame(), failures, _contexts(points)


def _contexts(points: pd.DataFrame) -> dict[str, dict[str, Any]]:
    return {row["point_id"]: {name: results.plain(row.get(name)) for name in CONTEXT_COLUMNS}
            for row in points.to_dict("records")}


def _resume(out_dir: Path, run_key: str, keys: dict[str, str], *, fresh: bool):
    """What an earlier run in `out_dir` left: the requests of points done with the same configuration,
    their constant columns, and the specs of done points the profile no longer plans. Failed points,
    points whose draft changed, and requests of points that were not finished are dropped (rerun)."""
    empty = pd.DataFrame(), {}, []
    manifest_path = out_dir / MANIFEST_FILE
    if fresh or not manifest_path.exists():
        for name in (results.REQUESTS_FILE, results.POINTS_FILE):
            (out_dir / name).unlink(missing_ok=True)
        return empty
    previous = read_manifest(manifest_path)
    if previous.run_key != run_key:
        raise ResumeError(
            f"{out_dir}: holds a run of another target, workload or run settings; "
            "use --fresh to replace it or --out DIR to keep both"
        )
    points = results.read_parquet(out_dir / results.POINTS_FILE)
    requests = results.read_parquet(out_dir / results.REQUESTS_FILE)
    if points is None or requests is None or not len(points):
        return empty
    ok = points[points["status"] == "ok"]
    current = ok[ok["point_key"] == ok["point_id"].map(keys)]
    unplanned = ok[~ok["point_id"].isin(set(keys))]
    kept = pd.concat([current, unplanned])
    requests = requests[requests["point_key"].isin(set(kept["point_key"]))]
    earlier = [PointSpec.from_row(row) for row in unplanned.to_dict("records")]
    return requests.reset_index(drop=True), _contexts(kept), earlier


def _write(out_dir: Path, specs: list[PointSpec], requests: pd.DataFrame, failures: dict[str, str],
           context: dict[str, dict[str, Any]], *, slo: dict[str, float],
           usd_per_hour: float | None = None, verify_ms_by_tokens: tuple[float, ...] = ()) -> pd.DataFrame:
    """requests first, then points: a point counts as done only once both hold it."""
    if len(requests):
        results.write_parquet_atomic(requests, out_dir / results.REQUESTS_FILE)
    points = summary.summarize(specs, requests, failures=failures, context=context, slo=slo,
                               usd_per_hour=usd_per_hour, verify_ms_by_tokens=verify_ms_by_tokens)
    results.write_parquet_atomic(points, out_dir / results.POINTS_FILE)
    return points


def conditions(points: pd.DataFrame) -> dict[str, Any]:
    """For the manifest: how quiet the machine was over the run, and which points cannot be trusted."""
    unstable = points[points["unstable"].eq(True).fillna(False)] if "unstable" in points else points.iloc[:0]
    share = points["other_cpu_share"].max() if "other_cpu_share" in points and len(points) else None
    return {"max_other_cpu_share": results.plain(share), "unstable_points": {
        row["point_id"]: row["unstable_reason"] for row in unstable.to_dict("records")},
        "advice": ADVICE if len(unstable) else None}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _recorded(manifest_path: Path) -> Manifest:
    try:
        return read_manifest(manifest_path)
    except ManifestError:
        return Manifest()


def _previous_start(manifest_path: Path, fresh: bool) -> str:
    if not fresh and manifest_path.exists():
        return read_manifest(manifest_path).started_at or _now()
    return _now()


def manifest(ctx: RunContext, *, started: str) -> Manifest:
    described = ctx.session.describe()
    return Manifest(
        specbench_version=specbench.__version__,
        run_key=ctx.run_key,
        profile=json.loads(json.dumps(ctx.profile.model_dump(mode="json"))),
        profile_toml=dump_profile(ctx.profile),
        profile_path=str(ctx.profile.source) if ctx.profile.source else None,
        models=described["models"],
        workload={"prompts": ctx.profile.workload.prompts, "fingerprint": workload_fingerprint(ctx.session.prompts),
                  "prompt_ids": [p.prompt_id for p in ctx.session.prompts],
                  "prompt_tokens": list(ctx.session.prompt_tokens),
                  "max_new_tokens": list(ctx.session.workload.max_new_tokens),
                  "stats": ctx.session.workload.stats()},
        environment=described["environment"],
        server=described.get("server"),
        compile=described.get("compile"),  # native: static caches and compiled steps, and what compiling cost
        # the target's forward pass at k = 1.. tokens (ms), timed once per run: the verify costs of the speedups
        # predicted from each draft's largest gamma (max_gamma_predicted_speedup)
        verify_ms_by_tokens=list(ctx.verify_ms_by_tokens()) or None,
        started_at=started,
        status="running",
    )

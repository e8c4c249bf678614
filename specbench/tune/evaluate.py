"""Where a trial's measurements come from. `Live` runs the point with the sweep runner (models loaded
once per process) and records it in the run's parquet files exactly as `specbench run` does; a point
the files already hold with the same configuration is reused, not rerun. `Replay` answers points from
a recorded run folder (points.parquet + requests.parquet): re-tune offline with a new objective or
constraint, and the deterministic test bed for the search itself.

Both hand the rows to `after_batch` after each prompt (all its repeats), so a trial can be pruned; a
prune raises `Pruned`, which passes through the runner's failure handling (it is not an Exception).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from specbench.core.manifest import MANIFEST_FILE, ManifestError, read_manifest
from specbench.core import results
from specbench.profile import Profile, ProfileError, profile_from_dict
from specbench.core.results import PointSpec
from specbench.sweep import RunFiles, evaluate_point
from specbench.sweep.context import RunContext
from specbench.sweep.files import CONTEXT_COLUMNS
from specbench.tune.objectives import TuneError

AfterBatch = Callable[[pd.DataFrame], None]


class Pruned(BaseException):
    """Raised by `after_batch` to stop a trial the pruner judged clearly worse."""

    def __init__(self, rows: pd.DataFrame):
        super().__init__("pruned")
        self.rows = rows


@dataclass(frozen=True)
class Outcome:
    rows: pd.DataFrame
    error: str | None
    evaluated: bool  # False: reused from a point already recorded in the run's files


class Evaluator(Protocol):
    def baseline(self, temperature: float, top_p: float, *, concurrency: int | None = 1,
                 request_rate: float | None = None) -> tuple[PointSpec, pd.DataFrame]: ...
    def run(self, spec: PointSpec, after_batch: AfterBatch) -> Outcome: ...
    def context(self, spec: PointSpec) -> dict[str, Any]: ...
    def verify_costs(self, max_tokens: int) -> tuple[float, ...]: ...
    def close(self) -> None: ...


class Live:
    def __init__(self, ctx: RunContext, files: RunFiles):
        self.ctx = ctx
        self.files = files

    def baseline(self, temperature: float, top_p: float, *, concurrency: int | None = 1,
                 request_rate: float | None = None) -> tuple[PointSpec, pd.DataFrame]:
        """Measured once per output folder and load level: local workers wait for the one that runs it."""
        spec = PointSpec.baseline(temperature, top_p, concurrency=concurrency, request_rate=request_rate)
        with self.files.lock("baseline"):
            with self.files.lock():  # never read a parquet file while another process replaces it
                rows = self.files.recorded(spec, self.ctx)
            if rows is None:
                run = evaluate_point(spec, self.ctx)
                self.files.record(spec, self.ctx, run)
                if run.error is not None:
                    raise TuneError(f"the baseline {spec.point_id} failed: {run.error}; every trial's speedup needs "
                                    "it: fix the target or the workload and rerun (finished trials are kept)")
                rows = pd.DataFrame(run.rows)
        return spec, rows

    def run(self, spec: PointSpec, after_batch: AfterBatch) -> Outcome:
        with self.files.lock():
            recorded = self.files.recorded(spec, self.ctx)
        if recorded is not None:
            return Outcome(recorded, None, evaluated=False)
        run = evaluate_point(spec, self.ctx, after_prompt=lambda so_far: after_batch(pd.DataFrame(so_far)))
        self.files.record(spec, self.ctx, run)
        return Outcome(pd.DataFrame(run.rows), run.error, evaluated=True)

    def context(self, spec: PointSpec) -> dict[str, Any]:
        return self.ctx.point_context(spec)

    def verify_costs(self, max_tokens: int) -> tuple[float, ...]:
        """The target's forward time for 1..max_tokens tokens, as the backend times it (empty where it
        cannot: the warm start then interpolates)."""
        return self.ctx.session.verify_costs(max_tokens)

    def close(self) -> None:
        """Record in the manifest what this worker's session launched (a server backend's launches, so what
        tune recommends can be checked against what ran), then stop it (a launched server with it)."""
        try:
            points, _ = self.files.read()
            if points is not None:
                self.files.finish(points, self.ctx)
        finally:
            self.ctx.session.close()


class Replay:
    def __init__(self, folder: Path):
        manifest_path = folder / MANIFEST_FILE
        points = results.read_parquet(folder / results.POINTS_FILE)
        requests = results.read_parquet(folder / results.REQUESTS_FILE)
        if not manifest_path.is_file() or points is None or requests is None:
            raise TuneError(f"--replay {folder}: not a run folder (needs manifest.json, points.parquet and "
                            "requests.parquet written by specbench run)")
        try:
            manifest = read_manifest(manifest_path)
            if manifest.profile_toml is None:
                raise ProfileError("it has no profile_toml")
            self.profile: Profile = profile_from_dict(tomllib.loads(manifest.profile_toml))
        except (ManifestError, tomllib.TOMLDecodeError, ProfileError) as error:
            raise TuneError(f"--replay {folder}: manifest.json: its profile cannot be used: {error}") from None
        hosts = sorted(points["host"].dropna().unique()) if "host" in points else []
        if len(hosts) > 1:  # `specbench merge` of several machines: a trial's speedup needs its own host's baseline
            raise TuneError(f"--replay {folder}: a merged folder of {len(hosts)} hosts ({', '.join(hosts)}); a replay "
                            "pairs every trial with one baseline, and a speedup across machines means nothing: replay "
                            "one shard's folder (each holds its own baselines)")
        self.folder = folder
        self.points = points[points["status"] == "ok"]
        self.requests = requests
        self.prompt_order = list(manifest.workload.get("prompt_ids") or dict.fromkeys(requests["prompt_id"]))
        # the target's forward pass at k = 1.. tokens, as the recorded run timed it (older recordings have none)
        self.verify_ms_by_tokens = tuple(float(v) for v in manifest.verify_ms_by_tokens or ())

    def baseline(self, temperature: float, top_p: float, *, concurrency: int | None = 1,
                 request_rate: float | None = None) -> tuple[PointSpec, pd.DataFrame]:
        spec = PointSpec.baseline(temperature, top_p, concurrency=concurrency, request_rate=request_rate)
        rows = self._rows(spec)
        if rows is None:
            raise TuneError(f"--replay {self.folder}: the recording has no baseline at temperature {temperature:g}, "
                            f"top_p {top_p:g}, {spec.load_level}")
        return spec, rows

    def run(self, spec: PointSpec, after_batch: AfterBatch) -> Outcome:
        rows = self._rows(spec)
        if rows is None:
            return Outcome(pd.DataFrame(), f"{spec.point_id} is not in the recording {self.folder}", evaluated=False)
        for count in range(1, len(self.prompt_order) + 1):
            after_batch(rows[rows["prompt_id"].isin(self.prompt_order[:count])])
        return Outcome(rows, None, evaluated=True)

    def verify_costs(self, max_tokens: int) -> tuple[float, ...]:
        """The recording's timing of the target's forward pass where it reaches `max_tokens`, as a live tune
        times it; else () and the warm start interpolates the recorded verify times."""
        return self.verify_ms_by_tokens[:max_tokens] if len(self.verify_ms_by_tokens) >= max_tokens else ()

    def close(self) -> None:
        pass

    def context(self, spec: PointSpec) -> dict[str, Any]:
        row = self._point(spec)
        return {name: row.get(name) for name in CONTEXT_COLUMNS} if row is not None else {}

    def _point(self, spec: PointSpec) -> dict[str, Any] | None:
        match = self.points[
            (self.points["method"] == spec.method) & (self.points["draft"] == spec.draft)
            & (self.points["temperature"] == spec.temperature) & (self.points["top_p"] == spec.top_p)
            & (self.points["gamma"].isna() if spec.gamma is None else self.points["gamma"] == spec.gamma)
            & (self.points["ngram_max"].isna() if spec.ngram_max is None else self.points["ngram_max"] == spec.ngram_max)
            & results.at_load(self.points, concurrency=spec.concurrency, request_rate=spec.request_rate)
        ]
        return match.iloc[0].to_dict() if len(match) else None

    def _rows(self, spec: PointSpec) -> pd.DataFrame | None:
        """The recorded requests of the point, relabelled with `spec`'s point id, in prompt order."""
        row = self._point(spec)
        if row is None:
            return None
        rows = self.requests[self.requests["point_key"] == row["point_key"]].copy()
        rows["point_id"] = spec.point_id
        order = {prompt: index for index, prompt in enumerate(self.prompt_order)}
        return rows.sort_values(["prompt_id", "repeat"], key=lambda c: c.map(order) if c.name == "prompt_id" else c,
                                kind="stable").reset_index(drop=True)

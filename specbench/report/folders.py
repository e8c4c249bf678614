"""Find and read result folders written by `specbench run`. A folder that cannot be read whole is
skipped with a one-line reason; the others still make a report."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from specbench.tune.document import RECOMMENDATION_FILE, Recommendation, RecommendationError, read_recommendation
from specbench.core.manifest import MANIFEST_FILE, Manifest, ManifestError, read_manifest
from specbench.capacity.document import CAPACITY_FILE, CapacityDocument, CapacityFileError, read_capacity
from specbench.core import results
from specbench.core.errors import OneLineError

TRIALS_FILE = "trials.parquet"  # written by `specbench tune`, with recommendation.json

# The columns the report reads; a folder missing any of them is skipped.
POINT_COLUMNS_USED = (
    "point_id", "status", "error", "method", "draft", "gamma", "temperature", "top_p", "tokens_per_s",
    "speedup", "speedup_ci_low", "speedup_ci_high", "predicted_speedup", "acceptance_rate",
    "mean_accepted_length", "accepted_per_position", "drafted_per_position", "ttft_ms_p50", "tpot_ms_p50",
    "tpot_ms_p90", "peak_memory_mb", "outputs_match_baseline",
)
REQUEST_COLUMNS_USED = ("point_id", "category", "output_tokens", "e2e_ms")
TRIAL_COLUMNS_USED = ("study", "number", "state", "role", "point_id", "draft", "gamma", "ngram_max", "temperature",
                      "top_p", "value", "predicted_speedup", "prompts_measured", *POINT_COLUMNS_USED[1:])


class ReportError(OneLineError, ValueError):
    """Bad input to `specbench report`: a missing path, no readable results, an unknown option value."""


@dataclass(frozen=True)
class Tune:
    """What `specbench tune` left in a folder: one row per trial of every study, and the recommendation
    (empty when recommendation.json is missing)."""

    trials: pd.DataFrame
    recommendation: Recommendation | None


@dataclass(frozen=True)
class Run:
    """One result folder: a sweep, a tune (its trials, and the points it measured) or both."""

    name: str
    path: Path
    points: pd.DataFrame
    requests: pd.DataFrame
    manifest: Manifest = field(default_factory=Manifest)
    tune: Tune | None = None
    capacity: CapacityDocument | None = None  # capacity.json (None when the folder has none)


@dataclass(frozen=True)
class Skipped:
    path: Path
    reason: str

    def __str__(self) -> str:
        return f"skipped {self.path}: {self.reason}"


def load_runs(paths: list[str | Path]) -> tuple[list[Run], list[Skipped]]:
    """Each path is a result folder or a parent folder of result folders (its direct subfolders).
    Raises ReportError for a missing path, a path with no result folders, or nothing readable."""
    if not paths:
        raise ReportError("no results given: pass one or more result folders (e.g. results/quickstart)")
    runs: list[Run] = []
    skipped: list[Skipped] = []
    for path in paths:
        for folder in _result_folders(path):
            run = _read_run(folder)
            (runs if isinstance(run, Run) else skipped).append(run)
    if not runs:
        reasons = "; ".join(str(s) for s in skipped)
        given = ", ".join(str(p) for p in paths)
        raise ReportError(f"no readable results in {given}" + (f" ({reasons})" if reasons else ""))
    return _unique_names(runs), skipped


def _result_folders(given: str | Path) -> list[Path]:
    if not str(given).strip():
        raise ReportError("an empty path was given: pass a result folder (e.g. results/quickstart)")
    path = Path(given)
    if not path.exists():
        raise ReportError(f"no such folder: {path}")
    if not path.is_dir():
        raise ReportError(f"{path} is not a folder: pass a result folder written by `specbench run`")
    if _looks_like_results(path):
        return [path]
    children = sorted(child for child in path.iterdir() if child.is_dir() and _looks_like_results(child))
    if not children:
        raise ReportError(f"no results in {path}: expected {results.POINTS_FILE} in it or in its direct subfolders")
    return children


def _looks_like_results(folder: Path) -> bool:
    names = (results.POINTS_FILE, results.REQUESTS_FILE, MANIFEST_FILE, TRIALS_FILE)
    return any((folder / name).exists() for name in names)


def _read_run(folder: Path) -> Run | Skipped:
    points_path, requests_path = folder / results.POINTS_FILE, folder / results.REQUESTS_FILE
    tune = _read_tune(folder) if (folder / TRIALS_FILE).exists() else None
    if isinstance(tune, str):
        return Skipped(folder, tune)
    if not points_path.exists() and tune is not None:  # a replayed tune: its points are its trials'
        return Run(name=folder.name, path=folder, points=_measured_points(tune.trials),
                   requests=pd.DataFrame(columns=list(REQUEST_COLUMNS_USED)), tune=tune)
    if not points_path.exists():
        return Skipped(folder, f"no {results.POINTS_FILE} (an unfinished or partial run?)")
    if not requests_path.exists():
        return Skipped(folder, f"no {results.REQUESTS_FILE} (an unfinished or partial run?)")
    points = _read_parquet(points_path, POINT_COLUMNS_USED)
    if isinstance(points, str):
        return Skipped(folder, points)
    requests = _read_parquet(requests_path, REQUEST_COLUMNS_USED)
    if isinstance(requests, str):
        return Skipped(folder, requests)
    if "error" in requests:  # a failed request (kept as a row with its error) has no output lengths or times
        requests = requests[requests["error"].isna()].reset_index(drop=True)
    manifest = _run_manifest(folder / MANIFEST_FILE)
    if isinstance(manifest, str):
        return Skipped(folder, manifest)
    capacity = _read_capacity(folder / CAPACITY_FILE) if (folder / CAPACITY_FILE).exists() else None
    if isinstance(capacity, str):
        return Skipped(folder, capacity)
    return Run(name=folder.name, path=folder, points=points, requests=requests, manifest=manifest, tune=tune,
               capacity=capacity)


def _read_tune(folder: Path) -> Tune | str:
    trials = _read_parquet(folder / TRIALS_FILE, TRIAL_COLUMNS_USED)
    if isinstance(trials, str):
        return trials
    path = folder / RECOMMENDATION_FILE
    try:
        recommendation = read_recommendation(path) if path.exists() else None
    except RecommendationError as error:
        return str(error)
    return Tune(trials=trials, recommendation=recommendation)


def _measured_points(trials: pd.DataFrame) -> pd.DataFrame:
    """The points a tune measured in full (its completed trials), once each, without the trial columns."""
    done = trials[trials["state"] == "COMPLETE"].drop_duplicates("point_id")
    columns = [c for c in results.POINT_COLUMNS if c in trials.columns]
    return done[columns].reset_index(drop=True)


def _read_parquet(path: Path, columns: tuple[str, ...]) -> pd.DataFrame | str:
    """The frame, or why it cannot be used."""
    try:
        frame = results.read_parquet(path)  # one whole version, should a run be writing the folder
    except Exception as error:  # pyarrow raises several types for truncated or foreign files
        return f"unreadable {path.name}: {_first_line(error).replace('<Buffer>', path.name)}"
    if frame is None:
        return f"{path.name} disappeared while being read"
    missing = [name for name in columns if name not in frame.columns]
    if missing:
        return f"{path.name} lacks columns: {', '.join(missing)}"
    return frame


def _run_manifest(path: Path) -> Manifest | str:
    """manifest.json (empty where the folder has none), or why it cannot be used."""
    if not path.exists():
        return Manifest()
    try:
        return read_manifest(path)
    except ManifestError as error:
        return str(error)


def _read_capacity(path: Path) -> CapacityDocument | str:
    """capacity.json, or why it cannot be used (the file and the key)."""
    try:
        return read_capacity(path)
    except CapacityFileError as error:
        return str(error)


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _unique_names(runs: list[Run]) -> list[Run]:
    """Runs are named by folder; two folders with one name are named by their paths instead."""
    names = [run.name for run in runs]
    return [run if names.count(run.name) == 1 else replace(run, name=str(run.path)) for run in runs]

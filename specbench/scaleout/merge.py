"""`specbench merge DIR... --out OUT`: the folders of one profile's shards (or of one profile run on several boxes)
as one result set. Every row keeps the speedup its own folder computed against its own baseline (never another
machine's); `host` and `shard` say where each ran. A point id held by several folders (every shard measures its own
baselines) becomes `<id>@<host>` in each, and so does a capacity search's configuration that several folders hold (each
shard searches its own baseline's capacity; every gain stays against its own host's). Folders of another profile or target are refused in one line, before
anything is written; a shard missing from the set, or one that has not finished, is said."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from specbench.core import results
from specbench.core.errors import OneLineError
from specbench.capacity.document import CAPACITY_FILE, CapacityFileError, read_capacity, write_capacity
from specbench.core.manifest import MANIFEST_FILE, Manifest, ManifestError, read_manifest, write_manifest


class MergeError(OneLineError, ValueError):
    """Folders that cannot be merged; nothing was written."""


@dataclass(frozen=True)
class Part:
    path: Path
    manifest: Manifest
    points: pd.DataFrame
    requests: pd.DataFrame

    @property
    def host(self) -> str:
        shard = self.manifest.shard or {}
        return str(shard.get("host") or (self.manifest.environment or {}).get("host") or self.path.name)

    @property
    def shard(self) -> str | None:
        shard = self.manifest.shard
        return f"{shard['index']}/{shard['count']}" if shard else None


@dataclass(frozen=True)
class Merged:
    out: Path
    points: int
    requests: int
    notes: list[str]


def read_part(path: Path) -> Part:
    names = (MANIFEST_FILE, results.POINTS_FILE, results.REQUESTS_FILE)
    if not path.is_dir() or not all((path / name).is_file() for name in names):
        raise MergeError(f"{path}: not a result folder (needs {', '.join(names)})")
    try:
        manifest = read_manifest(path / MANIFEST_FILE)
    except ManifestError as error:
        raise MergeError(f"{path}: {error}") from None
    return Part(path, manifest, results.read_parquet(path / results.POINTS_FILE),
                results.read_parquet(path / results.REQUESTS_FILE))


def _target(manifest: Manifest) -> str | None:
    return ((manifest.profile or {}).get("target") or {}).get("model")


def check_parts(parts: list[Part]) -> list[str]:
    """MergeError where the folders are not one profile's; the notes on shards missing or unfinished."""
    first = parts[0]
    for part in parts[1:]:
        if _target(part.manifest) != _target(first.manifest):
            raise MergeError(f"{part.path}: target {_target(part.manifest)}, {first.path}: target "
                             f"{_target(first.manifest)}: merge the folders of one profile")
        if part.manifest.profile != first.manifest.profile:
            differ = sorted(key for key in {*part.manifest.profile, *first.manifest.profile}
                            if part.manifest.profile.get(key) != first.manifest.profile.get(key))
            raise MergeError(f"{part.path}: a run of another profile than {first.path} (they differ in "
                             f"{', '.join(differ)}): merge the folders of one profile")
    notes = []
    shards = [part.manifest.shard for part in parts if part.manifest.shard]
    counts = {shard["count"] for shard in shards}
    if len(counts) > 1:
        raise MergeError(f"the folders are shards of different splits ({', '.join(f'of {c}' for c in sorted(counts))})"
                         ": merge the shards of one `--shard I/N` run")
    if shards:
        (count,) = counts
        seen = [shard["index"] for shard in shards]
        if duplicated := sorted({i for i in seen if seen.count(i) > 1}):
            raise MergeError(f"shard {duplicated[0]}/{count} is given twice: give each shard's folder once")
        if missing := sorted(set(range(1, count + 1)) - set(seen)):
            notes.append(f"shard {', '.join(f'{i}/{count}' for i in missing)} missing: its points are not in the "
                         "merged set")
    for part in parts:
        if part.manifest.status != "complete":
            notes.append(f"{part.path}: {'unfinished' if part.manifest.status == 'running' else part.manifest.status}"
                         f" ({part.manifest.status or 'no status'}): run it again to finish, then merge again")
        planned = set((part.manifest.shard or {}).get("points") or ())
        if planned - set(part.points["point_id"]):
            notes.append(f"{part.path}: {len(planned - set(part.points['point_id']))} of its planned points not "
                         "recorded")
    return notes


def merge(folders: list[Path], *, out: Path) -> Merged:
    if len(folders) < 2:
        raise MergeError("give two result folders or more (the shards of one run)")
    if out.exists() and any(out.iterdir()):
        raise MergeError(f"--out {out}: exists and is not empty: give a new folder")
    parts = [read_part(Path(folder)) for folder in folders]
    notes = check_parts(parts)
    counts = pd.concat([part.points["point_id"] for part in parts]).value_counts()
    shared = set(counts[counts > 1].index)
    points, requests = [], []
    for part in parts:
        rename = {point_id: f"{point_id}@{part.host}" for point_id in shared}
        points.append(part.points.assign(point_id=part.points["point_id"].replace(rename), host=part.host,
                                         shard=part.shard))
        requests.append(part.requests.assign(point_id=part.requests["point_id"].replace(rename), host=part.host,
                                             shard=part.shard))
    merged_points = pd.concat(points, ignore_index=True)
    merged_requests = pd.concat(requests, ignore_index=True)
    if merged_points["point_id"].duplicated().any():
        twice = merged_points.loc[merged_points["point_id"].duplicated(), "point_id"].iloc[0]
        raise MergeError(f"point {twice} is held twice by one host: give each host's folder once")
    out.mkdir(parents=True, exist_ok=True)
    results.write_parquet_atomic(merged_requests, out / results.REQUESTS_FILE)
    results.write_parquet_atomic(merged_points, out / results.POINTS_FILE)
    capacity = _merged_capacity(parts)
    if capacity is not None:
        write_capacity(capacity, out)
    manifest = parts[0].manifest
    manifest.shard = None
    manifest.status = "complete" if all(part.manifest.status == "complete" for part in parts) and not notes else \
        "merged with notes"
    manifest.merged = [{"folder": str(part.path), "host": part.host, "shard": part.shard,
                        "status": part.manifest.status} for part in parts]
    write_manifest(manifest, out / MANIFEST_FILE)
    return Merged(out, len(merged_points), len(merged_requests), notes)


def _merged_capacity(parts: list[Part]):
    """Every folder's capacity.json entries in one document (None where no folder has one)."""
    documents = []
    for part in parts:
        if (part.path / CAPACITY_FILE).exists():
            try:
                documents.append((part, read_capacity(part.path / CAPACITY_FILE)))
            except CapacityFileError as error:
                raise MergeError(f"{part.path}: {error}") from None
    if not documents:
        return None
    keys = [(e.configuration, e.temperature, e.top_p, e.axis) for _, document in documents
            for e in document.configurations]
    shared = {key for key in keys if keys.count(key) > 1}
    entries = [replace(entry, configuration=f"{entry.configuration} @{part.host}")
               if (entry.configuration, entry.temperature, entry.top_p, entry.axis) in shared else entry
               for part, document in documents for entry in document.configurations]
    return replace(documents[0][1], configurations=tuple(entries))

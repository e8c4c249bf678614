"""manifest.json, typed: what a run was (its profile, models, workload, machine, engine launches) and how it went,
written and read here only.

`specbench run` writes it when a run starts and again when it finishes (and after each capacity search); resuming
reads its run key, its start and the target's verify costs back; `specbench tune --replay` reads the profile and
the prompt order; `specbench report` the rest. The file carries a `version`; files written before it had none and
read as version 1."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specbench.core.documents import check_version, checked_object, known, read_object, write_document
from specbench.core.errors import OneLineError

MANIFEST_FILE = "manifest.json"
VERSION = 1
OPTIONAL = ("server", "compile", "verify_ms_by_tokens", "conditions", "capacity", "shard", "merged")  # left out of the file when None


class ManifestError(OneLineError, ValueError):
    """A manifest.json that cannot be read; the message names the file and the key."""


@dataclass
class Manifest:
    """Every key `specbench run` writes; a reader takes what a (partial or older) file has and None for the rest."""

    run_key: str | None = None  # what a resumed run must share: target, workload, run settings
    profile: dict[str, Any] = field(default_factory=dict)  # the profile as data
    profile_toml: str | None = None  # the profile as a file: `specbench run` reads it back to an equal profile
    started_at: str | None = None
    specbench_version: str | None = None
    profile_path: str | None = None
    models: dict[str, Any] = field(default_factory=dict)  # target and drafts: reference, identity, dtype, bytes
    workload: dict[str, Any] = field(default_factory=dict)  # prompts, fingerprint, prompt ids, token lengths, stats
    environment: dict[str, Any] = field(default_factory=dict)  # machine, devices, library versions
    finished_at: str | None = None
    status: str | None = None  # running, complete, or failed points
    server: dict[str, Any] | None = None  # the server backend: the engine and every launch
    compile: dict[str, Any] | None = None  # native: static caches and compiled steps, what compiling cost
    verify_ms_by_tokens: list[float] | None = None  # the target's forward pass at k = 1.. tokens, timed once
    conditions: dict[str, Any] | None = None  # how quiet the machine was, the points that cannot be trusted
    capacity: list[dict[str, Any]] | None = None  # each capacity search's decisions (capacity.json has the rest)
    # `run --shard I/N`: {"index", "count", "host", "points": the planned point ids this shard runs}
    shard: dict[str, Any] | None = None
    # `specbench merge`: each folder merged, its host, shard and status
    merged: list[dict[str, Any]] | None = None
    version: int = VERSION

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {key: value for key, value in data.items() if not (key in OPTIONAL and value is None)}


def manifest_from_dict(data: Any, *, source: str = MANIFEST_FILE) -> Manifest:
    """The manifest, or a ManifestError naming the file and the key that makes it unusable."""
    data = checked_object(data, source=source, error=ManifestError)
    check_version(data, version=VERSION, source=source, error=ManifestError,
                  again="run it again with this version's `specbench run --fresh`")
    values = known(Manifest, data)
    for key in ("profile", "models", "workload", "environment"):
        if key in values and not isinstance(values[key], dict):
            raise ManifestError(f"{source}: `{key}` is not an object")
    return Manifest(**values)


def write_manifest(manifest: Manifest, path: Path) -> None:
    write_document(manifest.to_dict(), path)


def read_manifest(path: Path) -> Manifest:
    return manifest_from_dict(read_object(path, ManifestError), source=path.name)

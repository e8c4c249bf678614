"""GGUF -> safetensors cache: a GGUF file is converted once to ``cache_dir()/gguf/<sha256[:16]>/``.

The file's sha256 is remembered in ``cache_dir()/gguf/index.json`` (keyed by path, size and mtime),
so a multi-GB file is hashed once.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from specbench.models.registry import ModelError, Progress, cache_dir, short_reason

_CHUNK_BYTES = 1 << 20


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def gguf_sha256(path: Path) -> str:
    """The file's sha256, remembered in a sidecar index keyed by path + size + mtime."""
    index_path = cache_dir() / "gguf" / "index.json"
    stat = path.stat()
    key = str(path.resolve())
    stamp = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    index = json.loads(index_path.read_text()) if index_path.is_file() else {}
    entry = index.get(key)
    if entry is not None and {k: entry.get(k) for k in stamp} == stamp:
        return entry["sha256"]
    sha256 = _sha256_file(path)
    index[key] = {**stamp, "sha256": sha256}
    _write_atomic(index_path, json.dumps(index, indent=1, sort_keys=True))
    return sha256


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """Hide transformers' weight-loading progress bars (the GGUF dequantization bar stays)."""
    from transformers.utils import logging as hf_logging

    were_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if were_enabled:
            hf_logging.enable_progress_bar()


def save_dequantized(model: torch.nn.Module, tokenizer: Any, dest: Path) -> None:
    """Save a GGUF-loaded model (which refuses save_pretrained) as a plain safetensors folder.

    Rebuilds the architecture from its config without `quantization_config`, loads the
    dequantized state dict into it, re-ties shared weights and saves it with the tokenizer.
    """
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):  # no random init: every tensor comes from the state dict
        rebuilt = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    rebuilt.load_state_dict(model.state_dict(), strict=True, assign=True)
    rebuilt.tie_weights()
    rebuilt.generation_config = copy.deepcopy(model.generation_config)
    rebuilt.save_pretrained(dest)
    tokenizer.save_pretrained(dest)


def _conversion_folder(sha256: str) -> Path:
    return cache_dir() / "gguf" / sha256[:16]


def converted_folder(gguf_path: Path) -> Path | None:
    """The safetensors folder of a GGUF file if it is already converted, else None (converts nothing)."""
    folder = _conversion_folder(gguf_sha256(Path(gguf_path)))
    return folder if (folder / "config.json").is_file() else None


def convert_gguf(gguf_path: Path, *, progress: Progress = None) -> Path:
    """The safetensors folder for a GGUF file, converting it once (keyed by the file's sha256)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    sha256 = gguf_sha256(gguf_path)
    folder = _conversion_folder(sha256)
    if (folder / "config.json").is_file():
        return folder
    if progress is not None:
        progress(f"converting {gguf_path.name} to safetensors (once; may take a minute)")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{sha256[:16]}-", dir=folder.parent))
    try:
        with no_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(
                gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
            )
            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        save_dequantized(model, tokenizer, tmp)
        source = {"gguf_file": gguf_path.name, "sha256": sha256}
        (tmp / "specbench_source.json").write_text(json.dumps(source, indent=1) + "\n")
        if not (folder / "config.json").is_file():  # else a concurrent conversion finished first
            os.rename(tmp, folder)
    except (OSError, ValueError, KeyError) as error:
        raise ModelError(f"cannot convert GGUF file {gguf_path}: {short_reason(error)}") from error
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder

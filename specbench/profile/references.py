"""References in a profile, resolved where they enter: models (builtin:NAME, a hub id, a local folder or GGUF file;
for an EAGLE-3 draft also trained:PRESET, the head `specbench heads train` distils for the target) and prompt sets (builtin:SET, a .jsonl/.csv file, a ShareGPT .json file); paths relative to the profile's folder."""

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, StrictStr, ValidationInfo

from specbench.models.registry import BUILTIN_MODELS, is_builtin
from specbench.profile.validation import rule as _rule
from specbench.profile.validation import show as _show
from specbench.workloads.prompts import BUILTIN_SETS

_RELATIVE_NOTE = "(paths are relative to the profile's folder)"
TRAINED_PREFIX = "trained:"
# the settings `specbench heads train` has names for: its defaults, and --quick (specbench.heads.distill.PRESETS)
TRAINED_PRESETS = ("default", "quick")


def is_trained_head(reference: str) -> bool:
    return reference.startswith(TRAINED_PREFIX)


def base_dir(info: ValidationInfo) -> Path:
    return (info.context or {}).get("base_dir") or Path.cwd()


def _absolute(text: str, folder: Path) -> Path:
    path = Path(text).expanduser()
    return (path if path.is_absolute() else folder / path).resolve()


def _resolve_model(reference: str, info: ValidationInfo) -> str:
    """builtin:NAME and hub ids stay as written; local paths become absolute and must exist."""
    if not reference.strip():
        raise _rule('must not be empty (set model = "builtin:..." or a hub id/path)')
    if is_builtin(reference):
        name = reference.partition(":")[2]
        if name not in BUILTIN_MODELS:
            raise _rule(f'unknown builtin model "{name}" (known: {", ".join(BUILTIN_MODELS)})')
        return reference
    if is_trained_head(reference):
        preset = reference.removeprefix(TRAINED_PREFIX)
        if preset not in TRAINED_PRESETS:
            raise _rule(f'unknown trained head "{preset}" (known: {", ".join(TRAINED_PRESETS)}: the settings of '
                        f'`specbench heads train` and of its --quick)')
        return reference
    folder = base_dir(info)
    is_path = reference.startswith((".", "/", "~")) or reference.endswith(".gguf")
    if not (is_path or (folder / reference).is_dir()):
        return reference  # a hub id, e.g. Qwen/Qwen2.5-0.5B-Instruct
    path = _absolute(reference, folder)
    if not path.exists():
        raise _rule(f"not found: {path} {_RELATIVE_NOTE}")
    return str(path)


def _resolve_prompts(prompts: str, info: ValidationInfo) -> str:
    """builtin:SET stays as written; a .jsonl/.csv file (or a ShareGPT .json) becomes absolute and must exist."""
    if prompts.startswith("builtin:"):
        name = prompts.removeprefix("builtin:")
        if name not in BUILTIN_SETS:
            raise _rule(f'unknown builtin prompt set "{name}" (known: {", ".join(BUILTIN_SETS)})')
        return prompts
    if Path(prompts).suffix not in (".jsonl", ".csv", ".json"):
        raise _rule(f'must be "builtin:SET", a .jsonl/.csv file or a ShareGPT .json file (got {_show(prompts)})')
    path = _absolute(prompts, base_dir(info))
    if not path.is_file():
        raise _rule(f"file not found: {path} {_RELATIVE_NOTE}")
    return str(path)


ModelReference = Annotated[StrictStr, AfterValidator(_resolve_model)]
PromptsReference = Annotated[StrictStr, AfterValidator(_resolve_prompts)]

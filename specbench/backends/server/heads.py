"""EAGLE-3 heads on the engines, settled before anything launches: `trained:PRESET` distilled for the target (or
taken from the cache), a head folder (or a hub id, downloaded) checked against the target (an EAGLE-3 config, its hidden size,
vocabulary and auxiliary layers), a head in the speculators format or with `pytorch_model.bin` weights converted once
to vLLM's own format (config.json + model.safetensors, cached by the head's identity) for every engine but vLLM,
which reads both itself, and for llama.cpp, which loads GGUF files, the folder converted once by llama.cpp's
own converter (`convert_hf_to_gguf.py --target-model-dir`, cached by the head's and the target's identities).

The converter is found beside the llama-server binary (a llama.cpp checkout's `convert_hf_to_gguf.py` above
`build/bin/`, or the `convert/` folder `make engine-llama.cpp` unpacks next to its build), or at
$SPECBENCH_LLAMA_CONVERTER; it runs under this Python and imports llama.cpp's own `gguf-py` beside it (PyPI's gguf
may predate the EAGLE-3 architecture)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specbench.engines import ServingEngine
from specbench.heads.reference import head_folder_reference
from specbench.models.registry import cache_dir
from specbench.models.gguf import gguf_sha256
from specbench.models.load import hf_folder, resolve_model
from specbench.models.eagle3 import HeadError, convert_head, fit_to_target, head_folder, read_config, variant
from specbench.models.eagle3_formats import SPECULATORS, weight_files
from specbench.models.load import folder_identity
from specbench.profile import Profile, ProfileError

CONVERTER = "convert_hf_to_gguf.py"
CONVERTER_ENV = "SPECBENCH_LLAMA_CONVERTER"
CONVERT_TIMEOUT_S = 600.0
HEAD_METHODS = ("eagle3",)
READS_EVERY_FORMAT = ("vllm",)  # engines given a speculators-format or .bin head as it is
CONVERSION_VERSION = 1  # of the conversion to vLLM's own format (keys its cache)


@dataclass(frozen=True)
class EngineHead:
    reference: str  # what the engine loads: a folder, a hub id, or (llama.cpp) a GGUF file
    identity: str  # the folder's content hash, or the reference where nothing local says more
    folder: str | None  # the head's folder, when local


def engine_heads(profile: Profile, engine: ServingEngine, *, binary: str | None, where: str,
                 say: Callable[[str], None]) -> dict[str, EngineHead]:
    """Per EAGLE-3 draft name, the head as `engine` loads it; ProfileError (one line naming the draft's key) for a
    head that is not EAGLE-3, does not fit the target, or that llama.cpp cannot be given."""
    heads: dict[str, EngineHead] = {}
    for index, draft in enumerate(profile.drafts):
        if draft.method not in HEAD_METHODS:
            continue
        key = f"{where}drafts[{index}].model"
        try:
            reference = head_folder_reference(draft.model, target=profile.target.model, device=profile.device,
                                              say=say)
            heads[draft.name] = _engine_head(reference, profile.target.model, engine, binary=binary, say=say)
        except HeadError as error:
            raise ProfileError(f"{key}: {error}") from None
    return heads


def _engine_head(reference: str, target: str, engine: ServingEngine, *, binary: str | None,
                 say: Callable[[str], None]) -> EngineHead:
    if reference.lower().endswith(".gguf"):
        if not engine.loads_gguf:
            raise HeadError(f"{reference}: {engine.name} loads EAGLE-3 heads as Hugging Face folders or hub ids, "
                            "not GGUF files; point model at the head's folder")
        check_gguf_head(Path(reference))
        return EngineHead(reference, gguf_sha256(Path(reference)), None)
    hub_id = None if Path(reference).is_dir() else reference
    folder = head_folder(reference)  # a hub id: downloaded once into the Hugging Face cache, to check and convert
    config = read_config(folder, native=False)
    target_folder = _target_folder(target)
    if target_folder is not None:
        from transformers import AutoConfig

        fit_to_target(config, AutoConfig.from_pretrained(target_folder), where=str(folder / "config.json"))
    identity = folder_identity(folder)
    given = folder
    if engine.name not in READS_EVERY_FORMAT and needs_conversion(folder, config):
        if what := variant(config.to_dict()):
            raise HeadError(f"{folder / 'config.json'}: {what}: {engine.name} is given heads in vLLM's own format, "
                            "and specbench converts only the heads it runs itself; run this one on vLLM "
                            '(engine = "vllm"), which reads it as it is')
        given = converted_head(folder, say=say)
    if not engine.loads_gguf:  # a hub id as given: the engine finds it in the same cache
        return EngineHead(str(given) if given != folder else hub_id or str(folder), identity, str(folder))
    if target_folder is None:
        raise HeadError(f"{folder}: converting a head for llama.cpp needs the target's local folder "
                        f"(--target-model-dir); {target} is not local")
    gguf = head_gguf(given, target_folder, converter=find_converter(binary), say=say)
    return EngineHead(str(gguf), identity, str(folder))


def needs_conversion(folder: Path, config) -> bool:
    """A head in the speculators format or with .bin weights (not vLLM's own format with safetensors)."""
    files = weight_files(folder)
    return getattr(config, "source_format", None) == SPECULATORS or (bool(files) and files[0].suffix == ".bin")


def converted_head(folder: Path, *, say: Callable[[str], None]) -> Path:
    """The head in vLLM's own format (config.json + model.safetensors), converted once per head: cached under
    cache_dir()/heads-converted/, keyed by the source folder's identity; moved into place whole."""
    key = hashlib.sha256(f"{CONVERSION_VERSION}\0{folder_identity(folder)}".encode()).hexdigest()[:16]
    out = cache_dir() / "heads-converted" / key
    if out.is_dir():
        return out
    say(f"converting the EAGLE-3 head {folder} to vLLM's own format (config.json + model.safetensors), once: {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=out.parent))
    try:
        convert_head(folder, tmp)
        if not out.exists():  # a concurrent run that finished first wins
            os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _target_folder(target: str) -> Path | None:
    """The target's Hugging Face folder (a GGUF converted once), None for a hub id."""
    return None if resolve_model(target).kind == "hub" else hf_folder(target)


def check_gguf_head(path: Path) -> None:
    """A GGUF file whose architecture is EAGLE-3 (HeadError otherwise)."""
    from gguf import GGUFReader

    if not path.is_file():
        raise HeadError(f"{path}: no such file; point to the head's .gguf file or its folder")
    try:
        field = GGUFReader(str(path)).fields.get("general.architecture")
        architecture = bytes(field.parts[field.data[0]]).decode() if field is not None else None
    except (OSError, ValueError, IndexError) as error:
        raise HeadError(f"{path}: not a readable GGUF file ({error}); convert the head again") from None
    if architecture != "eagle3":
        raise HeadError(f"{path}: general.architecture: {architecture!r} is not an EAGLE-3 head (\"eagle3\"); "
                        "point to a head converted with llama.cpp's convert_hf_to_gguf.py --target-model-dir")


def find_converter(binary: str | None) -> Path:
    """llama.cpp's convert_hf_to_gguf.py: $SPECBENCH_LLAMA_CONVERTER, else the nearest one above llama-server."""
    override = os.environ.get(CONVERTER_ENV)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise HeadError(f"{CONVERTER_ENV}={override}: no such file; point it at llama.cpp's {CONVERTER}")
        return path
    if binary is not None:
        for folder in Path(binary).resolve().parents:
            for candidate in (folder / CONVERTER, folder / "convert" / CONVERTER):
                if candidate.is_file():
                    return candidate
    raise HeadError(f"llama.cpp runs EAGLE-3 heads as GGUF files and its converter ({CONVERTER}) was not found "
                    f"above {binary or 'llama-server'}: run `make engine-llama.cpp` (it unpacks the converter), set "
                    f"{CONVERTER_ENV} to a llama.cpp checkout's {CONVERTER}, or point model at the head's .gguf")


def head_gguf(folder: Path, target_folder: Path, *, converter: Path, say: Callable[[str], None]) -> Path:
    """The head converted to a GGUF file for llama.cpp (f32: the numerics the other backends run), once per head,
    target and converter; cached under cache_dir()/heads-gguf/."""
    key = hashlib.sha256("\0".join((folder_identity(folder), folder_identity(target_folder),
                                    _file_identity(converter))).encode()).hexdigest()[:16]
    out = cache_dir() / "heads-gguf" / key / "head.gguf"
    if out.is_file():
        return out
    say(f"converting the EAGLE-3 head {folder} to GGUF for llama.cpp (once) with {converter}")
    to_gguf(folder, out, converter=converter, target_folder=target_folder)
    return out


def to_gguf(folder: Path, out: Path, *, converter: Path, target_folder: Path | None = None,
            outtype: str = "f32") -> Path:
    """Convert a Hugging Face folder (a model, or with `target_folder` an EAGLE-3 head) to one GGUF file with
    llama.cpp's converter; written whole or not at all. HeadError with the converter's last line on failure."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=out.parent)) / out.name
    argv = [sys.executable, str(converter), str(folder), "--outfile", str(tmp), "--outtype", outtype]
    if target_folder is not None:
        argv += ["--target-model-dir", str(target_folder)]
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}  # the converter puts its gguf-py first
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CONVERT_TIMEOUT_S, env=env)
        if done.returncode != 0 or not tmp.is_file():
            lines = (done.stderr or done.stdout).strip().splitlines()
            raise HeadError(f"{folder}: llama.cpp's converter failed ({lines[-1] if lines else done.returncode}); "
                            f"run it by hand to see why: {' '.join(argv)}")
        os.replace(tmp, out)
    except subprocess.TimeoutExpired:
        raise HeadError(f"{folder}: llama.cpp's converter took over {CONVERT_TIMEOUT_S:g} s") from None
    finally:
        tmp.unlink(missing_ok=True)
        tmp.parent.rmdir()
    return out


def _file_identity(path: Path) -> str:
    stat = path.stat()
    return hashlib.sha256(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()

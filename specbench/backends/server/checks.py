"""What the server backend finds and refuses up front, before any engine starts (one line naming the key and the
fix): the engine's binary (or the Python that has it), the API key's variable, an argv
template with a placeholder it does not know, extra arguments that set what specbench chooses (the host and port
it launches on), and a workload whose prompt plus output budget does not fit the context the engine serves — the
target's own window (its config's max_position_embeddings), or the one the engine's flags set (vLLM
`--max-model-len`, SGLang `--context-length`, llama.cpp `-c`/`--ctx-size`, shared among `-np` slots)."""

from __future__ import annotations

import json
import os
import shutil
import string
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from specbench.engines import ServingEngine
from specbench.models.gguf import converted_folder
from specbench.models.load import resolve_model
from specbench.profile import Profile, ProfileError
from specbench.workloads.build import Workload

PLACEHOLDERS = ("target", "draft", "host", "port")
CHOSEN_FLAGS = ("--host", "--port")  # specbench launches on 127.0.0.1 and a free port
CONTEXT_FLAGS = {"vllm": ("--max-model-len",), "sglang": ("--context-length",), "llama.cpp": ("-c", "--ctx-size")}


def check_command(command: tuple[str, ...] | None, where: str) -> None:
    """Every {placeholder} of an argv template is one specbench fills in."""
    known = ", ".join(f"{{{name}}}" for name in PLACEHOLDERS)
    for part in command or ():
        try:
            fields = [field for _, field, _, _ in string.Formatter().parse(part) if field is not None]
        except ValueError as error:
            raise ProfileError(f"{where}server.command: {part!r} is not a valid template ({error}); the known "
                               f"placeholders are {known} (write {{{{ and }}}} for literal braces)") from None
        for field in fields:
            if field not in PLACEHOLDERS:
                raise ProfileError(f"{where}server.command: unknown placeholder {{{field}}} in {part!r}; the known "
                                   f"placeholders are {known} (write {{{{ and }}}} for literal braces)")


def check_extra_args(extra_args: tuple[str, ...], where: str, *, gpu_flags: tuple[str, ...] = ()) -> None:
    """No extra argument sets what specbench chooses: the host and port, and on GPUs how many the launch uses."""
    for arg in extra_args:
        flag = arg.split("=", 1)[0]
        if flag in CHOSEN_FLAGS:
            raise ProfileError(f"{where}server.extra_args: {flag} is chosen by specbench (it launches the engine on "
                               "127.0.0.1 and a free port); remove it, or start the server yourself and set server.url")
        if flag in gpu_flags:
            raise ProfileError(f"{where}server.extra_args: {flag} is set by specbench on GPUs (every layer offloaded, "
                               "server.tensor_parallel GPUs per launch); remove it, and set server.tensor_parallel or "
                               "server.gpus instead")


def flag_value(args: tuple[str, ...] | list[str], names: tuple[str, ...]) -> str | None:
    """The value the last of `names` is given in an argv (`--flag value` or `--flag=value`)."""
    found = None
    for i, arg in enumerate(args):
        flag, equals, value = arg.partition("=")
        if flag in names:
            found = value if equals else (args[i + 1] if i + 1 < len(args) else None)
    return found


def served_window(engine: str, extra_args: tuple[str, ...], model_window: int | None) -> tuple[int, str] | None:
    """The most tokens (prompt and output) one request can have on this engine, and what sets it; None when nothing
    says. llama.cpp: `-c` (0: the model's) is shared by the `-np` slots unless the KV cache is unified (measured on
    llama-server 0.6: `-c 0 -np 4` gives each slot the model's whole window)."""
    limits = [(model_window, "the target's max_position_embeddings")] if model_window else []
    names = CONTEXT_FLAGS.get(engine, ())
    value = flag_value(extra_args, names)
    size = int(value) if value is not None and value.isdigit() else 0  # llama.cpp -c 0: the model's
    if size > 0 and engine == "llama.cpp":
        slots = flag_value(extra_args, ("-np", "--parallel"))
        unified = any(arg in ("-kvu", "--kv-unified") for arg in extra_args)
        if slots is not None and slots.isdigit() and int(slots) > 1 and not unified:
            limits.append((size // int(slots), f"-c {size} shared by -np {slots} slots in server.extra_args"))
        else:
            limits.append((size, f"-c {size} in server.extra_args"))
    elif size > 0:
        limits.append((size, f"{names[0]} {size} in server.extra_args"))
    return min(limits, key=lambda limit: limit[0]) if limits else None


def model_window(ref: str) -> int | None:
    """The target's context window as its config states it (a GGUF's converted config, or its own metadata); None
    where nothing says (a hub model not in the local cache)."""
    from specbench.backends.inprocess import context_window

    source = resolve_model(ref)
    folder = Path(source.location) if source.kind != "gguf" else converted_folder(Path(source.location))
    if source.kind == "hub":
        try:
            from transformers import AutoConfig

            return context_window(AutoConfig.from_pretrained(source.location, revision=source.revision,
                                                             local_files_only=True))
        except (OSError, ValueError):
            return None
    if folder is not None and (folder / "config.json").is_file():
        return context_window(SimpleNamespace(**json.loads((folder / "config.json").read_text())))
    return _gguf_window(Path(source.location)) if source.kind == "gguf" else None


def _gguf_window(path: Path) -> int | None:
    from gguf import GGUFReader

    fields: dict[str, Any] = GGUFReader(path).fields
    arch = fields.get("general.architecture")
    if arch is None:
        return None
    name = bytes(arch.parts[arch.data[0]]).decode()
    field = fields.get(f"{name}.context_length")
    return int(field.parts[field.data[0]][0]) if field is not None else None


def check_context(profile: Profile, workload: Workload, *, engine: str, extra_args: tuple[str, ...],
                  where: str) -> None:
    """Every prompt plus its output budget fits the context the engine serves (as the in-process backends check
    the model's): a request past it would run on far beyond its budget's worth, or be cut short."""
    served = served_window(engine, extra_args, model_window(profile.target.model))
    if served is None:
        return
    window, source = served
    total, prompt_tokens, max_new, prompt_id = max(
        (len(ids) + budget, len(ids), budget, prompt.prompt_id)
        for ids, budget, prompt in zip(workload.prompt_ids, workload.max_new_tokens, workload.prompts))
    if total <= window:
        return
    fixed = profile.workload.max_new_tokens != "dataset"
    key = "max_new_tokens" if fixed else "max_new_tokens_cap"
    fix = f"use {key} <= {window - prompt_tokens}" if prompt_tokens < window else "drop the prompts longer than it"
    after = "the longest prompt" if fixed else f"prompt {prompt_id}"
    raise ProfileError(f"{where}workload.max_new_tokens: {max_new} new tokens after {after} ({prompt_tokens} "
                       f"tokens) exceed the context the engine serves, {window} tokens ({source}); {fix}")


def find_binary(engine: ServingEngine, settings, where: str) -> str | None:
    """The executable (llama.cpp) or the Python with the engine installed (vLLM, SGLang)."""
    if settings.command is not None:
        found = shutil.which(settings.command[0])
        if found is None:
            raise ProfileError(f"{where}server.command: {settings.command[0]!r} is not an executable on PATH; "
                               "give its full path")
        return found
    if settings.binary is not None:
        binary = Path(settings.binary)
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise ProfileError(f"{where}server.binary: {binary} is not an executable file; install the engine "
                               "(make engines) or fix the path")
        return str(binary)
    if engine.loads_gguf:
        found = shutil.which("llama-server")
        if found is None:
            raise ProfileError(f"{where}server.binary: llama-server is not on PATH; set server.binary to its path "
                               "(make engines installs it under .engines/)")
        return found
    return sys.executable


def help_text(binary: str | None, engine: ServingEngine, settings) -> str | None:
    """llama-server's --help (and --version), for its version-dependent flag names."""
    if not engine.loads_gguf or binary is None:
        return None
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(
        p for p in (str(Path(binary).resolve().parent), os.environ.get("LD_LIBRARY_PATH")) if p)}
    texts = []
    for flag in ("--help", "--version"):
        try:
            out = subprocess.run([binary, flag], capture_output=True, text=True, timeout=30, env=env)
            texts.append(out.stdout + out.stderr)
        except (OSError, subprocess.SubprocessError) as error:
            raise ProfileError(f"server.binary: cannot run {binary} {flag}: {error}") from None
    return "\n".join(texts)


def installed_version(python: str, engine: ServingEngine, where: str) -> str:
    """The version of the engine installed for `python` (vLLM and SGLang run as Python modules); refused up
    front where that Python does not have it, rather than as a start-up failure per launch."""
    probe = ("import importlib.metadata as m, importlib.util as u, sys\n"
             f"if u.find_spec({engine.module!r}) is None: sys.exit(3)\n"
             f"for name in {engine.distributions!r}:\n"
             "    try: print(m.version(name)); break\n"
             "    except m.PackageNotFoundError: pass\n")
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        raise ProfileError(f"{where}server.binary: cannot run {python}: {error}") from None
    if out.returncode != 0:
        raise ProfileError(f"{where}server.binary: {python} has no {engine.module} module; point it at the Python "
                           f"of the environment that has {engine.name} (`make engine-{engine.name}` makes one in "
                           f".engines/{engine.name}/{'; on a machine with an NVIDIA GPU' if engine.name == 'sglang' else ''})")
    return out.stdout.strip() or "unknown"


def api_key(profile: Profile) -> str | None:
    name = profile.server.api_key_env
    if name is None:
        return None
    key = os.environ.get(name)
    if not key:
        raise ProfileError(f"server.api_key_env: the environment variable {name} is not set")
    return key


_SYNTHETIC_PROBE = """
import inspect, sys
from vllm.platforms import current_platform
if not current_platform.is_cpu():
    sys.exit(0)
from vllm.triton_utils import HAS_TRITON
if HAS_TRITON:
    sys.exit(0)
from vllm.utils import cpu_triton_utils as kernels
source = inspect.getsource(kernels._rejection_greedy_sample_kernel_impl)
sys.exit(4 if "not SYNTHETIC_MODE" in source else 0)
"""


def check_imposes_acceptance(python: str, version: str | None, where: str, key: str) -> None:
    """Refused before any launch where the installed vLLM cannot impose an acceptance: its CPU build without Triton
    runs the rejection sampler in C++ kernels that assert on synthetic mode (vLLM 0.32: "Synthetic acceptance not
    supported with CPU sampling"), so the first request would fail with a 500."""
    try:
        out = subprocess.run([python, "-c", _SYNTHETIC_PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as error:
        raise ProfileError(f"{where}server.binary: cannot run {python}: {error}") from None
    if out.returncode == 4:
        raise ProfileError(f"{where}{key}: vLLM {version or ''} on this CPU cannot impose an acceptance: its CPU "
                           "sampling kernels refuse synthetic mode (vllm/utils/cpu_triton_utils.py); run the what-if "
                           "on a GPU with vLLM 0.32+, or with backend = \"native\"")

"""The decision: per temperature, the configuration to deploy, and how to deploy it.

Among completed, feasible trials (the Pareto front in the throughput-vs-memory mode), those within
the noise of the best (max of the best trial's spread over repeats and `tolerance` x its value) are
near-ties; of these the smallest gamma wins (less memory, less wasted drafting), then the better value.
Speculation is recommended only when the chosen point is measurably faster than the baseline.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

from specbench.core import stats
from specbench.engines import ENGINES, EngineError, Speculation, with_mtp_draft
from specbench.models.registry import builtin_gguf_path, builtin_model, builtin_name, is_builtin
from specbench.profile import Profile
from specbench.tune.objectives import Objective


_PORTS = {"vllm": 8000, "sglang": 30000, "llama.cpp": 8080}  # each engine's usual port


def choose(rows: list[dict[str, Any]], *, objective: Objective, tolerance: float) -> tuple[dict | None, list[dict]]:
    """(the chosen trial row or None, the Pareto front — empty for a single objective)."""
    done = [r for r in rows if r["state"] == "COMPLETE" and r["feasible"]]
    if not done:
        return None, []
    front = pareto_front(done) if objective.is_pareto else []
    pool = front or done
    sign = 1 if objective.directions[0] == "maximize" else -1
    best = max(pool, key=lambda r: sign * r["value"])
    band = max(best["noise"] or 0.0, tolerance * abs(best["value"]))
    near = [r for r in pool if sign * (r["value"] - best["value"]) >= -band]
    chosen = min(near, key=lambda r: (r["gamma"], (r["peak_memory_mb"] or 0.0) if objective.is_pareto else 0.0,
                                      -sign * r["value"]))
    return chosen, front


def pareto_front(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Trials no other trial beats on both throughput (higher) and peak memory (lower), fastest first."""
    mask = stats.pareto_mask([r["values"][0] for r in rows], [r["values"][1] for r in rows])
    return sorted((r for r, on_front in zip(rows, mask) if on_front), key=lambda r: -r["values"][0])


def engine_settings(row: dict[str, Any] | None, *, target: str, temperature: float, top_p: float,
                    llama_cpp_binary: str | None = None, llama_cpp_help: str | None = None,
                    gamma_schedule=None) -> dict[str, Any]:
    """Ready-to-use settings for vLLM, SGLang, the llama.cpp server and transformers `generate()`. The serving
    engines' flags come from `specbench.engines`, the mapping the server backend launches them with; llama.cpp's
    flag names follow `llama_cpp_help` (the binary's --help) where it is known, else its 2026 names. A builtin
    model is its Hugging Face repository for vLLM, SGLang and transformers (they load the original weights) and
    its local GGUF file for llama.cpp; other references are passed through as the profile gave them. Sampling
    is per request (`request`: the OpenAI body's fields), as specbench sent it."""
    request = {"temperature": temperature, **({"top_p": top_p} if temperature > 0 else {})}
    sampling = {"do_sample": temperature > 0, **({"temperature": temperature, "top_p": top_p} if temperature > 0 else {})}
    references = dict.fromkeys([target, (row or {}).get("draft_model")])  # the target, then a distinct draft
    notes = [note for note in map(_builtin_note, references) if note]
    if row is None:
        notes.insert(0, "no speculation: serve the target alone")
        generate = sampling
    elif row["method"] == "ngram":
        generate = {**sampling, "prompt_lookup_num_tokens": int(row["gamma"]),
                    "max_matching_ngram_size": int(row["ngram_max"])}
    elif row["method"] != "draft":  # heads and MTP layers: the engines' methods
        generate = sampling
        notes.append(f"transformers: generate() drafts with a draft model or prompt lookup, not {row['method']}: "
                     "serve the recommendation with an engine above")
    else:
        generate = {**sampling, "assistant_model": hub_reference(row["draft_model"]), "num_assistant_tokens": int(row["gamma"]),
                    "num_assistant_tokens_schedule": "constant"}
        notes.append("transformers: load assistant_model with AutoModelForCausalLM.from_pretrained(path) and pass "
                     "the model object")
        if row.get("draft_quantize"):
            notes.append(f"the draft was measured {row['draft_quantize']}-quantised by specbench (dynamic, CPU); "
                         "engines load it as stored")
    hub, gguf = speculation_of(row, hub_reference), speculation_of(row, _gguf)
    if gamma_schedule is not None:  # a gamma per batch size: vLLM only (the others refuse it, and say so)
        hub = gguf = replace(hub, gamma=max(g for _, _, g in gamma_schedule), gamma_schedule=gamma_schedule)
    vllm = _serving("vllm", hub, target=hub_reference(target), binary="python")
    if "error" not in vllm:
        vllm["speculative_config"] = ENGINES["vllm"].speculative_config(hub)
    llama_cpp = _serving("llama.cpp", gguf, target=_gguf(target), binary=llama_cpp_binary or "llama-server",
                         help_text=llama_cpp_help)
    if "error" not in llama_cpp:
        llama_cpp["server_args"] = ["-m", _gguf(target), *llama_cpp["args"]]
    if row is not None:
        notes.append(f"llama.cpp: flags as {llama_cpp_binary} --help names them" if llama_cpp_help and llama_cpp_binary
                     else "llama.cpp: flags as llama-server names them since 2026 (--spec-type, --spec-draft-n-max); "
                          "an older build names them differently")
    return {"vllm": vllm, "sglang": _serving("sglang", hub, target=hub_reference(target), binary="python"),
            "llama_cpp": llama_cpp, "request": request, "transformers": {"generate_kwargs": generate}, "notes": notes}


def speculation_of(row: dict[str, Any] | None, reference) -> Speculation:
    """The recommended row as the engines' mapping takes it, with the draft model as `reference` gives it."""
    if row is None:
        return Speculation("baseline")
    draft_model = reference(row["draft_model"]) if isinstance(row.get("draft_model"), str) else None
    return Speculation(row["method"], int(row["gamma"]), draft_model, _int(row.get("ngram_min")),
                       _int(row.get("ngram_max")))


def _serving(name: str, speculation: Speculation, *, target: str, binary: str,
             help_text: str | None = None) -> dict[str, Any]:
    """`args`: the flags that add the speculation to a launch; `command`: a whole launch as the server backend
    runs it (on the engine's usual port); `error` instead where the engine cannot run the speculation."""
    engine = ENGINES[name]
    try:
        args = engine.speculation_args(with_mtp_draft(speculation, engine, target), help_text=help_text)
    except EngineError as error:
        return {"error": str(error)}
    return {"args": args, "command": engine.command(target=target, host="127.0.0.1", port=_PORTS[name],
                                                    binary=binary) + args}


def _int(value: Any) -> int | None:
    return None if value is None or value != value else int(value)


def llama_cpp_binary(profile: Profile) -> str | None:
    """The llama-server a server-backend profile launches, where it is an executable file (or on PATH)."""
    server = profile.server
    if profile.backend != "server" or server is None or server.engine != "llama.cpp" or server.url is not None:
        return None
    return shutil.which(server.command[0] if server.command else server.binary or "llama-server")


def read_help(binary: str | None) -> str | None:
    """A llama-server's --help, run with its folder on LD_LIBRARY_PATH (its shared libraries lie beside it);
    None when it does not run."""
    if binary is None:
        return None
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(
        p for p in (str(Path(binary).resolve().parent), os.environ.get("LD_LIBRARY_PATH")) if p)}
    try:
        out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout + out.stderr) or None


def _builtin(reference: str | None):
    if reference is None or not is_builtin(reference):
        return None
    return builtin_model(builtin_name(reference))  # the profile checked the name


def hub_reference(reference: str) -> str:
    """For vLLM and transformers: a builtin's Hugging Face repository."""
    builtin = _builtin(reference)
    return builtin.hub_id if builtin is not None and builtin.hub_id else reference


def _gguf(reference: str) -> str:
    """For llama.cpp: a builtin's local GGUF file (its name when not fetched yet)."""
    builtin = _builtin(reference)
    if builtin is None:
        return reference
    path = builtin_gguf_path(builtin.name)
    return str(path) if path is not None else builtin.filename


def _builtin_note(reference: str | None) -> str | None:
    builtin = _builtin(reference)
    if builtin is None or not builtin.hub_id:
        return None
    return (f"{reference} is {builtin.hub_id}; specbench measured its GGUF {builtin.filename} dequantised, "
            "so an engine serving the original weights may accept slightly differently")

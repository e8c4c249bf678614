"""The decision: per temperature, the configuration to deploy, and how to deploy it.

Among completed, feasible trials (the Pareto front in the throughput-vs-memory mode), those within
the noise of the best (max of the best trial's spread over repeats and `tolerance` x its value) are
near-ties; of these the smallest gamma wins (less memory, less wasted drafting), then the better value.
Speculation is recommended only when the chosen point is measurably faster than the baseline.
"""

from __future__ import annotations

import json
from typing import Any

from specbench import stats
from specbench.models import builtin_gguf_path, builtin_model, builtin_name, is_builtin
from specbench.tune.space import Objective


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


def engine_settings(row: dict[str, Any] | None, *, target: str, temperature: float, top_p: float) -> dict[str, Any]:
    """Ready-to-use settings for vLLM, transformers `generate()` and the llama.cpp server. A builtin model
    is its Hugging Face repository for vLLM and transformers (they load the original weights) and its
    local GGUF file for llama.cpp; other references are passed through as the profile gave them."""
    sampling = {"do_sample": temperature > 0, **({"temperature": temperature, "top_p": top_p} if temperature > 0 else {})}
    llama_sampling = ["--temp", f"{temperature:g}", "--top-p", f"{top_p:g}"]
    references = dict.fromkeys([target, (row or {}).get("draft_model")])  # the target, then a distinct draft
    notes = [note for note in map(_builtin_note, references) if note]
    if row is None:
        return {"vllm": {"speculative_config": None, "args": []},
                "transformers": {"generate_kwargs": sampling},
                "llama_cpp": {"server_args": ["-m", _gguf(target), *llama_sampling]},
                "notes": ["no speculation: serve the target alone", *notes]}
    gamma = int(row["gamma"])
    if row["method"] == "ngram":
        speculative = {"method": "ngram", "num_speculative_tokens": gamma,
                       "prompt_lookup_min": int(row["ngram_min"]), "prompt_lookup_max": int(row["ngram_max"])}
        generate = {**sampling, "prompt_lookup_num_tokens": gamma, "max_matching_ngram_size": int(row["ngram_max"])}
        llama = ["-m", _gguf(target), "--draft", str(gamma), *llama_sampling]
        notes.append("llama.cpp: the server drafts only with a draft model; prompt lookup is its "
                     "llama-lookup example, run with these arguments")
    else:
        speculative = {"model": _hub(row["draft_model"]), "num_speculative_tokens": gamma}
        generate = {**sampling, "assistant_model": _hub(row["draft_model"]), "num_assistant_tokens": gamma,
                    "num_assistant_tokens_schedule": "constant"}
        llama = ["-m", _gguf(target), "-md", _gguf(row["draft_model"]), "--draft-max", str(gamma), "--draft-min", "0",
                 *llama_sampling]
        notes.append("transformers: load assistant_model with AutoModelForCausalLM.from_pretrained(path) and pass "
                     "the model object")
        if row.get("draft_quantize"):
            notes.append(f"the draft was measured {row['draft_quantize']}-quantised by specbench (dynamic, CPU); "
                         "engines load it as stored")
    return {"vllm": {"speculative_config": speculative,
                     "args": ["--speculative-config", json.dumps(speculative, separators=(",", ":"))]},
            "transformers": {"generate_kwargs": generate},
            "llama_cpp": {"server_args": llama},
            "notes": notes}


def _builtin(reference: str | None):
    if reference is None or not is_builtin(reference):
        return None
    return builtin_model(builtin_name(reference))  # the profile checked the name


def _hub(reference: str) -> str:
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

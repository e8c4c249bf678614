"""Native eager, native compiled, HF generate and vLLM's CPU build, side by side on the embedded model
(`make bench`).

The in-process backends decode the same prompts with the same settings (greedy) on one set of loaded models (the
target, and an int8 copy of it as its own draft), interleaved request by request in one process so that drift on
a shared machine hits them alike: the native backend eager (run.compile off), the native backend with static caches
and compiled steps (compiled before the first request, not timed; the int8 draft does not compile and is skipped
there), and HF `generate`. Then, where vLLM is installed (`make engine-vllm`), the baseline and n-gram prompt lookup
on vLLM's CPU build at concurrency 1 with the same prompts, output tokens and repeats (fp32; its start-up not timed).
Reported: every backend's tokens/s and speedup per method; compiled ÷ eager, compiled ÷ vLLM and eager ÷ vLLM for
tokens/s and speedups, and native ÷ HF, with paired bootstrap CIs over prompts; beside each native speedup the
analytic model's prediction from the measured drafting, acceptance and step costs; and whether every greedy
output is identical token for token. Each prompt's time is its fastest repeat (other processes only ever add time).

    python -m benches [--prompts 6] [--max-new-tokens 64] [--gamma 3] [--repeats 2] [--no-draft]
                              [--no-compile] [--vllm .engines/vllm/bin/python | --no-vllm]
                              [--model REF] [--device cuda] [--dtype bfloat16]

On a GPU, or in another dtype than float32, the draft is a second copy of the target in the same dtype (int8
dynamic quantisation needs float32 on a CPU), and the compiled backend captures CUDA graphs.

Modules: measure (load once, run the requests), vllm (vLLM's requests, through `specbench run`), summary (figures
from the request rows, through specbench.core.results and specbench.core.stats), render (the terminal tables), cli (options).
"""

from benches.cli import main, parse_args
from benches.measure import MODEL, PROMPTS, BenchConfig, Measurement, bench_profile, draft_quantize, measure
from benches.summary import BenchSummary, summarize

__all__ = ["MODEL", "PROMPTS", "BenchConfig", "BenchSummary", "Measurement", "bench_profile", "draft_quantize",
           "main", "measure", "parse_args", "summarize"]

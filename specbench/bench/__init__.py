"""The native backend against the Hugging Face backend, side by side on the embedded model (`make bench`).

Both backends decode the same prompts with the same settings (greedy) on one set of loaded models (the
target, and an int8 copy of it as its own draft), interleaved request by request in one process so that
drift on a shared machine hits both alike. Reported: native baseline tokens/s over HF `generate` tokens/s;
for ngram (prompt lookup) and draft (the self-draft), the native speedup over the HF speedup, each relative
to its own backend's baseline; beside each native speedup the analytic model's prediction from the
measured drafting, acceptance and step costs; and whether every greedy output is identical token for
token. Each prompt's time is its fastest repeat (other processes only ever add time).

    python -m specbench.bench [--prompts 6] [--max-new-tokens 64] [--gamma 4] [--repeats 2]
                              [--model REF] [--device cuda] [--dtype bfloat16]

On a GPU, or in another dtype than float32, the draft is a second copy of the target in the same dtype (int8
dynamic quantisation needs float32 on a CPU).

Modules: measure (load once, run the requests), summary (figures from the request rows, through
specbench.results and specbench.stats), render (the terminal tables), cli (options).
"""

from specbench.bench.cli import main, parse_args
from specbench.bench.measure import MODEL, PROMPTS, BenchConfig, Measurement, bench_profile, draft_quantize, measure
from specbench.bench.summary import BenchSummary, summarize

__all__ = ["MODEL", "PROMPTS", "BenchConfig", "BenchSummary", "Measurement", "bench_profile", "draft_quantize",
           "main", "measure", "parse_args", "summarize"]

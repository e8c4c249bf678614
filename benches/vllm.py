"""vLLM's CPU build in the bench: the baseline and n-gram prompt lookup on the bench's prompts and output tokens, at
concurrency 1, greedy, fp32, through `specbench run` on the server backend in a child process (vLLM's own
compilation on, as in profiles/vllm-cpu.toml; its start-up is not timed). vLLM has no int8 dynamic-quantised
self-draft, so the draft method is not run there."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from benches.server import DEFAULT_PYTHON, VLLM_ARGS, VLLM_ENV

__all__ = ["DEFAULT_PYTHON", "METHODS", "requests"]

METHODS = ("baseline", "ngram")  # what vLLM runs of the bench's methods


def requests(python: Path, *, model: str, prompts: str, max_prompts: int, max_new_tokens: int, gamma: int,
             ngram_max: int, repeats: int, progress: Callable[[str], None] = print) -> pd.DataFrame:
    """vLLM's request rows (`results.request_row` columns), each with its `method` and its point's
    `engine_mean_accepted_length` (vLLM's counters: tokens per target step, 1.0 for the baseline)."""
    env = ", ".join(f'{key} = "{value}"' for key, value in VLLM_ENV.items())
    profile = f"""name = "bench-vllm"
backend = "server"
[server]
engine = "vllm"
binary = "{Path(python).absolute()}"
ready_timeout_s = 900
extra_args = {VLLM_ARGS!r}
env = {{ {env} }}
[target]
model = "{model}"
[[drafts]]
name = "ngram"
method = "ngram"
ngram_min = 1
ngram_max = {ngram_max}
[sweep]
gamma = [{gamma}]
temperature = [0.0]
[workload]
prompts = "{prompts}"
max_prompts = {max_prompts}
max_new_tokens = {max_new_tokens}
[run]
repeats = {repeats}
warmup = 1
""".replace("'", '"')
    progress(f"vLLM ({python}): baseline and ngram gamma {gamma}, concurrency 1 (its start-up is not timed)")
    with tempfile.TemporaryDirectory(prefix="specbench-bench-vllm-") as folder:
        path, out = Path(folder) / "vllm.toml", Path(folder) / "out"
        path.write_text(profile)
        done = subprocess.run([sys.executable, "-m", "specbench.cli", "run", str(path), "--out", str(out), "--fresh"],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"vLLM's run failed (exit {done.returncode}): {last}")
        rows = pd.read_parquet(out / "requests.parquet")
        points = pd.read_parquet(out / "points.parquet").set_index("point_id")
    # tokens per target step from vLLM's own speculation counters (its responses carry none per request)
    return rows.assign(method=rows["point_id"].map(points["method"]),
                       engine_mean_accepted_length=rows["point_id"].map(points["mean_accepted_length"]))

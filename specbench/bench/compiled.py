"""Native eager against native static/compiled, side by side on the embedded model (`make bench-compiled`).

One process loads the target once and opens two native sessions over it: run.compile off (a dynamic cache per
request, eager steps) and on (a static cache, compiled steps; compilation happens when the session opens and is
reported, never timed). The baseline and n-gram prompt lookup at one gamma (default 3) run on the same prompts
and output tokens, greedy, the two paths alternating which goes first per prompt; each prompt's time is its
fastest repeat. Reported, with paired bootstrap CIs over prompts: compiled ÷ eager tokens/s for each method, each
path's n-gram speedup over its own baseline and their ratio, and whether every output equals the eager baseline's.

    python -m specbench.bench.compiled [--prompts 6] [--max-new-tokens 64] [--gamma 3] [--repeats 2] [--device cpu]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import numpy as np
import pandas as pd
import torch

from specbench import results, stats
from specbench.backends.inprocess import load_models
from specbench.backends.native import NativeSession
from specbench.bench.measure import MODEL, WARMUP_TOKENS, BenchConfig, bench_profile
from specbench.bench.summary import fastest_repeats
from specbench.profile import with_overrides
from specbench.sweep.plan import plan_points

PATHS = ("eager", "compiled")


def measure(config: BenchConfig, *, progress=print) -> tuple[pd.DataFrame, dict]:
    """Request rows (with the `path` that ran each) and the compiled session's compile record."""
    torch.set_num_threads(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    profile = bench_profile(dataclasses.replace(config, draft=False))
    specs = plan_points(profile)  # the baseline, then ngram at config.gamma
    models = load_models(profile, observer=_Say(progress))
    progress("compiling (not timed)")
    sessions = {"eager": NativeSession(dataclasses.replace(models, profile=with_overrides(profile, compile=False))),
                "compiled": NativeSession(dataclasses.replace(models, profile=with_overrides(profile, compile=True)))}
    generate = {(path, spec.point_id): session.generate_one(spec) for path, session in sessions.items() for spec in specs}
    for run in generate.values():  # one untimed short request each
        run(models.prompt_ids[0], 0, WARMUP_TOKENS)
    rows = []
    for repeat in range(config.repeats):
        for index, (prompt, ids) in enumerate(zip(models.prompts, models.prompt_ids)):
            progress(f"repeat {repeat + 1}/{config.repeats}, prompt {index + 1}/{len(models.prompts)}")
            order = PATHS if (index + repeat) % 2 == 0 else PATHS[::-1]
            seed = profile.run.seed + 1000 * index + repeat
            for spec in specs:
                for path in order:
                    trace = generate[path, spec.point_id](ids, seed, config.max_new_tokens)
                    rows.append({"path": path, "method": spec.method, **results.request_row(
                        spec, point_key=path, prompt=prompt, repeat=repeat, seed=seed, trace=trace)})
    return pd.DataFrame(rows), sessions["compiled"].describe()["compile"]


def summarize(requests: pd.DataFrame) -> dict[str, tuple[float, float, float]]:
    """Ratios (value, CI low, CI high) from each (path, method, prompt)'s fastest repeat."""
    fastest = fastest_repeats(requests.rename(columns={"path": "backend"}))

    def per_prompt(path: str, method: str) -> tuple[np.ndarray, np.ndarray]:
        rows = fastest[(fastest["backend"] == path) & (fastest["method"] == method)].sort_values("prompt_id")
        return rows["output_tokens"].to_numpy(float), rows["e2e_ms"].to_numpy(float) / 1e3

    side = {path: (*per_prompt(path, "ngram"), *per_prompt(path, "baseline")) for path in PATHS}
    figures = {
        "baseline tokens/s, compiled ÷ eager": stats.paired_bootstrap_speedup(*side["compiled"][2:], *side["eager"][2:]),
        "ngram tokens/s, compiled ÷ eager": stats.paired_bootstrap_speedup(*side["compiled"][:2], *side["eager"][:2]),
        "ngram speedup, eager": stats.paired_bootstrap_speedup(*side["eager"]),
        "ngram speedup, compiled": stats.paired_bootstrap_speedup(*side["compiled"]),
        "ngram speedup, compiled ÷ eager": stats.paired_bootstrap_speedup_ratio(side["compiled"], side["eager"]),
    }
    for path in PATHS:
        for method, (tokens, seconds) in (("baseline", side[path][2:]), ("ngram", side[path][:2])):
            value = tokens.sum() / seconds.sum()
            figures[f"{method} tokens/s, {path}"] = (value, value, value)
    return figures


def identical(requests: pd.DataFrame) -> tuple[int, int]:
    """(requests whose output equals the eager baseline's for the same prompt, requests)."""
    reference = requests[(requests["path"] == "eager") & (requests["method"] == "baseline")]
    expected = dict(zip(zip(reference["prompt_id"], reference["repeat"]), reference["output_sha"]))
    same = sum(sha == expected[key] for key, sha in zip(zip(requests["prompt_id"], requests["repeat"]),
                                                         requests["output_sha"]))
    return same, len(requests)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specbench.bench.compiled", description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args(argv)
    for name in ("prompts", "max_new_tokens", "gamma", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(args, name)})")
    config = BenchConfig(prompts=args.prompts, max_new_tokens=args.max_new_tokens, gamma=args.gamma,
                         repeats=args.repeats, model=args.model, device=args.device, dtype=args.dtype)
    requests, compiled = measure(config, progress=lambda text: print(f"[bench] {text}", file=sys.stderr, flush=True))
    print(f"{config.model} {config.dtype} on {config.device}, {torch.get_num_threads()} threads; {config.prompts} "
          f"prompts x {config.max_new_tokens} tokens, ngram gamma {config.gamma}, greedy, fastest of "
          f"{config.repeats} repeat(s); compile (untimed): {compiled}")
    for name, (value, low, high) in summarize(requests).items():
        print(f"{name}: {value:.3f}" + (f" [{low:.3f}, {high:.3f}]" if low != high else ""))
    times = requests.groupby(["path", "method", "prompt_id"])["e2e_ms"]
    if config.repeats > 1:  # other processes only add time: a wide spread means the figures above are disturbed
        print(f"repeat spread (median slowest / fastest - 1): {float(np.median(times.max() / times.min() - 1)):.1%}")
    same, total = identical(requests)
    print(f"greedy outputs equal to the eager baseline's: {same}/{total}")


class _Say:
    def __init__(self, progress):
        self.progress = progress

    def message(self, text: str) -> None:
        self.progress(text)


if __name__ == "__main__":
    main()

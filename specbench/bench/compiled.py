"""Native eager against native static/compiled, and against vLLM's CPU build, on the embedded model
(`make bench-compiled`).

One process loads the target once and opens two native sessions over it: run.compile off (a dynamic cache per
request, eager steps) and on (a static cache, compiled steps; compilation happens when the session opens and is
reported, never timed). The baseline and n-gram prompt lookup at one gamma (default 3) run on the same prompts
and output tokens, greedy, the two paths alternating which goes first per prompt; each prompt's time is its
fastest repeat. Then, where vLLM is installed (`make engine-vllm`; `--vllm PYTHON`, `--no-vllm` to skip), the
same two configurations on vLLM at concurrency 1 through `specbench run` on the server backend (fp32, vLLM's own
compilation on as in profiles/vllm-cpu.toml, its start-up not timed), the same prompts, tokens and repeats.
Reported, with paired bootstrap CIs over prompts: compiled ÷ eager tokens/s for each method, each path's n-gram
speedup over its own baseline and their ratio, native compiled ÷ vLLM for both, and whether every output equals
the eager baseline's.

    python -m specbench.bench.compiled [--prompts 6] [--max-new-tokens 64] [--gamma 3] [--repeats 2] [--device cpu]
                                       [--vllm .engines/vllm/bin/python | --no-vllm]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from specbench import results, stats
from specbench.backends.inprocess import load_models
from specbench.backends.native import NativeSession
from specbench.bench.measure import MODEL, PROMPTS, WARMUP_TOKENS, BenchConfig, bench_profile
from specbench.bench.server import DEFAULT_PYTHON, VLLM_ARGS, VLLM_ENV
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


def vllm_requests(python: Path, config: BenchConfig, *, progress=print) -> pd.DataFrame:
    """The baseline and n-gram lookup (1..3) at config.gamma on vLLM, concurrency 1, greedy, the bench's prompts and
    tokens, `repeats` times each: `specbench run` on the server backend in a child process. Its request rows, with
    path "vllm" and the method."""
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
model = "{config.model}"
[[drafts]]
name = "ngram"
method = "ngram"
ngram_min = 1
ngram_max = 3
[sweep]
gamma = [{config.gamma}]
temperature = [0.0]
[workload]
prompts = "{PROMPTS}"
max_prompts = {config.prompts}
max_new_tokens = {config.max_new_tokens}
[run]
repeats = {config.repeats}
warmup = 1
""".replace("'", '"')
    progress(f"vLLM ({python}): baseline and ngram gamma {config.gamma}, concurrency 1 (its start-up is not timed)")
    with tempfile.TemporaryDirectory(prefix="specbench-bench-vllm-") as folder:
        path, out = Path(folder) / "vllm.toml", Path(folder) / "out"
        path.write_text(profile)
        done = subprocess.run([sys.executable, "-m", "specbench.cli", "run", str(path), "--out", str(out), "--fresh"],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"vLLM's run failed (exit {done.returncode}): "
                             + (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1])
        rows = pd.read_parquet(out / "requests.parquet")
        methods = pd.read_parquet(out / "points.parquet").set_index("point_id")["method"]
    return rows.assign(path="vllm", method=rows["point_id"].map(methods))


def summarize(requests: pd.DataFrame) -> dict[str, tuple[float, float, float]]:
    """Ratios (value, CI low, CI high) from each (path, method, prompt)'s fastest repeat."""
    fastest = fastest_repeats(requests.rename(columns={"path": "backend"}))
    paths = [path for path in (*PATHS, "vllm") if (fastest["backend"] == path).any()]
    prompts = sorted(set(fastest["prompt_id"]))

    def per_prompt(path: str, method: str) -> tuple[np.ndarray, np.ndarray]:
        rows = fastest[(fastest["backend"] == path) & (fastest["method"] == method)].set_index("prompt_id")
        rows = rows.reindex(prompts)
        return rows["output_tokens"].to_numpy(float), rows["e2e_ms"].to_numpy(float) / 1e3

    side = {path: (*per_prompt(path, "ngram"), *per_prompt(path, "baseline")) for path in paths}
    figures = {
        "baseline tokens/s, compiled ÷ eager": stats.paired_bootstrap_speedup(*side["compiled"][2:], *side["eager"][2:]),
        "ngram tokens/s, compiled ÷ eager": stats.paired_bootstrap_speedup(*side["compiled"][:2], *side["eager"][:2]),
        "ngram speedup, eager": stats.paired_bootstrap_speedup(*side["eager"]),
        "ngram speedup, compiled": stats.paired_bootstrap_speedup(*side["compiled"]),
        "ngram speedup, compiled ÷ eager": stats.paired_bootstrap_speedup_ratio(side["compiled"], side["eager"]),
    }
    if "vllm" in side:
        figures |= {
            "baseline tokens/s, compiled ÷ vLLM": stats.paired_bootstrap_speedup(*side["compiled"][2:], *side["vllm"][2:]),
            "baseline tokens/s, eager ÷ vLLM": stats.paired_bootstrap_speedup(*side["eager"][2:], *side["vllm"][2:]),
            "ngram speedup, vLLM": stats.paired_bootstrap_speedup(*side["vllm"]),
            "ngram speedup, compiled ÷ vLLM": stats.paired_bootstrap_speedup_ratio(side["compiled"], side["vllm"]),
        }
    for path in paths:
        for method, (tokens, seconds) in (("baseline", side[path][2:]), ("ngram", side[path][:2])):
            value = tokens.sum() / seconds.sum()
            figures[f"{method} tokens/s, {path}"] = (value, value, value)
    return figures


def identical(requests: pd.DataFrame, paths: tuple[str, ...], reference: str) -> tuple[int, int]:
    """(requests of `paths` whose output equals the `reference` path's baseline output for the same prompt and
    repeat, requests of `paths`)."""
    baseline = requests[(requests["path"] == reference) & (requests["method"] == "baseline")]
    expected = dict(zip(zip(baseline["prompt_id"], baseline["repeat"]), baseline["output_sha"]))
    rows = requests[requests["path"].isin(paths)]
    same = sum(sha == expected.get(key) for key, sha in zip(zip(rows["prompt_id"], rows["repeat"]), rows["output_sha"]))
    return same, len(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specbench.bench.compiled", description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--vllm", type=Path, default=DEFAULT_PYTHON, help="vLLM's Python (default: %(default)s)")
    parser.add_argument("--no-vllm", action="store_true", help="skip vLLM")
    args = parser.parse_args(argv)
    if not args.no_vllm and args.vllm != DEFAULT_PYTHON and not args.vllm.exists():
        parser.error(f"--vllm: no Python at {args.vllm} (make engine-vllm installs one)")
    for name in ("prompts", "max_new_tokens", "gamma", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(args, name)})")
    config = BenchConfig(prompts=args.prompts, max_new_tokens=args.max_new_tokens, gamma=args.gamma,
                         repeats=args.repeats, model=args.model, device=args.device, dtype=args.dtype)
    progress = lambda text: print(f"[bench] {text}", file=sys.stderr, flush=True)  # noqa: E731
    requests, compiled = measure(config, progress=progress)
    if not args.no_vllm and args.vllm.exists() and args.device == "cpu" and args.dtype == "float32":
        requests = pd.concat([requests, vllm_requests(args.vllm, config, progress=progress)], ignore_index=True)
    elif not args.no_vllm:
        progress("vLLM skipped: " + ("fp32 on the CPU only" if args.vllm.exists() else f"no vLLM at {args.vllm}"))
    print(f"{config.model} {config.dtype} on {config.device}, {torch.get_num_threads()} threads; {config.prompts} "
          f"prompts x {config.max_new_tokens} tokens, ngram gamma {config.gamma}, greedy, fastest of "
          f"{config.repeats} repeat(s); compile (untimed): {compiled}")
    for name, (value, low, high) in summarize(requests).items():
        print(f"{name}: {value:.3f}" + (f" [{low:.3f}, {high:.3f}]" if low != high else ""))
    times = requests.groupby(["path", "method", "prompt_id"])["e2e_ms"]
    if config.repeats > 1:  # other processes only add time: a wide spread means the figures above are disturbed
        print(f"repeat spread (median slowest / fastest - 1): {float(np.median(times.max() / times.min() - 1)):.1%}")
    same, total = identical(requests, PATHS, "eager")
    print(f"greedy outputs equal to the eager baseline's: {same}/{total}")
    if (requests["path"] == "vllm").any():
        same, total = identical(requests, ("vllm",), "vllm")
        print(f"vLLM's greedy outputs equal to vLLM's baseline: {same}/{total}")


class _Say:
    def __init__(self, progress):
        self.progress = progress

    def message(self, text: str) -> None:
        self.progress(text)


if __name__ == "__main__":
    main()

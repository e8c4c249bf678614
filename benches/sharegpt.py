"""builtin:sharegpt sent by specbench and by `vllm bench serve --dataset-name sharegpt` to one vLLM server, with the
same seed and count (`make bench-sharegpt`): the two clients send comparable requests, so their figures compare.

One vLLM server (no speculation) is launched through specbench's server backend. specbench's client runs the
baseline point of a profile whose workload is builtin:sharegpt (`max_new_tokens = "dataset"`); vLLM's client reads
the same cached ShareGPT file (`specbench datasets`) with `--dataset-name sharegpt`, the same `--seed` and
`--num-prompts`, at the same concurrency, greedy. No warm-up on either side, so the server's own counters
(vllm:prompt_tokens, vllm:generation_tokens, vllm:request_success in /metrics, read before and after each client)
count exactly the requests that client sent. Reported: requests, prompt tokens (chat template included) and output
tokens, as the server counted them and as each client recorded them, and their ratio (aimed within 2 % of 1).

    python -m benches.sharegpt [--python .engines/vllm/bin/python] [--prompts 32] [--concurrency 4]
                                       [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from specbench.backends.server import client
from specbench.backends.server.backend import BACKEND
from benches.server import DEFAULT_PYTHON, MODEL, VLLM_ARGS, VLLM_ENV, Quiet, vllm_bench
from specbench.workloads.datasets import fetch_dataset
from specbench.models.load import hf_folder
from specbench.profile import ProfileError, profile_from_dict
from specbench.core.results import PointSpec

SERVER_COUNTERS = ("prompt_tokens", "generation_tokens", "request_success")
TOLERANCE = 0.02


@dataclass(frozen=True)
class Sent:
    """What one client sent, as the server counted it and as the client counted it."""

    client: str
    requests: float  # completed, by the server's counter
    server_prompt_tokens: float  # chat template included
    server_output_tokens: float
    client_prompt_tokens: int  # as each client recorded them (both from the server's usage reports)
    client_output_tokens: int


def server_counters(url: str) -> dict[str, float]:
    """vLLM's cumulative token and request counters (summed over label sets)."""
    status, text = asyncio.run(client.get_text(f"{url}/metrics"))
    if status != 200:
        raise RuntimeError(f"{url}/metrics answered HTTP {status}")
    totals = dict.fromkeys(SERVER_COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix("vllm:").removesuffix("_total")
            if name in totals:
                totals[name] += sample.value
    return totals


def bench_profile(python: Path, *, prompts: int, concurrency: int, seed: int) -> dict:
    return {"name": "bench-sharegpt", "backend": "server",
            "server": {"engine": "vllm", "binary": str(python.absolute()), "ready_timeout_s": 900.0,
                       "extra_args": VLLM_ARGS, "env": VLLM_ENV},
            "target": {"model": MODEL},
            "sweep": {"gamma": [1], "temperature": [0.0], "concurrency": [concurrency]},
            "workload": {"prompts": "builtin:sharegpt", "max_prompts": prompts, "max_new_tokens": "dataset"},
            "run": {"repeats": 1, "warmup": 0, "seed": seed}}


def specbench_sent(session, concurrency: int) -> Sent:
    spec = PointSpec.baseline(0.0, 1.0, concurrency=concurrency)
    # a server not yet launched is launched by this point: its counters start at zero
    before = server_counters(session.server.url) if session.server is not None else dict.fromkeys(SERVER_COUNTERS, 0.0)
    rows = session.run_point(spec, point_key="bench", on_request=lambda: None, after_prompt=None)
    after = server_counters(session.server.url)
    return Sent("specbench", after["request_success"] - before["request_success"],
                after["prompt_tokens"] - before["prompt_tokens"], after["generation_tokens"] - before["generation_tokens"],
                sum(r["prompt_tokens"] for r in rows), sum(r["output_tokens"] for r in rows))


def vllm_sent(python: Path, url: str, dataset: Path, tokenizer: str, *, prompts: int, concurrency: int, seed: int,
              work: Path) -> Sent:
    before = server_counters(url)
    figures, _ = vllm_bench(python, url, ["--dataset-name", "sharegpt", "--dataset-path", str(dataset)], tokenizer,
                            load=["--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
                                  "--request-rate", "inf", "--num-warmups", "0", "--seed", str(seed)], work=work)
    after = server_counters(url)
    return Sent("vLLM", after["request_success"] - before["request_success"],
                after["prompt_tokens"] - before["prompt_tokens"], after["generation_tokens"] - before["generation_tokens"],
                int(figures["total_input_tokens"]), int(figures["total_output_tokens"]))


def render(sides: tuple[Sent, Sent], *, prompts: int, concurrency: int, seed: int) -> None:
    ours, theirs = sides
    table = Table(title=f"builtin:sharegpt: {prompts} prompts, seed {seed}, concurrency {concurrency}, greedy, "
                        "output lengths from the dataset; one vLLM server", title_justify="left")
    for column in ("", "specbench", "vllm bench serve", "ratio", f"within {TOLERANCE:.0%}"):
        table.add_column(column, justify="right")
    for label, mine, other in (
            ("requests (server)", ours.requests, theirs.requests),
            ("prompt tokens (server, chat template)", ours.server_prompt_tokens, theirs.server_prompt_tokens),
            ("prompt tokens (client)", ours.client_prompt_tokens, theirs.client_prompt_tokens),
            ("output tokens (server)", ours.server_output_tokens, theirs.server_output_tokens),
            ("output tokens (client)", ours.client_output_tokens, theirs.client_output_tokens)):
        ratio = mine / other if other else float("nan")
        table.add_row(label, f"{mine:,.0f}", f"{other:,.0f}", f"{ratio:.4f}", "yes" if abs(ratio - 1) <= TOLERANCE else "NO")
    Console(width=max(Console().width, 120)).print(table)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benches.sharegpt", description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", type=Path, default=DEFAULT_PYTHON, help="the Python that has vLLM")
    parser.add_argument("--prompts", type=int, default=32, help="conversations sampled (--num-prompts)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("prompts", "concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1 (got {getattr(args, name)})")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    quiet = Quiet()
    dataset = fetch_dataset("sharegpt", progress=quiet.message)
    with tempfile.TemporaryDirectory(prefix="specbench-bench-sharegpt-") as folder:
        work = Path(folder)
        try:
            profile = profile_from_dict(bench_profile(args.python, prompts=args.prompts, concurrency=args.concurrency,
                                                      seed=args.seed))
            session = BACKEND.open(profile, observer=quiet, out_dir=work)
        except ProfileError as error:
            sys.exit(f"error: {error}")
        try:
            quiet.message(f"specbench's client: {args.prompts} ShareGPT requests at concurrency {args.concurrency}")
            ours = specbench_sent(session, args.concurrency)
            quiet.message(f"vllm bench serve: {args.prompts} ShareGPT requests at concurrency {args.concurrency}")
            theirs = vllm_sent(args.python, session.server.url, dataset, str(hf_folder(MODEL)), prompts=args.prompts,
                               concurrency=args.concurrency, seed=args.seed, work=work)
        finally:
            session.close()
    render((ours, theirs), prompts=args.prompts, concurrency=args.concurrency, seed=args.seed)


if __name__ == "__main__":
    main()

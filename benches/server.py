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

Then, at each request rate (open loop: Poisson arrivals, `--requests` per level, the same prompts), each client
once on the same server. Reported per rate and client: the rate it sent at and its deviation from the rate asked
(aimed within 2 %, specbench.core.summary.RATE_TOLERANCE), the completed requests/s, and whether the server kept up:
each request's e2e latency, fitted against its send time, grew by at most 0.1 s per s of sending
(LATENCY_GROWTH_LIMIT). A server completing C requests/s while R > C arrive queues them: the latency then grows
by R/C - 1 s per s, so the limit means the server completed at least 1/1.1 = 91 % of what was sent. (The
completed requests/s is no such test: over a short level it counts the last request's latency, after the
sending stopped.) Verdict: "ok" (on rate, server kept up), "client is the bottleneck" (the server kept up but the
client sent more than 2 % off the rate asked), or "server saturated: the achieved rate is not judged".

    python -m benches.server [--python .engines/vllm/bin/python] [--prompts 8] [--max-new-tokens 64]
                                     [--concurrency 1 4] [--rounds 3] [--request-rate 0.3 1.5] [--requests 12]

`--concurrency` or `--request-rate` with no values skips those levels.
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from specbench.backends.server.backend import BACKEND
from specbench.models.load import hf_folder
from specbench.profile import ProfileError, profile_from_dict
from specbench.core.results import PointSpec
from specbench.core.summary import RATE_TOLERANCE, summarize
from specbench.workloads.prompts import load_prompts

DEFAULT_PYTHON = Path(".engines/vllm/bin/python")
MODEL = "builtin:smollm2-135m-instruct"
VLLM_ARGS = ["--dtype", "float32", "--max-model-len", "2048", "--max-num-seqs", "4"]
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2"}
# vLLM's CPU build here (2 cores, the baseline) serves roughly 0.8 requests/s of 48 tokens, fewer of 64: one rate it
# keeps up with, one it cannot
DEFAULT_RATES = [0.3, 1.5]
DEFAULT_REQUESTS = 12
LATENCY_GROWTH_LIMIT = 0.1  # s of e2e latency per s of sending; above it the server's queue grew through the level
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


@dataclass(frozen=True)
class RateLevel:
    """One client's requests at one asked request rate."""

    client: str  # "specbench" | "vLLM"
    asked_rate: float  # requests/s
    achieved_rate: float  # requests/s the client sent at
    request_throughput: float  # requests/s completed over the run
    latency_growth: float  # s of e2e latency per s of sending (least-squares slope)

    @property
    def deviation(self) -> float:
        """The sent rate's relative distance from the asked one (-0.05: 5 % short)."""
        return self.achieved_rate / self.asked_rate - 1

    @property
    def on_rate(self) -> bool:
        return abs(self.deviation) <= RATE_TOLERANCE

    @property
    def server_kept_up(self) -> bool:
        return self.latency_growth <= LATENCY_GROWTH_LIMIT

    @property
    def verdict(self) -> str:
        if not self.server_kept_up:  # a queue at the server: the client's sending is not what limits the level
            return "server saturated: the achieved rate is not judged"
        return "ok" if self.on_rate else "client is the bottleneck"


class Quiet:
    def message(self, text: str) -> None:
        print(f"[bench] {text}", file=sys.stderr, flush=True)


def single_turn_prompts(count: int) -> list[str]:
    """The first `count` builtin:mixed prompts that are one user message (vLLM's client sends just that)."""
    texts = [p.messages[0]["content"] for p in load_prompts("builtin:mixed", max_prompts=None, categories=None)
             if len(p.messages) == 1 and p.messages[0]["role"] == "user"]
    return texts[:count]


def bench_profile(python: Path, dataset: Path, *, max_new_tokens: int, concurrency: list[int],
                  request_rates: list[float], requests: int) -> dict:
    return {"name": "bench-server", "backend": "server",
            "server": {"engine": "vllm", "binary": str(python.absolute()), "ready_timeout_s": 900.0,
                       "extra_args": VLLM_ARGS, "env": VLLM_ENV},
            "target": {"model": MODEL},
            "sweep": {"gamma": [1], "temperature": [0.0], "concurrency": concurrency or [1],
                      **({"request_rate": request_rates} if request_rates else {})},
            "workload": {"prompts": str(dataset), "max_new_tokens": max_new_tokens},
            "load": {"requests": requests}, "run": {"repeats": 1, "warmup": 1, "seed": 0}}


def specbench_side(session, concurrency: int) -> Side:
    spec = PointSpec.baseline(0.0, 1.0, concurrency=concurrency)
    cpu = time.process_time()
    rows = session.run_point(spec, point_key="bench", on_request=lambda: None, after_prompt=None)
    cpu = time.process_time() - cpu
    point = summarize([spec], pd.DataFrame(rows), failures={},
                      context={spec.point_id: session.point_measurements()}).iloc[0]
    requests = len(rows) + concurrency  # the warm-up requests are sent by the same client
    return Side(float(point["tokens_per_s"]), statistics.fmean(r["ttft_ms"] for r in rows), cpu / requests)


def custom_dataset(dataset: Path, max_new_tokens: int) -> list[str]:
    """`vllm bench serve`'s options for a JSONL file of prompts sent as they are, in the file's order (its custom
    dataset shuffles by default: with several in flight, which prompts queue behind which changes the mean TTFT),
    each for `max_new_tokens`."""
    return ["--dataset-name", "custom", "--dataset-path", str(dataset), "--skip-chat-template",
            "--custom-output-len", str(max_new_tokens), "--disable-shuffle"]


def vllm_bench(python: Path, url: str, dataset: Sequence[str], tokenizer: str, *, load: list[str],
               work: Path) -> tuple[dict, float]:
    """One run of `vllm bench serve` on `dataset` (its dataset options) with `load` (its options for how many
    requests, how many in flight or at what rate, warm-ups): its saved result (with per-request start times and
    latencies) and the CPU seconds it spent."""
    host, port = url.removeprefix("http://").split(":")
    result = work / f"vllm-{time.monotonic_ns()}.json"
    argv = [str(python), "-c", VLLM_BENCH, "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
            "--host", host, "--port", port, "--model", "specbench-target", "--tokenizer", tokenizer,
            *dataset, *load, "--temperature", "0", "--disable-tqdm",
            "--save-result", "--save-detailed", "--result-dir", str(work), "--result-filename", result.name]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
    figures = json.loads(result.read_text())
    if figures.get("failed"):
        first = next((error for error in figures.get("errors", ()) if error), "")
        raise RuntimeError(f"vllm bench serve: {figures['failed']} of {figures['failed'] + figures['completed']} "
                           f"requests failed ({first[:200]})")
    return figures, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def vllm_side(python: Path, url: str, dataset: Path, tokenizer: str, *, prompts: int, max_new_tokens: int,
              concurrency: int, work: Path) -> Side:
    load = ["--num-prompts", str(prompts), "--max-concurrency", str(concurrency), "--request-rate", "inf",
            "--num-warmups", str(concurrency)]
    figures, cpu = vllm_bench(python, url, custom_dataset(dataset, max_new_tokens), tokenizer, load=load, work=work)
    return Side(figures["output_throughput"], figures["mean_ttft_ms"], cpu / (figures["completed"] + concurrency))


# --- request-rate levels ---------------------------------------------------------------------


def latency_growth(send_s: Sequence[float], latency_s: Sequence[float]) -> float:
    """The least-squares slope of each request's e2e latency against its send time (s per s of sending): about 0
    while the server keeps up; R/C - 1 when requests arrive at R/s and the server completes only C/s."""
    send = np.asarray(send_s, dtype=float)
    if len(send) < 2 or np.ptp(send) == 0:
        raise ValueError(f"a latency trend needs requests sent at two or more times; got {len(send)} request(s) "
                         f"sent within {float(np.ptp(send)) if len(send) else 0.0:g} s")
    return float(np.polyfit(send, np.asarray(latency_s, dtype=float), 1)[0])


def specbench_level(spec: PointSpec, rows: list[dict], *, measurements: dict) -> RateLevel:
    """specbench's client at a rate, from its request rows: the sent rate and throughput as `specbench run`
    summarises the point (its schedule, as vLLM's, sends the last of n requests n / rate after its start)."""
    point = summarize([spec], pd.DataFrame(rows), failures={}, context={spec.point_id: measurements}).iloc[0]
    growth = latency_growth([r["start_ms"] / 1e3 for r in rows], [r["e2e_ms"] / 1e3 for r in rows])
    return RateLevel("specbench", spec.request_rate, float(point["achieved_request_rate"]),
                     float(point["request_throughput"]), growth)


def vllm_level(figures: dict, request_rate: float) -> RateLevel:
    """vLLM's client at a rate, from its saved result (start times and latencies in s). Its schedule sends the last
    of n requests n / rate after its run starts, so its sent rate is n / (last send - start); the start is the last
    finish less the run's duration (it is not saved)."""
    starts = np.asarray(figures["start_times"], dtype=float)
    latencies = np.asarray(figures["latencies"], dtype=float)
    origin = float((starts + latencies).max()) - figures["duration"]
    achieved = len(starts) / (float(starts.max()) - origin)
    return RateLevel("vLLM", request_rate, achieved, figures["request_throughput"], latency_growth(starts, latencies))


def specbench_rate(session, request_rate: float) -> RateLevel:
    spec = PointSpec.baseline(0.0, 1.0, request_rate=request_rate)
    rows = session.run_point(spec, point_key="bench", on_request=lambda: None, after_prompt=None)
    return specbench_level(spec, rows, measurements=session.point_measurements())


def vllm_rate(python: Path, url: str, dataset: Path, tokenizer: str, *, requests: int, request_rate: float,
              max_new_tokens: int, work: Path) -> RateLevel:
    load = ["--num-prompts", str(requests), "--request-rate", str(request_rate), "--burstiness", "1.0",
            "--num-warmups", "1"]  # as the profile: Poisson arrivals, one warm-up request
    figures, _ = vllm_bench(python, url, custom_dataset(dataset, max_new_tokens), tokenizer, load=load, work=work)
    return vllm_level(figures, request_rate)


def rate_cells(level: RateLevel) -> tuple[str, ...]:
    """One row of the request-rate table."""
    return (f"{level.asked_rate:g}", level.client, f"{level.achieved_rate:.3f}", f"{level.deviation:+.1%}",
            "yes" if level.on_rate else "no", f"{level.request_throughput:.3f}", f"{level.latency_growth:+.3f}",
            "yes" if level.server_kept_up else "no", level.verdict)


def rate_finding(level: RateLevel) -> str | None:
    """The level's verdict in a sentence, where it is not ok."""
    where = f"at {level.asked_rate:g} requests/s ({level.client}'s client)"
    if not level.server_kept_up:
        return (f"{where} the server did not keep up: the e2e latency grew {level.latency_growth:.2f} s per s of "
                f"sending (limit {LATENCY_GROWTH_LIMIT:g}); the server limits this level, the achieved rate is not "
                "judged")
    if not level.on_rate:
        return (f"{where} the client is the bottleneck: it sent {level.achieved_rate:.3f} requests/s, "
                f"{level.deviation:+.1%} from the rate asked (limit ±{RATE_TOLERANCE:.0%}), while the server kept up")
    return None


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


def render_rates(levels: list[RateLevel], *, requests: int, max_new_tokens: int) -> None:
    table = Table(title=f"request rates: {requests} requests per rate (Poisson arrivals) x {max_new_tokens} tokens, "
                        "greedy, same vLLM server")
    for name in ("rate asked", "client", "sent req/s", "deviation", f"within {RATE_TOLERANCE:.0%}",
                 "completed req/s", "latency growth s/s", "server kept up", "verdict"):
        table.add_column(name, justify="left" if name in ("client", "verdict") else "right")
    table.caption = ("sent: n / (last send - the run's start), both clients schedule the last of n requests at n / "
                     "rate; completed: requests / the run's time to the last finish; latency growth: slope of "
                     f"e2e latency against send time, the server kept up at <= {LATENCY_GROWTH_LIMIT:g}")
    for level in levels:
        table.add_row(*rate_cells(level))
    console = Console(width=max(Console().width, 130))
    console.print(table)
    for level in levels:
        finding = rate_finding(level)
        if finding is not None:
            console.print(f"[bold]{finding}[/bold]")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benches.server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", type=Path, default=DEFAULT_PYTHON, help="the Python that has vLLM")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 4], help="none: skip these levels")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two clients per level")
    parser.add_argument("--request-rate", type=float, nargs="*", default=DEFAULT_RATES,
                        help=f"requests/s, open loop (default {' '.join(map(str, DEFAULT_RATES))}); none: skip")
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS,
                        help=f"requests per rate (default {DEFAULT_REQUESTS})")
    args = parser.parse_args(argv)
    for name in ("prompts", "max_new_tokens", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(args, name)})")
    if any(c < 1 for c in args.concurrency):
        parser.error(f"--concurrency must be at least 1 (got {args.concurrency})")
    if any(not r > 0 for r in args.request_rate):  # not > 0: also refuses nan
        parser.error(f"--request-rate must be above 0 (got {args.request_rate})")
    if args.requests < 4:
        parser.error(f"--requests must be at least 4, for a send rate and a latency trend (got {args.requests})")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    texts = single_turn_prompts(args.prompts)
    quiet = Quiet()
    with tempfile.TemporaryDirectory(prefix="specbench-bench-server-") as folder:
        work = Path(folder)
        dataset = work / "prompts.jsonl"
        dataset.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in texts))
        try:
            profile = profile_from_dict(bench_profile(args.python, dataset, max_new_tokens=args.max_new_tokens,
                                                      concurrency=args.concurrency, request_rates=args.request_rate,
                                                      requests=args.requests))
            session = BACKEND.open(profile, observer=quiet, out_dir=work)
        except ProfileError as error:
            sys.exit(f"error: {error}")
        tokenizer = str(hf_folder(MODEL))
        results: dict[int, list[tuple[Side, Side]]] = {}
        levels: list[RateLevel] = []
        try:
            for concurrency in args.concurrency:
                for _ in range(args.rounds):  # alternate: drift on a shared machine hits both alike
                    ours = specbench_side(session, concurrency)
                    theirs = vllm_side(args.python, session.server.url, dataset, tokenizer, prompts=len(texts),
                                       max_new_tokens=args.max_new_tokens, concurrency=concurrency, work=work)
                    results.setdefault(concurrency, []).append((ours, theirs))
            for rate in args.request_rate:
                quiet.message(f"{rate:g} requests/s: {args.requests} requests from each client")
                levels.append(specbench_rate(session, rate))
                levels.append(vllm_rate(args.python, session.server.url, dataset, tokenizer, requests=args.requests,
                                        request_rate=rate, max_new_tokens=args.max_new_tokens, work=work))
        finally:
            session.close()
    if results:
        render(results, prompts=len(texts), max_new_tokens=args.max_new_tokens)
    if levels:
        render_rates(levels, requests=args.requests, max_new_tokens=args.max_new_tokens)


if __name__ == "__main__":
    main()

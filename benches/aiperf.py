"""specbench's concurrency capacity against AIPerf's on the same vLLM CPU server (`make bench-aiperf`): the
highest concurrency at which the requests still meet a TPOT limit, found by each tool's own search.

One vLLM server is launched as the shipped capacity profile launches its baseline (same binary, flags and
environment), and both tools are pointed at it in turn (specbench attached to it: `[server] url`):

- specbench: `[capacity] rate = false, concurrency = true`, attainment 0.95 of the requests meeting the TPOT limit,
  steady-state probes (the profile's lead-in and window), the capacity fitted to every probe with its interval;
- AIPerf (in its own virtualenv, never a dependency of specbench): `aiperf profile --search-recipe
  max-concurrency-under-sla --tpot-sla-ms L --search-style monotonic`, its p95 of each request's inter-token
  latency below L, on the same prompts and output length.

One limit, on one figure (TPOT), so the two definitions meet: AIPerf passes a concurrency where the p95 of the
requests' TPOT is below L, i.e. where at least 95 % of them have a TPOT below it — specbench's attainment, as a point
estimate. What remains different is said with the figures: specbench decides with an interval and fits, AIPerf
decides on one run's point estimate; specbench measures a steady state (lead-in and tail not measured), AIPerf every
request of a run (its warm-up requests apart).

    python -m benches.aiperf [--aiperf PATH] [--tpot-ms MS] [--max-concurrency 16] [--requests 40] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from specbench.backends.server.backend import engine_reference
from specbench.backends.server.process import ServerProcess, free_port
from specbench.engines import ENGINES
from specbench.models.load import load_tokenizer
from specbench.profile import load_profile
from specbench.workloads.build import build_workload

DEFAULT_PROFILE = "profiles/vllm-cpu-capacity.toml"
AIPERF_HINT = ("python3 -m venv .engines/aiperf && .engines/aiperf/bin/pip install aiperf==0.13.0 (its own "
               "virtualenv: never a dependency of specbench)")


def launch_vllm(profile, *, port: int, log: Path) -> ServerProcess:
    """vLLM serving the profile's target as its baseline launch does, under specbench's own lifeline (its whole
    process group ends with this bench, kill -9 included); its output in `log`."""
    engine = ENGINES["vllm"]
    argv = engine.command(target=engine_reference(profile.target.model, engine), host="127.0.0.1", port=port,
                          binary=profile.server.binary) + list(profile.server.extra_args)
    return ServerProcess(argv, log_path=log, env=dict(profile.server.env), port=port).start()


def specbench_profile(source: Path, *, url: str, tpot_ms: str, max_concurrency: int, requests: int) -> str:
    """The shipped profile attached to the running server: the baseline alone, its concurrency capacity under one
    TPOT limit."""
    data = tomllib.loads(source.read_text())
    capacity = data["capacity"]
    workload = data["workload"]
    return "\n".join([
        'name = "aiperf-comparison"', 'backend = "server"',
        "[server]", 'engine = "vllm"', f'url = "{url}"', 'model = "specbench-target"',
        "[target]", f'model = "{data["target"]["model"]}"',
        "[sweep]", "gamma = [3]", "temperature = [0.0]",  # gamma: no draft here, but [sweep] asks for one
        "[workload]", f'prompts = "{workload["prompts"]}"', f"max_prompts = {workload['max_prompts']}",
        f"max_new_tokens = {workload['max_new_tokens']}", "ignore_eos = true",
        "[slo]", f"tpot_ms = {tpot_ms}",
        "[capacity]", "rate = false", "concurrency = true", "attainment = 0.95", f"requests = {requests}",
        f"max_requests = {max(4 * requests, 73)}", f"lead_in_s = {capacity.get('lead_in_s', 10)}",
        f"window_s = {capacity.get('window_s', 30)}", f"max_concurrency = {max_concurrency}",
        "[run]", "repeats = 1", "warmup = 1", ""])


def run_specbench(profile_text: str, folder: Path) -> dict:
    (folder / "specbench.toml").write_text(profile_text)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "specbench.cli", "run", "specbench.toml", "--out", "out"],
                            cwd=folder, capture_output=True, text=True, check=False)
    document = folder / "out" / "capacity.json"
    if not document.exists():
        raise SystemExit(f"specbench run failed (exit {result.returncode}): "
                         + (result.stderr.strip().splitlines() or result.stdout.strip().splitlines() or ["-"])[-1])
    data = json.loads(document.read_text())
    entry = next(e for e in data["configurations"] if e["axis"] == "concurrency")
    return {"entry": entry, "slo": data["slo"], "wall_s": time.monotonic() - started, "output": result.stdout}


def prompts_file(profile, folder: Path) -> Path:
    """The profile's prompts, one JSON line each, for AIPerf's single-turn dataset (the user message's text)."""
    tokenizer, _ = load_tokenizer(profile.target.model)
    workload = build_workload(profile.workload, tokenizer, seed=profile.run.seed)
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps({"text": prompt.messages[-1]["content"]}) + "\n" for prompt in workload.prompts))
    return path


def run_aiperf(aiperf: str, *, url: str, tokenizer: str, prompts: Path, tpot_ms: float, max_tokens: int,
               max_concurrency: int, requests: int, folder: Path) -> subprocess.CompletedProcess:
    argv = [aiperf, "profile", "--model", "specbench-target", "--url", url, "--endpoint-type", "chat", "--streaming",
            "--tokenizer", tokenizer, "--input-file", str(prompts), "--custom-dataset-type", "single_turn",
            "--extra-inputs", f"max_tokens:{max_tokens}", "--extra-inputs", "ignore_eos:true",
            "--search-recipe", "max-concurrency-under-sla", "--tpot-sla-ms", f"{tpot_ms:g}",
            "--search-style", "monotonic", "--concurrency-min", "1", "--concurrency-max", str(max_concurrency),
            "--request-count", str(requests), "--warmup-request-count", "1", "--artifact-dir", str(folder / "aiperf"),
            "--ui-type", "none"]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benches.aiperf", description=__doc__.splitlines()[0])
    parser.add_argument("profile", nargs="?", default=DEFAULT_PROFILE)
    parser.add_argument("--aiperf", default=None, help=f"AIPerf's executable (default .engines/aiperf/bin/aiperf, "
                                                       f"else on PATH); to install: {AIPERF_HINT}")
    parser.add_argument("--tpot-ms", default='"1.5x serial"', help="the TPOT limit: milliseconds, or relative to the "
                                                                   'serial TPOT ("1.5x serial", the default)')
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=40, help="per probe (specbench) and per run (AIPerf)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    aiperf = args.aiperf or next((p for p in (".engines/aiperf/bin/aiperf", shutil.which("aiperf")) if p and
                                  Path(p).exists()), None)
    if aiperf is None:
        parser.error(f"no AIPerf: {AIPERF_HINT}, or pass --aiperf")
    source = Path(args.profile).resolve()
    profile = load_profile(source)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="specbench-aiperf-") as scratch:
        folder = args.out or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        server = launch_vllm(profile, port=port, log=folder / "vllm.log")
        try:
            server.wait_ready(timeout_s=profile.server.ready_timeout_s)
            print("[bench] specbench's concurrency search", file=sys.stderr, flush=True)
            mine = run_specbench(specbench_profile(source, url=url, tpot_ms=args.tpot_ms,
                                                   max_concurrency=args.max_concurrency, requests=args.requests),
                                 folder)
            tpot = mine["slo"]["tpot_ms"]
            print(f"[bench] AIPerf's max-concurrency-under-sla at TPOT {tpot:.4g} ms", file=sys.stderr, flush=True)
            started = time.monotonic()
            peer = run_aiperf(aiperf, url=url, tokenizer=engine_reference(profile.target.model, ENGINES["vllm"]),
                              prompts=prompts_file(profile, folder), tpot_ms=tpot,
                              max_tokens=profile.workload.max_new_tokens, max_concurrency=args.max_concurrency,
                              requests=args.requests, folder=folder)
            peer_s = time.monotonic() - started
        finally:
            server.stop()
        report(mine, peer, peer_s, folder)


def aiperf_boundary(folder: Path) -> dict | None:
    """AIPerf's search result: the boundary summary of its search_history.json (feasible_max: the highest
    concurrency that met every SLA filter; infeasible_min: the lowest that did not)."""
    for path in sorted(folder.rglob("search_history.json")):
        data = json.loads(path.read_text())
        found = _find(data, "feasible_max")
        if found is not None:
            return found
    return None


def _history(folder: Path) -> dict:
    paths = sorted(folder.rglob("search_history.json"))
    return json.loads(paths[0].read_text()) if paths else {}


def _find(data, key: str):
    """The object holding `key`, anywhere in a JSON document."""
    if isinstance(data, dict):
        if key in data:
            return data
        values = data.values()
    elif isinstance(data, list):
        values = data
    else:
        return None
    return next((found for value in values if (found := _find(value, key)) is not None), None)


def report(mine: dict, peer: subprocess.CompletedProcess, peer_s: float, folder: Path) -> None:
    entry = mine["entry"]
    print(f"TPOT limit {mine['slo']['tpot_ms']:.4g} ms, attainment 0.95 (specbench) / p95 below it (AIPerf)")
    print(f"specbench: concurrency capacity {entry['capacity']} [{entry['capacity_low']}, {entry['capacity_high']}] "
          f"({entry['status']}; probes " + ", ".join(f"{p['load']:g}: {p['met']}/{p['n_requests']}"
                                                     for p in entry["probes"]) + f"; {mine['wall_s']:.0f} s)")
    boundary = aiperf_boundary(folder / "aiperf")
    if peer.returncode != 0 or boundary is None:
        print(f"AIPerf: exit {peer.returncode}, no boundary found ({peer_s:.0f} s); its last words:")
        print((peer.stderr or peer.stdout)[-3000:])
        return
    high = (boundary.get("feasible_max") or {}).get("value")
    missed = boundary.get("infeasible_min") or {}
    breach = missed.get("first_breach") or {}
    iterations = "; ".join(f"{next(iter(i['variation_values'].values()))}: {'met' if i['feasible'] else 'missed'}"
                           for i in _history(folder / "aiperf").get("iterations", []))
    print(f"AIPerf: highest concurrency meeting it {high}, lowest missing it {missed.get('value')}"
          + (f" ({breach.get('metric_tag')} {breach.get('stat')} {breach.get('observed', 0):.4g} ms there)"
             if breach else "") + f"; runs {iterations}; {peer_s:.0f} s")
    if high and entry["capacity"]:
        print(f"specbench / AIPerf: {entry['capacity'] / high:.2f}")


if __name__ == "__main__":
    main()

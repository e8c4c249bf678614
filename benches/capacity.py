"""The same capacity search run several times (`make bench-capacity`): how far apart its capacities land on this
machine. A capacity is a timing-derived figure, so how repeatable it is is measured here, not asserted in a test.

Each run is `specbench run PROFILE --fresh` into its own folder, one after another. Printed per configuration:
each run's capacity with its interval and bracket, the largest over the smallest capacity and whether each lies
inside the others' intervals; per run, the baseline's TPOT one
request at a time (p50) — the machine's speed during that run: where an SLO limit lies close to it, the capacity
moves with the machine rather than with the configuration.

    python -m benches.capacity [PROFILE] [--runs 2] [--out FOLDER]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from specbench.capacity.document import CAPACITY_FILE

DEFAULT_PROFILE = "profiles/vllm-cpu-capacity.toml"


def run_once(profile: Path, out: Path) -> dict:
    """One `specbench run` of the profile into `out`: its capacity.json entries and the baseline's serial TPOT."""
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "specbench.cli", "run", str(profile), "--out", str(out), "--fresh"],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0 or not (out / CAPACITY_FILE).exists():
        raise SystemExit(f"specbench run {profile} failed (exit {result.returncode}): "
                         + (result.stderr.strip().splitlines() or ["no output"])[-1])
    points = pd.read_parquet(out / "points.parquet")
    serial = points[(points["method"] == "baseline") & points["request_rate"].isna() & (points["concurrency"] == 1)]
    return {"configurations": json.loads((out / CAPACITY_FILE).read_text())["configurations"],
            "serial_tpot_ms": float(serial["tpot_ms_p50"].iloc[0]) if len(serial) else None,
            "wall_s": time.monotonic() - started}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benches.capacity", description=__doc__.splitlines()[0])
    parser.add_argument("profile", nargs="?", default=DEFAULT_PROFILE)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="keep each run's files here (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error(f"--runs must be at least 2 (got {args.runs})")
    profile = Path(args.profile).resolve()
    if not profile.is_file():
        parser.error(f"no profile at {args.profile}")
    with tempfile.TemporaryDirectory(prefix="specbench-capacity-") as scratch:
        root = args.out or Path(scratch)
        runs = []
        for index in range(args.runs):
            print(f"[bench] run {index + 1}/{args.runs} of {profile.name}", file=sys.stderr, flush=True)
            runs.append(run_once(profile, root / f"run-{index + 1}"))
    print(f"{profile.name}, {args.runs} runs")
    for index, run in enumerate(runs, 1):
        tpot = f"{run['serial_tpot_ms']:.1f} ms" if run["serial_tpot_ms"] is not None else "not measured"
        print(f"run {index}: {run['wall_s']:.0f} s; baseline TPOT one request at a time (p50): {tpot}")
    names = dict.fromkeys((e["configuration"], e["axis"]) for run in runs for e in run["configurations"])
    for name, axis in names:
        found = [next((e for e in run["configurations"] if (e["configuration"], e["axis"]) == (name, axis)), None)
                 for run in runs]
        cells = ["-" if e is None or e["capacity"] is None else
                 f"{e['capacity']:.3g} [{_end(e.get('capacity_low'))}, {_end(e.get('capacity_high'))}] (bracket "
                 f"[{_end(e['bracket_low'])}, {_end(e['bracket_high'])}]"
                 + (f", from {e['start']:.3g} ({e['start_from']})" if e.get("start_from") else "") + ")"
                 for e in found]
        capacities = [e["capacity"] for e in found if e is not None and e["capacity"]]
        spread = f"; largest / smallest {max(capacities) / min(capacities):.2f}" if len(capacities) > 1 else ""
        print(f"{name} ({axis}): " + "; ".join(cells) + spread + _agreement(found))


def _end(value) -> str:
    return "-" if value is None else f"{value:.3g}"


def _agreement(found: list) -> str:
    """Whether each run's capacity lies inside every other run's interval (what the issue's two runs must show)."""
    closed = [e for e in found if e is not None and e["capacity"] is not None
              and e.get("capacity_low") is not None and e.get("capacity_high") is not None]
    if len(closed) < 2:
        return ""
    inside = all(other["capacity_low"] <= e["capacity"] <= other["capacity_high"]
                 for e in closed for other in closed if other is not e)
    return "; each inside the others' intervals" if inside else "; NOT each inside the others' intervals"


if __name__ == "__main__":
    main()

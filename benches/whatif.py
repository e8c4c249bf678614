"""How well acceptance predicts speed (`make bench-whatif`): a what-if run (profiles/whatif-cpu.toml: each draft at
imposed acceptances and once with its own) gives a cost surface per draft, gamma and load; each real draft's speedup is
predicted from its measured per-position acceptance on that surface and set beside the speedup measured directly.
Printed: per draft x gamma x load, measured and predicted speedup with intervals, the error, whether the prediction
lay inside the surface's measured range, and whether predicted and measured rank the configurations the same; then
the break-even acceptance per cell. A timing-derived comparison: measured here, never asserted in a test.

    python -m benches.whatif [PROFILE] [--out FOLDER]          # run the profile, then compare
    python -m benches.whatif --results SURFACE [--acceptance-from SOURCE]   # compare folders already written

With --acceptance-from, the acceptance comes from another folder (another backend or machine, same target): the
predictions there are on SURFACE's engine, and measured speedups are SURFACE's own real points.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from specbench.report.folders import load_runs
from specbench.report.whatif import display_break_even, whatif_report

DEFAULT_PROFILE = "profiles/whatif-cpu.toml"


def compare(surface: Path, source: Path | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    (run,), _ = load_runs([surface])
    given = None
    if source is not None:
        (other,), _ = load_runs([source])
        given = (str(source), other.points, other.requests)
    what = whatif_report(run.points, run.requests, source=given, name=run.name)
    if what is None:
        raise SystemExit(f"{surface}: no points with imposed acceptance (the profile's drafts need `acceptance`)")
    return what.predictions, what.break_even


def _ranks_agree(frame: pd.DataFrame) -> str:
    """Per load level: whether predicted and measured speedups order the configurations the same — every pair, and
    the pairs whose measured intervals do not overlap (the ones a measurement can order); Kendall's tau."""
    verdicts = []
    for (temperature, concurrency), group in frame.groupby(["temperature", "concurrency"], dropna=False):
        rows = group.to_dict("records")
        pairs = swapped = separable = separable_swapped = 0
        for i, a in enumerate(rows):
            for b in rows[i + 1:]:
                pairs += 1
                swap = (a["speedup"] - b["speedup"]) * (a["predicted_speedup"] - b["predicted_speedup"]) < 0
                swapped += swap
                if a["speedup_ci_low"] > b["speedup_ci_high"] or b["speedup_ci_low"] > a["speedup_ci_high"]:
                    separable += 1
                    separable_swapped += swap
        tau = (pairs - 2 * swapped) / pairs if pairs else float("nan")
        order = ", ".join(f"{r['draft']} g{r['gamma']}" for r in sorted(rows, key=lambda r: -r["speedup"]))
        verdicts.append(f"T={temperature:g} c={concurrency}: Kendall tau {tau:.2f} ({swapped} of {pairs} pairs "
                        f"swapped; {separable_swapped} of the {separable} pairs whose measured intervals do not "
                        f"overlap); measured order {order}")
    return "; ".join(verdicts)


def report(predictions: pd.DataFrame, break_even: pd.DataFrame) -> None:
    compared = predictions[predictions["speedup"].notna()]
    if not len(compared):
        print("no real point beside a prediction: add \"measured\" to the drafts' acceptance lists")
        return
    table = compared.assign(
        measured=compared.apply(lambda r: f"{r['speedup']:.3f} [{r['speedup_ci_low']:.3f}, {r['speedup_ci_high']:.3f}]",
                                axis=1),
        predicted=compared.apply(lambda r: f"{r['predicted_speedup']:.3f} [{r['predicted_speedup_ci_low']:.3f}, "
                                           f"{r['predicted_speedup_ci_high']:.3f}]", axis=1),
        tokens=compared["source_mean_accepted_length"].map("{:.2f}".format),
        drafted=compared.apply(lambda r: f"{r['source_drafted_per_step']:.2f} | {r['surface_drafted_per_step']:.2f}",
                               axis=1),
        error=compared["error"].map("{:+.1%}".format))
    columns = ["draft", "temperature", "concurrency", "gamma", "tokens", "drafted", "measured", "predicted", "error",
               "extrapolated"]
    print(table[columns].to_string(index=False))
    print(f"largest |error| {compared['error'].abs().max():.1%}, mean |error| {compared['error'].abs().mean():.1%} "
          f"over {len(compared)} configurations")
    print("ranking:", _ranks_agree(compared))
    print()
    print(display_break_even(break_even).to_string(index=False))


def _machine() -> str:
    import torch  # only to name the processor as every figure here does

    from specbench.decoding.devices import device_name
    return device_name(torch.device("cpu"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benches.whatif", description=__doc__.splitlines()[0])
    parser.add_argument("profile", nargs="?", default=DEFAULT_PROFILE)
    parser.add_argument("--out", type=Path, default=None, help="where the run writes (default: results/<name>)")
    parser.add_argument("--results", type=Path, default=None, help="compare this folder instead of running")
    parser.add_argument("--acceptance-from", type=Path, default=None)
    args = parser.parse_args(argv)
    print(f"[bench] machine: {_machine()}", flush=True)
    surface = args.results
    if surface is None:
        surface = args.out or Path("results") / Path(args.profile).stem
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "specbench.cli", "run", args.profile, "--out", str(surface),
                                 "--fresh"], check=False)
        if result.returncode != 0:
            raise SystemExit(f"specbench run {args.profile} failed (exit {result.returncode})")
        print(f"[bench] run took {time.monotonic() - started:.0f} s", flush=True)
    predictions, break_even = compare(surface, args.acceptance_from)
    report(predictions, break_even)


if __name__ == "__main__":
    main()

"""Where one machine's test time goes against another's: two ledgers of `make test` (JSON lines of test, seconds,
engine; `.ci/run` keeps its run's in .ci/test-seconds.jsonl), compared file by file and test by test.

    .venv/bin/python tests/compare_seconds.py tests/fixtures/test-seconds-zen4.jsonl .ci/test-seconds.jsonl

prints the suite's and the real-engine tests' totals with their ratio, then the files and the tests that added the
most seconds, each with its ratio: on a slower machine, the tests that slow down more than the rest are the ones to
look at first (tests/budget.toml holds the totals)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path


# the xdist group `--dist loadgroup` appends to a test's id ("...[param]@static"): the same test with or without it
GROUP_SUFFIX = re.compile(r"@[A-Za-z_][\w-]*$")


class LedgerError(ValueError):
    """A line that is not what make test writes."""


def read_ledger(path: Path) -> tuple[dict[str, float], set[str]]:
    """Each test's seconds (summed where a test appears more than once) and the tests that ran a real engine."""
    seconds: dict[str, float] = defaultdict(float)
    engine: set[str] = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            test = GROUP_SUFFIX.sub("", row["test"])
            seconds[test] += float(row["seconds"])
        except (ValueError, KeyError, TypeError) as error:
            raise LedgerError(f"{path}:{number}: not a ledger line ({error}); expected "
                              '{"test": ..., "seconds": ..., "engine": ...} as make test writes it') from None
        if row.get("engine"):
            engine.add(test)
    return dict(seconds), engine


def by_file(seconds: dict[str, float]) -> dict[str, float]:
    files: dict[str, float] = defaultdict(float)
    for test, spent in seconds.items():
        files[test.split("::", 1)[0]] += spent
    return dict(files)


def compared(reference: dict[str, float], this: dict[str, float]) -> list[tuple[str, float, float]]:
    """(name, reference seconds, these seconds) for every name in either, the most seconds added first."""
    names = set(reference) | set(this)
    rows = [(name, reference.get(name, 0.0), this.get(name, 0.0)) for name in names]
    return sorted(rows, key=lambda row: (row[1] - row[2], row[0]))


def ratio(reference_s: float, this_s: float) -> str:
    if reference_s <= 0:
        return "new" if this_s > 0 else "-"
    if this_s <= 0:
        return "gone"
    return f"{this_s / reference_s:.2f}x"


def report(reference: Path, this: Path, top: int = 15) -> list[str]:
    ref_seconds, ref_engine = read_ledger(reference)
    seconds, engine = read_ledger(this)
    lines = [f"{reference} -> {this}"]
    for label, ref_s, this_s in (
            ("all tests", sum(ref_seconds.values()), sum(seconds.values())),
            ("real-engine tests", sum(ref_seconds[t] for t in ref_engine), sum(seconds[t] for t in engine))):
        lines.append(f"{label:20s} {ref_s:8.0f} s -> {this_s:8.0f} s  {ratio(ref_s, this_s)}")
    for title, rows in (("files", compared(by_file(ref_seconds), by_file(seconds))),
                        ("tests", compared(ref_seconds, seconds))):
        lines.append(f"the {top} {title} that added the most seconds:")
        lines += [f"  {this_s - ref_s:+8.1f} s  {ref_s:7.1f} -> {this_s:7.1f} s  {ratio(ref_s, this_s):>6s}  {name}"
                  for name, ref_s, this_s in rows[:top]]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reference", type=Path, help="the ledger to compare against")
    parser.add_argument("this", type=Path, help="this machine's ledger")
    parser.add_argument("--top", type=int, default=15, help="how many files and tests to list (default 15)")
    args = parser.parse_args(argv)
    if args.top < 1:
        print(f"--top {args.top}: list at least 1 file and test (e.g. --top 15)", file=sys.stderr)
        return 2
    for path in (args.reference, args.this):
        if not path.is_file():
            print(f"{path}: no such ledger; `make test` writes one where TEST_LEDGER names it (.ci/run: "
                  ".ci/test-seconds.jsonl)", file=sys.stderr)
            return 2
    try:
        print("\n".join(report(args.reference, args.this, args.top)))
    except LedgerError as error:
        print(error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

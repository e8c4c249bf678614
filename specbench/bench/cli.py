"""`python -m specbench.bench` options: parse them into a BenchConfig, measure, summarize, render."""

from __future__ import annotations

import argparse
import sys

from specbench.bench.measure import MODEL, PROMPTS, BenchConfig, measure
from specbench.bench.render import render
from specbench.bench.summary import summarize
from specbench.devices import DeviceError
from specbench.models import ModelError
from specbench.profile import ProfileError

DESCRIPTION = "The native backend against the Hugging Face backend, side by side on the embedded model (`make bench`)."


def parse_args(argv: list[str] | None = None) -> BenchConfig:
    parser = argparse.ArgumentParser(prog="python -m specbench.bench", description=DESCRIPTION)
    parser.add_argument("--prompts", type=int, default=6, help=f"prompts from {PROMPTS} (default 6)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per request (default 64)")
    parser.add_argument("--gamma", type=int, default=4, help="drafted tokens per step (default 4)")
    parser.add_argument("--ngram-max", type=int, default=3, help="longest n-gram prompt lookup matches (default 3)")
    parser.add_argument("--repeats", type=int, default=2, help="passes over the prompts (default 2)")
    parser.add_argument("--no-draft", action="store_true", help="skip the draft method (int8 self-draft)")
    parser.add_argument("--model", default=MODEL, help=f"the target (default {MODEL}); any specbench model reference")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args(argv)
    for name in ("prompts", "max_new_tokens", "gamma", "ngram_max", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(args, name)})")
    return BenchConfig(prompts=args.prompts, max_new_tokens=args.max_new_tokens, gamma=args.gamma,
                       ngram_max=args.ngram_max, repeats=args.repeats, draft=not args.no_draft, model=args.model,
                       device=args.device, dtype=args.dtype)


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    try:
        measurement = measure(config, progress=lambda message: print(f"[bench] {message}", file=sys.stderr, flush=True))
    except (ProfileError, DeviceError, ModelError) as error:  # a bad --model or --device, in one line
        sys.exit(f"error: {error}")
    render(summarize(measurement))

"""`python -m benches` options: parse them into a BenchConfig, measure, summarize, render."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benches.measure import MODEL, PROMPTS, BenchConfig, measure
from benches.vllm import DEFAULT_PYTHON
from benches.render import render
from benches.summary import summarize
from specbench.decoding.devices import DeviceError
from specbench.models.registry import ModelError
from specbench.profile import ProfileError

DESCRIPTION = ("Native eager, native compiled, HF generate and vLLM's CPU build, side by side on the embedded model "
               "(`make bench`).")


def parse_args(argv: list[str] | None = None) -> BenchConfig:
    parser = argparse.ArgumentParser(prog="python -m benches", description=DESCRIPTION)
    parser.add_argument("--prompts", type=int, default=6, help=f"prompts from {PROMPTS} (default 6)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per request (default 64)")
    parser.add_argument("--gamma", type=int, default=3, help="drafted tokens per step (default 3)")
    parser.add_argument("--ngram-max", type=int, default=3, help="longest n-gram prompt lookup matches (default 3)")
    parser.add_argument("--repeats", type=int, default=2, help="passes over the prompts (default 2)")
    parser.add_argument("--no-draft", action="store_true", help="skip the draft method (int8 self-draft)")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip the native backend compiled (static caches, torch.compile; ~2 min of compilation)")
    parser.add_argument("--vllm", type=Path, default=DEFAULT_PYTHON,
                        help="vLLM's Python (default: %(default)s, where `make engine-vllm` installs it)")
    parser.add_argument("--no-vllm", action="store_true", help="skip vLLM")
    parser.add_argument("--model", default=MODEL, help=f"the target (default {MODEL}); any specbench model reference")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args(argv)
    for name in ("prompts", "max_new_tokens", "gamma", "ngram_max", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(args, name)})")
    if not args.no_vllm and args.vllm != DEFAULT_PYTHON and not args.vllm.exists():
        parser.error(f"--vllm: no Python at {args.vllm} (make engine-vllm installs one; --no-vllm skips vLLM)")
    return BenchConfig(prompts=args.prompts, max_new_tokens=args.max_new_tokens, gamma=args.gamma,
                       ngram_max=args.ngram_max, repeats=args.repeats, draft=not args.no_draft,
                       compile=not args.no_compile, vllm=_vllm(args), model=args.model, device=args.device,
                       dtype=args.dtype)


def _vllm(args: argparse.Namespace) -> Path | None:
    """vLLM's Python where it is installed and the bench runs fp32 on the CPU (the settings vLLM's CPU build
    compares at), else None; why it is skipped goes to stderr."""
    if args.no_vllm:
        return None
    if not args.vllm.exists():
        print(f"[bench] vLLM skipped: no vLLM at {args.vllm} (make engine-vllm installs it)", file=sys.stderr)
        return None
    if args.device != "cpu" or args.dtype != "float32":
        print("[bench] vLLM skipped: its CPU build is compared at fp32 on the CPU only", file=sys.stderr)
        return None
    return args.vllm


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    try:
        measurement = measure(config, progress=lambda message: print(f"[bench] {message}", file=sys.stderr, flush=True))
    except (ProfileError, DeviceError, ModelError) as error:  # a bad --model or --device, in one line
        sys.exit(f"error: {error}")
    render(summarize(measurement))

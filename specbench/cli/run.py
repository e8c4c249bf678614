"""`specbench run [PROFILE]`: sweep drafts x gamma x temperature (x load) against the baseline and record every
request."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from specbench.cli.common import fail, profile_path
from specbench.ui.console import console
from specbench.core.errors import OneLineError
from specbench.core.results import default_out_dir
from specbench.profile import DEFAULT_PROFILE, ProfileError, load_profile, with_overrides
from specbench.ui.lines import ProgressStyle
from specbench.ui.run import print_capacity, print_run_summary, sweep_observer


def run(
    profile: Annotated[Optional[Path], typer.Argument(help=f"Profile TOML (default: {DEFAULT_PROFILE}).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Output folder (default: results/<profile name>).")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Start over instead of resuming the points already done.")] = False,
    backend: Annotated[Optional[str], typer.Option(help="native (instrumented engine) or hf (transformers generate).")] = None,
    device: Annotated[Optional[str], typer.Option(help="auto, cpu, cuda or cuda:N.")] = None,
    max_prompts: Annotated[Optional[int], typer.Option(help="Use only the first N prompts of the workload.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help="Generate at most N tokens per request (overrides workload.max_new_tokens).")] = None,
    workers: Annotated[int, typer.Option(help="Local worker processes sharing the sweep and its folder (one per visible GPU where there are GPUs); across machines, use --shard.")] = 1,
    storage: Annotated[Optional[str], typer.Option(hidden=True)] = None,
    study: Annotated[Optional[str], typer.Option(hidden=True)] = None,
    usd_per_hour: Annotated[Optional[float], typer.Option(help="Price of one replica per hour (overrides [cost] usd_per_hour): the cost per 1M output tokens per point and at capacity.")] = None,
    traffic: Annotated[Optional[float], typer.Option(help="Requests/s to serve (overrides [cost] traffic_rps): the replicas each configuration needs at its capacity.")] = None,
    compiled: Annotated[Optional[bool], typer.Option("--compile/--no-compile", help="Native backend: static KV caches and compiled steps (CUDA graphs on a GPU); overrides run.compile (default: on a GPU, off on a CPU).")] = None,
    shard: Annotated[Optional[str], typer.Option(help="Run one part of the sweep: I/N (from 1), or auto/N to take the index from JOB_COMPLETION_INDEX (Kubernetes Indexed Job) or SLURM_ARRAY_TASK_ID (Slurm array). Each engine configuration runs on one shard, every shard measures its own baselines, into its own folder (default results/<name>-shard<I>of<N>); `specbench merge` joins them.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print a machine-readable summary on stdout.")] = False,
    progress_style: Annotated[ProgressStyle, typer.Option("--progress", help="auto: bars in a terminal, plain timestamped lines elsewhere (a pipe, a file, a job log, TERM=dumb): one per point started and finished, and a heartbeat while a point runs; bars; lines.")] = ProgressStyle.auto,
) -> None:
    """Sweep drafts x gamma x temperature against the baseline; record every request into parquet."""
    from specbench.sweep import run_profile  # the sweep and its backends load only when a run starts
    from specbench.sweep.shard import parse_shard

    if storage is not None or study is not None:
        fail(f"--{'storage' if storage is not None else 'study'}: a sweep is no longer shared through an Optuna study; "
             "split it across machines with --shard I/N (each shard its own folder and baselines), then "
             "`specbench merge`; on one machine, --workers N")
    path = profile_path(profile)
    try:
        loaded = with_overrides(load_profile(path), backend=backend, device=device, max_prompts=max_prompts,
                                max_new_tokens=max_new_tokens,
                                usd_per_hour=usd_per_hour, traffic_rps=traffic, compile=compiled)
    except ProfileError as error:
        fail(str(error))
    try:
        part = parse_shard(shard) if shard is not None else None
    except OneLineError as error:
        fail(str(error))
    suffix = f"-shard{part.index}of{part.count}" if part is not None else ""
    out_dir = out or default_out_dir(loaded.name, suffix=suffix)
    out_console = console(stderr=json_output)
    try:
        with sweep_observer(out_console, progress_style) as progress:
            result = run_profile(loaded, out=out_dir, fresh=fresh, workers=workers, observer=progress, shard=part)
    except OneLineError as error:
        fail(str(error))
    print_run_summary(out_console, result.points, str(out_dir), probes=result.capacity_probes)
    if result.capacity is not None:
        print_capacity(out_console, result.capacity)
    if json_output:
        points = json.loads(result.points.to_json(orient="records"))
        summary = {"out_dir": str(out_dir), "failed": result.failed, "ran": result.ran, "points": points,
                   **({"capacity": result.capacity.to_dict()} if result.capacity is not None else {})}
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    raise typer.Exit(1 if result.failed or result.capacity_not_found else 0)

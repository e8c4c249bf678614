"""`specbench tune [PROFILE]`: find the configuration to deploy with Optuna, resumable and shared across machines,
and write it as a runnable profile and engine flags."""

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
from specbench.profile import DEFAULT_PROFILE, load_profile, with_overrides
from specbench.tune.objectives import OBJECTIVES, Constraints, parse_objective
from specbench.ui.tune import print_tune_summary, tune_observer


def tune(
    profile: Annotated[Optional[Path], typer.Argument(help=f"Profile TOML (default: {DEFAULT_PROFILE}; none with --replay).")] = None,
    objective: Annotated[str, typer.Option(help=f"What to optimise: {', '.join(OBJECTIVES)} (pareto: tokens/s vs peak memory).")] = "tokens_per_s",
    trials: Annotated[int, typer.Option(help="Trials per temperature (completed or pruned), calibration included.")] = 20,
    max_peak_memory_mb: Annotated[Optional[float], typer.Option(help="Constraint: peak memory at most this.")] = None,
    min_acceptance_rate: Annotated[Optional[float], typer.Option(help="Constraint: acceptance rate at least this.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the TPE sampler.")] = 0,
    warm_start: Annotated[int, typer.Option(help="Predicted-best configurations tried after the calibration trials.")] = 3,
    tolerance: Annotated[float, typer.Option(help="Near-ties: within max(noise, TOLERANCE x best) prefer the smaller gamma.")] = 0.01,
    prune: Annotated[bool, typer.Option("--prune/--no-prune", help="Stop clearly worse trials after each prompt.")] = True,
    storage: Annotated[Optional[str], typer.Option(help="Optuna RDB storage URL shared by every worker: postgresql:// (or mysql://) across machines, sqlite:/// on one (default: study.db in the output folder).")] = None,
    study: Annotated[Optional[str], typer.Option(help="Study name (default: <profile name>-<objective>); -t<T>-p<P> is appended per temperature.")] = None,
    workers: Annotated[int, typer.Option(help="Local worker processes (one per visible GPU where there are GPUs).")] = 1,
    replay: Annotated[Optional[Path], typer.Option(help="Answer points from this recorded run folder instead of running them.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Output folder (default: results/<profile name>-tune).")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Start over: drop the studies and files of an earlier tune.")] = False,
    device: Annotated[Optional[str], typer.Option(help="auto, cpu, cuda or cuda:N.")] = None,
    max_prompts: Annotated[Optional[int], typer.Option(help="Use only the first N prompts of the workload.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help="Generate at most N tokens per request (overrides workload.max_new_tokens).")] = None,
    load_mix: Annotated[Optional[str], typer.Option(help="Weight of each load level, e.g. 1:0.5,4:0.3,r0.5:0.2 (concurrency N, request rate rN); default: the profile's load.mix, else equal.")] = None,
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="Launch the recommendation (server backend) and measure it at every load level beside the best single setting and the baseline.")] = True,
    json_output: Annotated[bool, typer.Option("--json", help="Print recommendation.json on stdout.")] = False,
) -> None:
    """Find the configuration to deploy with Optuna: warm start, TPE, pruning; resumable and distributed."""
    from specbench.tune.plan import TuneSettings
    from specbench.tune.runner import tune as run_tune

    try:
        settings = TuneSettings(
            objective=parse_objective(objective), trials=trials, seed=seed, warm_start=warm_start, tolerance=tolerance,
            prune=prune, storage=storage, study=study, workers=workers, fresh=fresh, load_mix=load_mix, verify=verify,
            constraints=Constraints(max_peak_memory_mb=max_peak_memory_mb, min_acceptance_rate=min_acceptance_rate),
        )
        loaded = None
        if replay is None:
            loaded = with_overrides(load_profile(profile_path(profile)), device=device, max_prompts=max_prompts,
                                    max_new_tokens=max_new_tokens)
        elif profile is not None:
            fail("--replay uses the profile recorded in the run folder; give no PROFILE with it")
        name = loaded.name if loaded is not None else replay.name
        out_dir = out or default_out_dir(name, suffix="-tune")
        out_console = console(stderr=json_output)
        with tune_observer(out_console) as observer:
            result = run_tune(loaded, out_dir=out_dir, settings=settings, replay=replay, observer=observer)
    except OneLineError as error:
        fail(str(error))
    print_tune_summary(out_console, result.trials, result.recommendation, str(out_dir))
    if json_output:
        sys.stdout.write(json.dumps(result.recommendation.to_dict(), indent=2, default=str) + "\n")

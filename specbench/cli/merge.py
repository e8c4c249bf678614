"""`specbench merge DIR... --out OUT`: the shards of one run (`specbench run --shard I/N`) as one result set."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specbench.cli.common import fail
from specbench.core.errors import OneLineError
from specbench.ui.console import console, print_note


def merge(
    folders: Annotated[list[Path], typer.Argument(metavar="DIR", help="The shards' result folders.")],
    out: Annotated[Path, typer.Option(help="The merged folder (new or empty).")],
) -> None:
    """Join the shards of one run into one result set (a host and a shard column; speedups stay per host)."""
    from specbench.scaleout.merge import merge as merge_folders

    try:
        merged = merge_folders(folders, out=out)
    except OneLineError as error:
        fail(str(error))
    notes = console(stderr=True)
    for note in merged.notes:
        print_note(notes, note)
    print_note(notes, f"merged {len(folders)} folders: {merged.points} points, {merged.requests} requests in {out}")

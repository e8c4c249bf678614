"""What every command shares: the one-line error and exit code 2, the default profile."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import typer

from specbench.profile import DEFAULT_PROFILE
from specbench.ui.console import print_error


def fail(message: str) -> NoReturn:
    """The error as one line on stderr, exit code 2."""
    print_error(message)
    raise typer.Exit(2)


def profile_path(profile: Path | None) -> Path:
    """The PROFILE argument, or the default profile where the current folder has it."""
    path = profile or Path(DEFAULT_PROFILE)
    if profile is None and not path.exists():
        fail(f"no profile given and {DEFAULT_PROFILE} is not in the current folder; pass a profile path")
    return path

"""The terminal itself: a console sized for logs and pipes, an error line, a dim note."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape


def console(*, stderr: bool = False) -> Console:
    """Tables need room: a log file or pipe gets 120 columns rather than rich's default 80."""
    found = Console(stderr=stderr)
    return found if found.is_terminal else Console(stderr=stderr, width=120)


def print_error(message: str) -> None:
    """`error: MESSAGE` on stderr, the message as given (no markup)."""
    Console(stderr=True).print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)


def print_note(out: Console, text: str, *, dim: bool = False) -> None:
    """A line of progress or a result path, printed as given."""
    out.print(f"[dim]{escape(text)}[/dim]" if dim else escape(text), highlight=False, soft_wrap=True)

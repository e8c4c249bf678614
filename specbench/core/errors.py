"""One-line error text: how a failed point, a failed worker or an unusable file is told to the user."""

from __future__ import annotations

MAX_CHARS = 500


class OneLineError(Exception):
    """An error the CLI tells as one line and exit code 2: bad input (a profile key, a file, an option), an unusable
    environment (no such device, an unreachable storage) or a failed worker. Each feature's error derives from it
    (ProfileError, WorkloadError, ModelError, ...), so a command catches them all without importing the features."""


def first_line(error: BaseException) -> str:
    """The first non-empty line of the message, or the exception's type name when it has none."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def one_line(error: BaseException, *, limit: int = MAX_CHARS) -> str:
    """`Type: first line`, once: a message that already starts with its type's name keeps it as is."""
    text = first_line(error)
    name = type(error).__name__
    return (text if text == name or text.startswith(f"{name}:") else f"{name}: {text}")[:limit]

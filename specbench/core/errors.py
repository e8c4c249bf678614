"""One-line error text: how a failed point, a failed worker or an unusable file is told to the user."""

from __future__ import annotations

MAX_CHARS = 500


def first_line(error: BaseException) -> str:
    """The first non-empty line of the message, or the exception's type name when it has none."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def one_line(error: BaseException, *, limit: int = MAX_CHARS) -> str:
    """`Type: first line`, once: a message that already starts with its type's name keeps it as is."""
    text = first_line(error)
    name = type(error).__name__
    return (text if text == name or text.startswith(f"{name}:") else f"{name}: {text}")[:limit]

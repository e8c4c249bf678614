"""The models' one-line errors, importable without torch: a reference that cannot be resolved or loaded, and an
EAGLE-3 head that cannot be used."""

from __future__ import annotations

from specbench.core.errors import OneLineError


class ModelError(OneLineError, ValueError):
    """A model reference that cannot be resolved or loaded; the message names the fix."""


class HeadError(OneLineError, ValueError):
    """An EAGLE-3 head that cannot be used; the message is one line naming the file, the key and the fix."""

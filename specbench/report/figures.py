"""What every plot module shares: the Plot (a title, a caption and PNG bytes), a grid of panels, and drawing
with matplotlib's Agg renderer (no display, no pyplot state)."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

from matplotlib.figure import Figure

PANEL_W, PANEL_H, MAX_COLUMNS = 4.8, 3.4, 3


@dataclass(frozen=True)
class Plot:
    title: str
    caption: str
    png: bytes


def drawn(makers) -> list[Plot | tuple[str, str]]:
    """Each (title, make, reason): the plot `make` draws, or (title, why not drawn) when it draws nothing."""
    plots: list[Plot | tuple[str, str]] = []
    for title, make, reason in makers:
        plot = make()
        plots.append(plot if plot is not None else (title, f"Not drawn: {reason}."))
    return plots


def panels(n: int, *, width: float = PANEL_W, height: float = PANEL_H, columns: int = MAX_COLUMNS,
           sharey: bool = False):
    """A figure with n panels in rows of at most `columns`, in reading order; the panels' axes."""
    columns = min(n, columns)
    rows = math.ceil(n / columns)
    figure = Figure(figsize=(width * columns, height * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False, sharey=sharey).ravel()
    for unused in axes[n:]:
        unused.remove()  # a figure holds only the panels drawn
    return figure, list(axes[:n])


def to_plot(figure: Figure, title: str, caption: str) -> Plot:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return Plot(title=title, caption=caption, png=buffer.getvalue())

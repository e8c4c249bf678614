"""Predicted against measured across gamma: per draft, each gamma's measured speedup beside the speedup its
draft's largest-gamma point predicts for it (`max_gamma_predicted_speedup`: acceptance per position truncated,
verify costs from the run's timing of the target's forward pass) — the prediction `specbench tune`'s warm start
acts on for gammas it has not measured — and the prediction from the point's own steps, which restates it."""

from __future__ import annotations

import pandas as pd

from specbench.report import tables

COLUMNS = ("draft", "temperature", "top_p", "level", "gamma", "speedup", "speedup_ci_low", "speedup_ci_high",
           "predicted_speedup", "max_gamma_predicted_speedup", "error")
DISPLAY_COLUMNS = ("draft", "load", "gamma", "measured", "95% CI", "from its own steps", "from the largest gamma",
                   "error")


def across_gamma(points: pd.DataFrame) -> pd.DataFrame:
    """COLUMNS, for drafts measured at two gammas or more with a prediction from the largest; error = predicted
    from the largest gamma / measured − 1. Empty for runs without such predictions (server, hf, older files)."""
    if "max_gamma_predicted_speedup" not in points:
        return pd.DataFrame(columns=COLUMNS)
    data = tables.trusted(points)
    data = data[(data["method"] != "baseline") & data["max_gamma_predicted_speedup"].notna()
                & data["speedup"].notna()].assign(level=tables.levels)
    keys = ["draft", "temperature", "top_p", "level"]
    data = data[data.groupby(keys)["gamma"].transform("nunique") > 1]
    if not len(data):
        return pd.DataFrame(columns=COLUMNS)
    data = data.assign(error=data["max_gamma_predicted_speedup"] / data["speedup"] - 1)
    return data.sort_values(keys + ["gamma"])[list(COLUMNS)].reset_index(drop=True)


def display(frame: pd.DataFrame) -> pd.DataFrame:
    rows = [(row["draft"], row["level"], f"{int(row['gamma'])}", tables.fmt(row["speedup"], ".2f", "x"),
             tables.fmt_ci(row["speedup_ci_low"], row["speedup_ci_high"]),
             tables.fmt(row["predicted_speedup"], ".2f", "x"), tables.fmt(row["max_gamma_predicted_speedup"], ".2f", "x"),
             f"{row['error']:+.1%}") for row in frame.to_dict("records")]
    return pd.DataFrame(rows, columns=DISPLAY_COLUMNS)


def caption(frame: pd.DataFrame) -> str:
    worst = frame["error"].abs().max()
    return (f"Each gamma's speedup as its draft's largest-gamma point predicts it (what tune's warm start acts on), "
            f"against the measurement: largest error {worst:.1%}. The largest gamma predicts itself.")

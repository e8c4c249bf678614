"""The acceptance what-if in a report: the surface measured with imposed acceptance (speedup against mean accepted
length, per draft, gamma and load), the break-even acceptance with its interval, and the speedup predicted for real
drafts from their measured acceptance — beside the speedup measured here wherever the folder has both. Synthetic
points appear only here: never in the point tables, the best points or a recommendation."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from specbench.core import whatif
from specbench.core.errors import OneLineError
from specbench.report import tables


class WhatIfError(OneLineError, ValueError):
    """A prediction that cannot be made from the folders given (another target, no per-position acceptance)."""


@dataclass(frozen=True)
class WhatIf:
    surface: pd.DataFrame  # the synthetic points
    break_even: pd.DataFrame  # whatif.break_evens
    predictions: pd.DataFrame  # whatif.predictions, with the measured speedup beside where this folder has it
    source: str  # where the acceptance the predictions use was measured
    fits: dict  # whatif.fit_surface: per cell, its fit (the plot draws them)


SURFACE_COLUMNS = ("draft", "load", "gamma", "imposed", "measured acceptance", "tokens/pass", "drafted/pass",
                   "speedup", "95% CI")
BREAK_EVEN_COLUMNS = ("draft", "temperature", "load", "gamma", "pays once tokens/pass >=", "95% CI",
                      "= position-1 acceptance", "measured over")
PREDICTION_COLUMNS = ("draft", "temperature", "load", "gamma", "tokens/pass (source)", "drafted/pass source | surface",
                      "predicted", "95% CI", "measured", "95% CI ", "error")


def synthetic_mask(points: pd.DataFrame) -> pd.Series:
    if "imposed_acceptance" not in points:
        return pd.Series(False, index=points.index)
    return points["imposed_acceptance"].notna()


def whatif_report(points: pd.DataFrame, requests: pd.DataFrame, *, source: tuple[str, pd.DataFrame, pd.DataFrame]
                  | None = None, name: str = "this folder") -> WhatIf | None:
    """None without synthetic points. `source`: (name, points, requests) of the folder whose measured acceptance
    the predictions use (default: this folder's own real points)."""
    synthetic = whatif.synthetic_points(points)
    if not len(synthetic):
        return None
    fits = whatif.fit_surface(points)
    source_name, source_points, source_requests = source if source is not None else (name, points, requests)
    if source is not None:
        check_source(points, source_points, source_name)
    predicted = whatif.predictions(fits, whatif.source_acceptances(source_points, source_requests))
    if source is not None and not len(predicted):
        raise WhatIfError(f"{source_name}: no point there measured its draft's per-position acceptance for a draft, "
                          "temperature and gamma this surface has (same draft names; a gamma at least as large): "
                          "run those drafts with a backend that records it (native, or vLLM 0.32+)")
    return WhatIf(surface=synthetic, break_even=whatif.break_evens(fits), predictions=_beside_measured(predicted, points),
                  source=source_name, fits=fits)


def check_source(points: pd.DataFrame, source_points: pd.DataFrame, source_name: str) -> None:
    mine, theirs = _target(points), _target(source_points)
    if mine is not None and theirs is not None and mine != theirs:
        raise WhatIfError(f"{source_name}: measured on target {theirs}, the surface's target is {mine}: acceptance "
                          "belongs to a target and draft; measure the draft on the same target")


def _target(points: pd.DataFrame) -> str | None:
    if "target_model" not in points or not points["target_model"].notna().any():
        return None
    return str(points["target_model"].dropna().iloc[0])


def _beside_measured(predicted: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """The measured speedup of this folder's real point at each predicted cell (NaN where there is none)."""
    if not len(predicted):
        return predicted
    real = points[(points["status"] == "ok") & ~synthetic_mask(points) & (points["method"] != "baseline")]
    measured = {whatif.cell_key(row): row for row in real.to_dict("records")}
    rows = []
    for row in predicted.to_dict("records"):
        found = measured.get(whatif.cell_key(row), {})
        speedup = found.get("speedup")
        rows.append({**row, "measured_point_id": found.get("point_id"), "speedup": speedup,
                     "speedup_ci_low": found.get("speedup_ci_low"), "speedup_ci_high": found.get("speedup_ci_high"),
                     "error": row["predicted_speedup"] / speedup - 1 if speedup else np.nan})
    return pd.DataFrame(rows)


def _load(row: dict) -> str:
    rate = row.get("request_rate")
    if rate is not None and not pd.isna(rate):
        return f"{rate:g} requests/s"
    concurrency = row.get("concurrency")
    return f"concurrency {int(concurrency) if concurrency is not None and not pd.isna(concurrency) else 1}"


def display_surface(surface: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for row in surface.sort_values(["draft", "temperature", "gamma", "mean_accepted_length"]).to_dict("records"):
        rows.append((row["draft"], f"{_load(row)}, T={row['temperature']:g}", str(int(row["gamma"])),
                     str(row["imposed_acceptance"]), tables.fmt(row.get("acceptance_rate"), ".0%"),
                     tables.fmt(row.get("mean_accepted_length"), ".2f"), tables.fmt(row.get("drafted_per_step"), ".2f"),
                     tables.fmt(row.get("speedup"), ".2f", "x"),
                     tables.fmt_ci(row.get("speedup_ci_low"), row.get("speedup_ci_high"))))
    return pd.DataFrame(rows, columns=SURFACE_COLUMNS)


def display_break_even(frame: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for row in frame.to_dict("records"):
        if row["verdict"] == "never pays":
            length, alpha = f"never (needs > {int(row['gamma']) + 1})", "-"
        else:
            length = tables.fmt(row["break_even_length"], ".2f") + (" (always)" if row["verdict"] == "always pays" else "")
            alpha = tables.fmt(row["break_even_alpha"], ".2f")
        interval = f"[{tables.fmt(row['break_even_length_low'], '.2f')}, " \
                   f"{tables.fmt(row['break_even_length_high'], '.2f') if _present(row['break_even_length_high']) else 'open'}]"
        rows.append((row["draft"], f"{row['temperature']:g}", _load(row), str(int(row["gamma"])), length, interval,
                     alpha, f"{row['length_low_measured']:.2f}-{row['length_high_measured']:.2f} ({row['points']} points)"))
    return pd.DataFrame(rows, columns=BREAK_EVEN_COLUMNS)


def display_predictions(frame: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for row in frame.to_dict("records"):
        drafted = f"{tables.fmt(row['source_drafted_per_step'], '.2f')} | {tables.fmt(row['surface_drafted_per_step'], '.2f')}"
        rows.append((row["draft"], f"{row['temperature']:g}", _load(row), str(int(row["gamma"])),
                     tables.fmt(row["source_mean_accepted_length"], ".2f") + (" (outside)" if row["extrapolated"] else ""),
                     drafted, tables.fmt(row["predicted_speedup"], ".2f", "x"),
                     tables.fmt_ci(row["predicted_speedup_ci_low"], row["predicted_speedup_ci_high"]),
                     tables.fmt(row.get("speedup"), ".2f", "x"),
                     tables.fmt_ci(row.get("speedup_ci_low"), row.get("speedup_ci_high")),
                     f"{row['error']:+.1%}" if _present(row.get("error")) else "-"))
    return pd.DataFrame(rows, columns=PREDICTION_COLUMNS)


def _present(value) -> bool:
    return value is not None and not pd.isna(value)


SURFACE_CAPTION = ("Points run with imposed acceptance (acceptance_source = synthetic): the draft runs and costs what "
                   "it costs, its tokens are kept per the imposed per-position rates, not verified. Their outputs are "
                   "not the target's and they are never the best point.")
BREAK_EVEN_CAPTION = ("Where speculation starts to pay: the mean accepted length (tokens per target pass, bonus "
                      "included) at speedup 1, from the fit 1/speedup = c + d/length over the surface's points, with a "
                      "95 % bootstrap interval; and the same as the position-1 acceptance of a draft that drafts gamma "
                      "tokens every step and accepts each with that probability.")


def prediction_caption(what: WhatIf) -> str:
    frame = what.predictions
    compared = frame[frame["error"].notna()] if "error" in frame else frame.iloc[:0]
    worst = f" Largest error against the measured speedup: {compared['error'].abs().max():.1%}." if len(compared) else ""
    return (f"Speedup predicted from the acceptance measured in {what.source} (its largest gamma, cut at each gamma) "
            f"on this surface, with a 95 % interval (the surface's points and the source's requests resampled); "
            f"'outside': a length beyond the surface's measured range.{worst}")


def surface_plot(what: WhatIf):
    """Speedup against tokens per pass: the measured synthetic points and each fit, one line per gamma, one panel per
    draft, temperature and load level; real points measured here marked. None without a fit."""
    from specbench.report.figures import panels, to_plot  # matplotlib: only where figures are drawn

    surface = what.surface
    keys = sorted({(r["draft"], float(r["temperature"]), _load(r)) for r in surface.to_dict("records")})
    if not keys:
        return None
    figure, axes = panels(len(keys), sharey=False)
    for axis, (draft, temperature, load) in zip(axes, keys):
        mine = surface[(surface["draft"] == draft) & (surface["temperature"] == temperature)
                       & (surface.apply(_load, axis=1) == load)]
        for gamma, group in mine.groupby("gamma"):
            line = axis.plot(group["mean_accepted_length"], group["speedup"], "o", label=f"gamma {int(gamma)}")[0]
            fit = what.fits.get(whatif.cell_key(group.iloc[0]))
            if fit is not None:
                lengths = np.linspace(1.0, gamma + 1.0, 50)
                axis.plot(lengths, [fit.speedup(x) for x in lengths], "-", color=line.get_color(), alpha=0.6)
        if len(what.predictions):
            shown = what.predictions[(what.predictions["draft"] == draft)
                                     & (what.predictions["temperature"] == temperature)
                                     & (what.predictions.apply(_load, axis=1) == load)]
            if "speedup" in shown and shown["speedup"].notna().any():
                axis.plot(shown["source_mean_accepted_length"], shown["speedup"], "k^", label="real draft (measured)")
        axis.axhline(1.0, color="grey", lw=0.8, ls="--")
        axis.set_title(f"{draft}, T={temperature:g}, {load}", fontsize=9)
        axis.set_xlabel("tokens per target pass")
        axis.set_ylabel("speedup")
        axis.legend(fontsize=7)
    return to_plot(figure, "Speedup against acceptance (imposed)",
                   "Each synthetic point and its fit per gamma; the dashed line is speedup 1 (break-even).")

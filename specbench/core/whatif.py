"""Acceptance what-ifs: the engine's cost surface (speedup against acceptance, measured with imposed acceptance),
the acceptance at which speculation starts to pay, and the speedup a draft measured elsewhere would have here.

A surface cell is one draft x gamma x temperature x load level, its synthetic points measured at several imposed
acceptances. Within a cell a step's cost does not depend on what it accepts, only on what it drafts (the same draft,
gamma and proposals), so a request's time is its prefill plus its decode tokens / (tokens per pass) passes:

    1 / speedup = c + d / L,    L = mean accepted length (tokens per target pass, bonus included)

with c the prefill's share and d the pass's cost over the baseline's time per token. The cell fits c and d by
weighted least squares on its points' measured L and speedups (weights from their bootstrap intervals). Break-even:
speedup 1 at L* = d / (1 - c). A draft measured elsewhere (per-position acceptance: the one currency, the same as
imposed rates) has, at each gamma up to the one it was measured at, L = its step model at that gamma
(stats.StepModel.at_gamma); predicted speedup 1 / (c + d / L). Intervals: a parametric bootstrap of the cell's
points (each speedup drawn from its interval) and of the source's requests.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from specbench.core import imposed
from specbench.core.stats import StepModel

Z95 = 1.959964
CELL = ("draft", "method", "gamma", "temperature", "top_p", "concurrency", "request_rate")
BOOTSTRAP = 2000


@dataclass(frozen=True)
class Fit:
    """One cell's surface: 1 / speedup = c + d / L, from `points` synthetic points spanning L in [low, high]."""

    c: float
    d: float
    points: int
    low: float  # the smallest and largest measured mean accepted length
    high: float
    replicates: np.ndarray  # [B, 2]: bootstrap (c, d)
    drafted_per_step: float | None  # what the cell's points drafted per pass (the proposals the cost was measured at)
    # the pass's cost per drafted token over the baseline's time per token (the draft's and the verification's), from
    # the draft's cells at every gamma together (module docstring); None where their proposals hardly differ
    per_drafted: float | None = None

    def _d(self, d, drafted: float | None):
        """d at another proposal count: a pass that drafts fewer tokens (an n-gram lookup finding fewer matches)
        costs less by per_drafted for each."""
        if drafted is None or self.per_drafted is None or self.drafted_per_step is None:
            return d
        return d + self.per_drafted * (drafted - self.drafted_per_step)

    def speedup(self, length: float, drafted: float | None = None) -> float:
        return 1.0 / (self.c + self._d(self.d, drafted) / length)

    def speedups(self, lengths: np.ndarray, drafted: float | None = None) -> np.ndarray:
        """Per bootstrap replicate (paired with `lengths`, one per replicate)."""
        return 1.0 / (self.replicates[:, 0] + self._d(self.replicates[:, 1], drafted) / lengths)


def synthetic_points(points: pd.DataFrame) -> pd.DataFrame:
    """The ok points that ran with imposed acceptance."""
    if "imposed_acceptance" not in points:
        return points.iloc[:0]
    ok = points["status"] == "ok" if "status" in points else True
    return points[ok & points["imposed_acceptance"].notna()]


def cell_key(row) -> tuple:
    values = []
    for name in CELL:
        value = row.get(name) if hasattr(row, "get") else row[name]
        values.append(None if value is None or (not isinstance(value, str) and pd.isna(value)) else value)
    if values[CELL.index("request_rate")] is None and values[CELL.index("concurrency")] is None:
        values[CELL.index("concurrency")] = 1
    return tuple(values)


def fit_surface(points: pd.DataFrame, *, seed: int = 0) -> dict[tuple, Fit]:
    """Per cell with at least two distinct measured lengths: its fit, with its draft's cost per drafted token."""
    fits = _cell_fits(points, seed=seed)
    synthetic = synthetic_points(points)
    families = synthetic.apply(lambda row: _family(cell_key(row)), axis=1) if len(synthetic) else pd.Series(dtype=object)
    slopes = {family: _per_drafted(synthetic[families == family]) for family in {_family(key) for key in fits}}
    for key, fit in fits.items():
        fits[key] = replace(fit, per_drafted=slopes[_family(key)])
    return fits


def _family(key: tuple) -> tuple:
    """A cell's key without its gamma: the draft's cells at one temperature and load."""
    return tuple(v for name, v in zip(CELL, key) if name != "gamma")


MIN_DRAFTED_SPREAD = 0.5  # tokens per pass: less, and the cost per drafted token cannot be told from the cost per pass


def _per_drafted(rows: pd.DataFrame) -> float | None:
    """The cost of a drafted token per pass, b in 1 / speedup = c + (a + b D) / L over a draft's synthetic points at
    every gamma (D: tokens drafted per pass): their proposals differ by gamma, which one cell's cannot tell."""
    rows = rows[rows["mean_accepted_length"].notna() & rows["speedup"].notna() & rows["drafted_per_step"].notna()]
    if len(rows) < 4:
        return None
    lengths, drafted = rows["mean_accepted_length"].to_numpy(float), rows["drafted_per_step"].to_numpy(float)
    if drafted.max() - drafted.min() < MIN_DRAFTED_SPREAD:
        return None
    design = np.stack([np.ones_like(lengths), 1.0 / lengths, drafted / lengths], axis=1)
    (_, _, slope), *_ = np.linalg.lstsq(design, 1.0 / rows["speedup"].to_numpy(float), rcond=None)
    return float(slope) if slope > 0 else None


def _cell_fits(points: pd.DataFrame, *, seed: int) -> dict[tuple, Fit]:
    rng = np.random.default_rng(seed)
    fits: dict[tuple, Fit] = {}
    synthetic = synthetic_points(points)
    for key, cell in synthetic.groupby(synthetic.apply(cell_key, axis=1), sort=False):
        cell = cell[cell["mean_accepted_length"].notna() & cell["speedup"].notna() & (cell["speedup"] > 0)]
        lengths = cell["mean_accepted_length"].to_numpy(float)
        if len(np.unique(np.round(lengths, 6))) < 2:
            continue
        speedup = cell["speedup"].to_numpy(float)
        low = pd.to_numeric(cell["speedup_ci_low"], errors="coerce").to_numpy(float)
        high = pd.to_numeric(cell["speedup_ci_high"], errors="coerce").to_numpy(float)
        sd = (high - low) / (2 * Z95)  # each point's speedup's spread; 1 / speedup's by the delta method
        y, x = 1.0 / speedup, 1.0 / lengths
        sd_y = np.where(np.isfinite(sd) & (sd > 0), sd / speedup**2, np.nan)
        if np.isnan(sd_y).all():  # no intervals (one prompt each): the residuals' spread, or a nominal 2 %
            residual = _residual_sd(x, y)
            sd_y = np.full_like(y, residual if residual > 0 else 0.02 * y.mean())
        sd_y = np.where(np.isnan(sd_y), np.nanmean(sd_y), sd_y)
        projection = _wls_projection(x, sd_y)
        c, d = projection @ y
        replicates = (y + rng.standard_normal((BOOTSTRAP, len(y))) * sd_y) @ projection.T  # [B, 2]
        drafted = pd.to_numeric(cell.get("drafted_per_step"), errors="coerce") if "drafted_per_step" in cell else None
        fits[key] = Fit(c=c, d=d, points=len(cell), low=float(lengths.min()), high=float(lengths.max()),
                        replicates=replicates,
                        drafted_per_step=float(drafted.mean()) if drafted is not None and drafted.notna().any() else None)
    return fits


def _wls_projection(x: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """[2, n]: (c, d) of the weighted least-squares fit of y = c + d x is this matrix times y."""
    root_w = 1.0 / np.maximum(sd, 1e-12)
    return np.linalg.pinv(np.stack([np.ones_like(x), x], axis=1) * root_w[:, None]) * root_w[None, :]


def _residual_sd(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) <= 2:
        return 0.0
    c, d = _wls_projection(x, np.ones_like(y)) @ y
    residuals = y - (c + d * x)
    return float(np.sqrt((residuals**2).sum() / (len(x) - 2)))


@dataclass(frozen=True)
class BreakEven:
    """The mean accepted length at which a cell's speculation starts to pay (speedup 1), with a 95 % interval; the
    same as the acceptance at position 1 of a draft that drafts gamma tokens every step and accepts each with that
    probability (geometric); `verdict` where it never pays or always does within 1..gamma + 1."""

    length: float | None
    length_low: float | None
    length_high: float | None
    alpha: float | None
    alpha_low: float | None
    alpha_high: float | None
    verdict: str  # "pays above" | "never pays" | "always pays"


def break_even(fit: Fit, gamma: int) -> BreakEven:
    top = gamma + 1.0

    def solve(c: np.ndarray, d: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            length = np.where(c < 1.0, d / (1.0 - c), np.inf)  # c >= 1: the prefill alone is slower
        return np.clip(np.where(np.isnan(length), np.inf, length), 1.0, np.inf)

    point = float(solve(np.array([fit.c]), np.array([fit.d]))[0])
    replicates = solve(fit.replicates[:, 0], fit.replicates[:, 1])
    low, high = (float(v) for v in np.percentile(replicates, [2.5, 97.5]))
    alpha = imposed.geometric_alpha
    if point > top:
        return BreakEven(None, min(low, top), None, None, None, None, "never pays")
    if point <= 1.0:
        return BreakEven(1.0, 1.0, min(high, top), 0.0, 0.0, alpha(min(high, top), gamma), "always pays")
    return BreakEven(point, low, min(high, top) if high <= top else None, alpha(point, gamma), alpha(low, gamma),
                     alpha(high, gamma) if high <= top else None, "pays above")


@dataclass(frozen=True, eq=False)
class SourceAcceptance:
    """A draft's acceptance measured somewhere, at `gamma`: per request, its target passes and how many of them
    drafted and accepted each position."""

    draft: str
    method: str
    temperature: float
    top_p: float
    gamma: int
    point_id: str
    steps: np.ndarray  # [requests]
    drafted: np.ndarray  # [requests, gamma]: passes that drafted at least position i + 1
    accepted: np.ndarray  # [requests, gamma]: passes that accepted positions 1..i + 1

    def model(self, picks: np.ndarray | None = None) -> StepModel:
        """The step model of every request, or of the requests `picks` (a bootstrap draw)."""
        rows = slice(None) if picks is None else picks
        return StepModel.from_counts(steps=int(self.steps[rows].sum()), drafted_per_position=self.drafted[rows].sum(0),
                                     accepted_per_position=self.accepted[rows].sum(0))

    def lengths(self, gamma: int, *, replicates: int, rng: np.random.Generator) -> tuple[float, np.ndarray, float]:
        """Tokens per pass at `gamma` (<= the measured one): the estimate, its bootstrap over requests, and the
        tokens drafted per pass."""
        greedy = self.temperature == 0
        model = self.model().at_gamma(gamma, greedy=greedy)
        picks = rng.integers(0, len(self.steps), size=(replicates, len(self.steps)))
        boot = np.array([_tokens(self.model(p), gamma, greedy) for p in picks])
        return model.tokens_per_step(), boot, model.drafted_per_step()


def _tokens(model: StepModel, gamma: int, greedy: bool) -> float:
    try:
        return model.at_gamma(gamma, greedy=greedy).tokens_per_step()
    except ValueError:  # a draw of requests that never stepped
        return float("nan")


def _per_request(column: pd.Series, gamma: int) -> np.ndarray:
    """[requests, gamma]: each request's per-position counts, cut or padded to gamma."""
    counts = np.zeros((len(column), gamma))
    for row, values in enumerate(column):
        values = np.asarray(values, dtype=float)[:gamma]
        counts[row, : len(values)] = values
    return counts


def source_acceptances(points: pd.DataFrame, requests: pd.DataFrame) -> dict[tuple, list[SourceAcceptance]]:
    """Per (draft, temperature, top_p): the measured (not imposed) acceptance of the draft at each gamma it ran at
    (largest first), at the lowest load it ran at, from its requests' per-position counts. Points whose requests
    lack those counts (an engine that reports no per-position acceptance) are left out."""
    found: dict[tuple, list[SourceAcceptance]] = {}
    real = points[(points["status"] == "ok") & (points["method"] != "baseline") & points["gamma"].notna()]
    if "imposed_acceptance" in real:
        real = real[real["imposed_acceptance"].isna()]
    if "gamma_schedule" in real:
        real = real[real["gamma_schedule"].isna()]
    load = real["request_rate"].notna() if "request_rate" in real else pd.Series(False, index=real.index)
    order = real.assign(_open=load, _c=real["concurrency"].fillna(1) if "concurrency" in real else 1)
    order = order.sort_values(["gamma", "_open", "_c"], ascending=[False, True, True], kind="stable")
    for _, row in order.iterrows():
        key = (row["draft"], float(row["temperature"]), float(row["top_p"]))
        if any(source.gamma == int(row["gamma"]) for source in found.get(key, ())):
            continue
        rows = requests[requests["point_id"] == row["point_id"]]
        if "error" in rows:
            rows = rows[rows["error"].isna()]
        if not len(rows) or rows["accepted_per_position"].isna().any() or rows["drafted_per_position"].isna().any():
            continue
        decode = (rows["output_tokens"] - 1).clip(lower=0)
        steps = rows["target_steps"] if "target_steps" in rows and rows["target_steps"].notna().all() \
            else decode - rows["accepted_tokens"].fillna(0)
        if steps.sum() <= 0:
            continue
        gamma = int(row["gamma"])
        found.setdefault(key, []).append(SourceAcceptance(
            row["draft"], row["method"], key[1], key[2], gamma, row["point_id"], steps.to_numpy(float),
            _per_request(rows["drafted_per_position"], gamma), _per_request(rows["accepted_per_position"], gamma)))
    return found


def nearest_source(sources: list[SourceAcceptance], gamma: int) -> SourceAcceptance | None:
    """The point measured at `gamma`, else at the smallest gamma above it (cut to `gamma`); None when every one
    was measured at a smaller gamma (acceptance beyond it was never observed)."""
    above = [source for source in sources if source.gamma >= gamma]
    return min(above, key=lambda source: source.gamma) if above else None


def predictions(fits: dict[tuple, Fit], sources: dict[tuple, list[SourceAcceptance]], *, seed: int = 0) -> pd.DataFrame:
    """Per surface cell whose draft, temperature and top_p have a measured acceptance at this gamma or above: the
    predicted speedup with its 95 % interval, the source's tokens per pass and drafted tokens per pass at the gamma
    beside the surface's, and whether the length lies outside what the surface measured (an extrapolation). The source
    is the draft's point at the gamma, else at the nearest gamma above it."""
    rng = np.random.default_rng(seed)
    rows = []
    for key, fit in fits.items():
        draft, method, gamma, temperature, top_p, concurrency, request_rate = key
        source = nearest_source(sources.get((draft, float(temperature), float(top_p)), []), int(gamma))
        if source is None:
            continue
        length, boot, drafted = source.lengths(int(gamma), replicates=len(fit.replicates), rng=rng)
        predicted = fit.speedups(boot, drafted)
        predicted = predicted[np.isfinite(predicted)]
        low, high = np.percentile(predicted, [2.5, 97.5]) if len(predicted) else (np.nan, np.nan)
        rows.append({"draft": draft, "method": method, "gamma": int(gamma), "temperature": temperature, "top_p": top_p,
                     "concurrency": concurrency, "request_rate": request_rate,
                     "source_point_id": source.point_id, "source_gamma": source.gamma,
                     "source_mean_accepted_length": length, "source_drafted_per_step": drafted,
                     "surface_drafted_per_step": fit.drafted_per_step,
                     "per_drafted_token": fit.per_drafted,
                     "predicted_speedup": fit.speedup(length, drafted), "predicted_speedup_ci_low": float(low),
                     "predicted_speedup_ci_high": float(high),
                     "extrapolated": bool(length < fit.low - 1e-9 or length > fit.high + 1e-9)})
    return pd.DataFrame(rows)


def break_evens(fits: dict[tuple, Fit]) -> pd.DataFrame:
    rows = []
    for key, fit in fits.items():
        found = break_even(fit, int(key[CELL.index("gamma")]))
        rows.append({**dict(zip(CELL, key)), "points": fit.points, "length_low_measured": fit.low,
                     "length_high_measured": fit.high, "verdict": found.verdict,
                     "break_even_length": found.length, "break_even_length_low": found.length_low,
                     "break_even_length_high": found.length_high, "break_even_alpha": found.alpha,
                     "break_even_alpha_low": found.alpha_low, "break_even_alpha_high": found.alpha_high})
    return pd.DataFrame(rows)

"""The report's plots, drawn with matplotlib's Agg renderer (no display, no pyplot state) into PNG
bytes. Each function returns a Plot, or None when the points hold nothing to draw."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from specbench.report import load_tables, tables
from specbench.report.trials import StudyReport

PANEL_W, PANEL_H, MAX_COLUMNS = 4.8, 3.4, 3


@dataclass(frozen=True)
class Plot:
    title: str
    caption: str
    png: bytes


def all_plots(points: pd.DataFrame, categories: pd.DataFrame) -> list[Plot | tuple[str, str]]:
    """Every plot in report order; a (title, why not drawn) pair where there was nothing to draw."""
    makers = [
        ("Speedup vs gamma", lambda: speedup_vs_gamma(points), "no speculative point ran"),
        *_load_makers(points),
        ("Acceptance by draft position", lambda: acceptance_by_position(points),
         "no per-position draft counts (the hf backend does not record them)"),
        ("Measured vs predicted speedup", lambda: measured_vs_predicted(points),
         "no predicted speedups (they need the native backend's draft and verify timings)"),
        ("Speedup per workload category", lambda: category_heatmap(categories),
         "no speculative point with a baseline on the same categories"),
        ("Throughput vs peak memory", lambda: throughput_vs_memory(points), "no tokens/s and peak memory recorded"),
    ]
    return _drawn(makers)


def load_plots(points: pd.DataFrame) -> list[Plot | tuple[str, str]]:
    """The plots of a run under load (speedup and p99 latency against load at several levels, goodput against
    request rate at several rates), or why not drawn; nothing at one level."""
    return _drawn(_load_makers(points))


def _load_makers(points: pd.DataFrame) -> list:
    makers = []
    levels = tables.load_levels(points)
    if len(levels) >= 2:
        makers += [(f"Speedup vs {tables.load_axis(levels)}", lambda: speedup_vs_load(points),
                    "no trusted speculative point has a speedup"),
                   ("Latency p99 vs load", lambda: latency_vs_load(points), "no TTFT or TPOT p99 recorded")]
    if "request_rate" in points and points["request_rate"].dropna().nunique() >= 2:
        makers.append(("Goodput vs request rate", lambda: goodput_vs_rate(points), "no point has a goodput"))
    return makers


def tune_plots(studies: list[StudyReport]) -> list[Plot | tuple[str, str]]:
    """The plots of a tune's output, in report order; (title, why not drawn) where there was nothing."""
    return _drawn([
        ("Objective by trial", lambda: objective_by_trial(studies), "no trial finished"),
        ("Parameter importances", lambda: parameter_importances(studies),
         "; ".join(f"{s.study}: {s.importance_note}" for s in studies) or "no study"),
    ])


def _drawn(makers) -> list[Plot | tuple[str, str]]:
    """Each (title, make, reason): the plot `make` draws, or (title, why not drawn) when it draws nothing."""
    drawn: list[Plot | tuple[str, str]] = []
    for title, make, reason in makers:
        plot = make()
        drawn.append(plot if plot is not None else (title, f"Not drawn: {reason}."))
    return drawn


ROLE_COLORS = {"calibration": "tab:orange", "warm_start": "tab:green", "search": "tab:blue"}


def objective_by_trial(studies: list[StudyReport]) -> Plot | None:
    drawn = [s for s in studies if s.trials["value"].notna().any()]
    if not drawn:
        return None
    figure, axes = _panels(len(drawn), height=PANEL_H + 0.7)
    for ax, study in zip(axes, drawn):
        trials = study.trials.dropna(subset=["value"])
        for role, group in trials.groupby("role", sort=False):
            color = ROLE_COLORS.get(str(role), "tab:grey")
            complete = group[group["state"] == "COMPLETE"]
            pruned = group[group["state"] != "COMPLETE"]
            ax.scatter(complete["number"], complete["value"], color=color, label=str(role), zorder=3)
            if len(pruned):
                ax.scatter(pruned["number"], pruned["value"], facecolors="none", edgecolors=color, zorder=3,
                           label=f"{role} (pruned: value so far)")
        best = study.trials.dropna(subset=["best_so_far"])
        if len(best):
            ax.step(best["number"], best["best_so_far"], where="post", color="black", linewidth=1, label="best so far")
        chosen = (study.recommendation or {}).get("trial")
        if chosen is not None and chosen in set(trials["number"]):
            row = trials[trials["number"] == chosen].iloc[0]
            ax.scatter([chosen], [row["value"]], marker="*", s=220, color="gold", edgecolors="black", zorder=4,
                       label="recommended")
        direction = f" ({study.direction})" if study.direction else ""
        ax.set(title=tables.group_title(study.temperature, study.top_p), xlabel="trial",
               ylabel=f"{study.objective or 'objective'}{direction}")
        ax.margins(0.08)
    legend = {}  # one legend below the panels (inside one it hides trials), each label once
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    figure.legend(legend.values(), legend.keys(), loc="outside lower center", ncols=min(4, len(legend)),
                  fontsize="small")
    return _plot(figure, "Objective by trial",
                 "Each trial's objective in the order trials were numbered, coloured by role: calibration "
                 "(one per draft at the largest gamma), warm start (the analytic model's best predictions), "
                 "search (TPE). Hollow: pruned, at its value when stopped. Star: the recommended trial.")


def parameter_importances(studies: list[StudyReport]) -> Plot | None:
    drawn = [s for s in studies if s.importances]
    if not drawn:
        return None
    figure, axes = _panels(len(drawn), height=max(2.2, 0.5 * max(len(s.importances) for s in drawn) + 1.4))
    for ax, study in zip(axes, drawn):
        names = list(study.importances)[::-1]  # the most important on top
        values = [study.importances[name] for name in names]
        ax.barh(names, values, color="tab:blue")
        for y, value in enumerate(values):
            ax.text(value, y, f" {value:.2f}", va="center", fontsize="small")
        ax.set(title=tables.group_title(study.temperature, study.top_p), xlabel="importance", xlim=(0, 1.15))
    return _plot(figure, "Parameter importances",
                 "The share of the objective's variance over the completed trials that each parameter explains, "
                 "as Optuna's fANOVA evaluator computes it (importances sum to 1). Few trials make them rough; "
                 "ngram_max, which only n-gram drafts have, is left out when a study mixes drafts.")


def speedup_vs_gamma(points: pd.DataFrame) -> Plot | None:
    data = _speculative(points).dropna(subset=["gamma", "speedup"])
    if not len(data):
        return None
    groups = list(data.groupby(["temperature", "top_p"], sort=True))
    figure, axes = _panels(len(groups))
    for ax, ((temperature, top_p), group) in zip(axes, groups):
        for draft, lines in group.groupby("draft", sort=True):
            lines = lines.sort_values("gamma")
            gamma = lines["gamma"].astype(float)
            (line,) = ax.plot(gamma, lines["speedup"], marker="o", label=draft)
            band = lines.dropna(subset=["speedup_ci_low", "speedup_ci_high"])
            if len(band):
                ax.fill_between(band["gamma"].astype(float), band["speedup_ci_low"], band["speedup_ci_high"],
                                color=line.get_color(), alpha=0.2, linewidth=0)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="baseline")
        ax.set(title=tables.group_title(temperature, top_p), xlabel="gamma (draft tokens per step)", ylabel="speedup")
        ax.set_xticks(sorted(group["gamma"].astype(int).unique()))
        ax.legend(fontsize="small")
    return _plot(figure, "Speedup vs gamma",
                 "Speedup over the baseline per draft; bands are the 95 % bootstrap CIs; dashed: the baseline.")


def speedup_vs_load(points: pd.DataFrame) -> Plot | None:
    figure = load_figure(points)
    axis = tables.load_axis(tables.load_levels(points))
    return None if figure is None else _plot(
        figure, f"Speedup vs {axis}",
        f"Speedup over the baseline at the same {'concurrency' if axis == 'concurrency' else 'load level'}, per "
        "draft and gamma; bands are the 95 % bootstrap CIs; dashed: the baseline; star: the highest level at which "
        "the CI lies wholly above 1.0. Unstable points are drawn (the tables label them); failed and mismatched "
        "are not.")


def load_figure(points: pd.DataFrame) -> Figure | None:
    """x: requests in flight (log2, a tick per level), or, once a request rate is among the levels, every level
    in load order (a tick each); y: speedup; a line per configuration, a star at its crossover, a panel per
    temperature and top_p."""
    speedups = tables.load_speedups(points)
    data = speedups[speedups["status"].isin(["ok", "unstable"]) & (speedups["method"] != "baseline")]
    data = data.dropna(subset=["speedup"])
    if not len(data):
        return None
    crossover = load_tables.crossovers(speedups).dropna(subset=["load"]).set_index(["temperature", "top_p",
                                                                                     "configuration"])
    closed = tables.load_axis(tables.load_levels(points)) == "concurrency"
    x = "concurrency" if closed else "load_rank"
    groups = list(data.groupby(["temperature", "top_p"], sort=True))
    figure, axes = _panels(len(groups))
    for ax, ((temperature, top_p), group) in zip(axes, groups):
        for name, line in group.groupby("configuration", sort=False):
            (drawn,) = ax.plot(line[x].astype(float), line["speedup"], marker="o", label=name)
            band = line.dropna(subset=["speedup_ci_low", "speedup_ci_high"])
            if len(band):
                ax.fill_between(band[x].astype(float), band["speedup_ci_low"].astype(float),
                                band["speedup_ci_high"].astype(float), color=drawn.get_color(), alpha=0.2, linewidth=0)
            if (temperature, top_p, name) in crossover.index:
                at = line[line["load"] == crossover.loc[(temperature, top_p, name), "load"]].iloc[0]
                ax.plot([float(at[x])], [at["speedup"]], marker="*", markersize=14, linestyle="none",
                        color=drawn.get_color(), markeredgecolor="black", label=f"_crossover {name}")  # the caption says
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="baseline")
        if closed:
            ticks = tables.concurrency_levels(points)
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [str(level) for level in ticks])
            ax.set_xticks([], minor=True)
            ax.set(xlabel="concurrency (requests in flight)")
        else:
            _level_ticks(ax, tables.load_levels(points))
        ax.set(title=tables.group_title(temperature, top_p), ylabel="speedup")
        ax.legend(fontsize="small")
    return figure


def _level_ticks(ax, levels: list[str]) -> None:
    ax.set_xticks(range(len(levels)), levels, rotation=30, ha="right")
    ax.set(xlabel="load level")


LATENCIES = (("ttft_ms_p99", "TTFT p99 (ms)"), ("tpot_ms_p99", "TPOT p99 (ms)"))


def latency_vs_load(points: pd.DataFrame) -> Plot | None:
    figure = latency_figure(points)
    return None if figure is None else _plot(
        figure, "Latency p99 vs load",
        "The 99th percentile of time to first token and of time per output token at each load level, per "
        "configuration and the baseline; failed and mismatched points are not drawn.")


def latency_figure(points: pd.DataFrame) -> Figure | None:
    """A row per temperature and top_p, a TTFT p99 and a TPOT p99 panel each; x: every load level in load order
    (a tick each), a line per configuration (the baseline too)."""
    columns = [column for column, _ in LATENCIES if column in points]
    data = tables.by_configuration(tables.trusted(points))
    if len(columns) < len(LATENCIES) or data[columns].isna().all().all():
        return None
    levels = tables.load_levels(points)
    rank = {label: index for index, label in enumerate(levels)}  # by_configuration ranks the trusted levels only
    groups = list(data.groupby(["temperature", "top_p"], sort=True))
    figure = Figure(figsize=(PANEL_W * 2, PANEL_H * len(groups)), layout="constrained")
    rows = figure.subplots(len(groups), 2, squeeze=False)
    for (ttft_ax, tpot_ax), ((temperature, top_p), group) in zip(rows, groups):
        for ax, (column, label) in ((ttft_ax, LATENCIES[0]), (tpot_ax, LATENCIES[1])):
            for name, line in group.dropna(subset=[column]).groupby("configuration", sort=False):
                ax.plot([rank[level] for level in line["load"]], line[column].astype(float), marker="o", label=name)
            _level_ticks(ax, levels)
            ax.set(title=tables.group_title(temperature, top_p), ylabel=label)
        ttft_ax.legend(fontsize="small")
    return figure


def goodput_vs_rate(points: pd.DataFrame) -> Plot | None:
    figure = goodput_figure(points)
    slos = "; ".join(str(slo) for slo in points["slo"].dropna().unique()) if "slo" in points else ""
    return None if figure is None else _plot(
        figure, "Goodput vs request rate",
        f"Requests per second that met every SLO ({slos or 'not recorded'}) at each offered request rate, per "
        "configuration and the baseline; dashed: the offered rate (every request meets the SLO).")


def goodput_figure(points: pd.DataFrame) -> Figure | None:
    """x: offered request rate, y: goodput; a line per configuration (the baseline too), a panel per
    temperature and top_p."""
    data = load_tables.goodput(points).dropna(subset=["request_rate"])
    if not len(data):
        return None
    groups = list(data.groupby(["temperature", "top_p"], sort=True))
    figure, axes = _panels(len(groups))
    for ax, ((temperature, top_p), group) in zip(axes, groups):
        for name, line in group.groupby("configuration", sort=False):
            ax.plot(line["request_rate"].astype(float), line["goodput"].astype(float), marker="o", label=name)
        rates = sorted(group["request_rate"].astype(float).unique())
        ax.plot(rates, rates, color="grey", linestyle="--", linewidth=1, label="offered rate")
        ax.set(title=tables.group_title(temperature, top_p), xlabel="request rate (requests/s)",
               ylabel="goodput (requests/s)")
        ax.legend(fontsize="small")
    return figure


def acceptance_by_position(points: pd.DataFrame) -> Plot | None:
    data = tables.acceptance_by_position(points)
    if not len(data):
        return None
    groups = list(data.groupby(["temperature", "top_p"], sort=True))
    figure, axes = _panels(len(groups))
    for ax, ((temperature, top_p), group) in zip(axes, groups):
        for point_id, line in group.groupby("point_id", sort=False):
            ax.plot(line["position"], line["acceptance_rate"], marker="o", label=_label(line.iloc[0]))
        ax.set(title=tables.group_title(temperature, top_p), xlabel="draft position", ylabel="acceptance rate",
               ylim=(0, 1.05))
        ax.set_xticks(sorted(group["position"].unique()))
        ax.legend(fontsize="small")
    return _plot(figure, "Acceptance by draft position",
                 "accepted / drafted at each position of the speculated block, per point.")


def measured_vs_predicted(points: pd.DataFrame) -> Plot | None:
    data = _speculative(points).dropna(subset=["speedup", "predicted_speedup"])
    if not len(data):
        return None
    figure, (ax,) = _panels(1, width=6.0, height=4.6)
    for draft, group in data.groupby("draft", sort=True):
        low = (group["speedup"] - group["speedup_ci_low"]).clip(lower=0).fillna(0)
        high = (group["speedup_ci_high"] - group["speedup"]).clip(lower=0).fillna(0)
        ax.errorbar(group["predicted_speedup"], group["speedup"], yerr=[low, high], fmt="o", capsize=3, label=draft)
    bounds = pd.concat([data["speedup"], data["predicted_speedup"], data["speedup_ci_low"].dropna(),
                        data["speedup_ci_high"].dropna()])
    lo, hi = float(bounds.min()), float(bounds.max())
    pad = 0.05 * (hi - lo or 1.0)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="grey", linestyle="--", linewidth=1, label="y = x")
    ax.set(xlabel="predicted speedup (analytic model)", ylabel="measured speedup")
    ax.legend(fontsize="small")
    return _plot(figure, "Measured vs predicted speedup",
                 "Each point against the Leviathan et al. prediction from its measured acceptance and costs; "
                 "error bars are 95 % CIs. Above the line: faster than predicted. The prediction assumes gamma "
                 "tokens drafted every step: n-gram drafts propose fewer, or none when nothing matches, so they "
                 "fall below the line without any engine overhead; model drafts below it point at the engine.")


def category_heatmap(categories: pd.DataFrame) -> Plot | None:
    matrix = tables.category_matrix(categories)
    if not len(matrix) or matrix.isna().all().all():
        return None
    values = matrix.to_numpy(dtype=float)
    finite = values[~pd.isna(values)]
    # red below 1x, green above; each side spans its own range (speedups are never negative)
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(float(finite.min()), 0.95), vmax=max(float(finite.max()), 1.05))
    figure, (ax,) = _panels(1, width=max(5.0, 1.1 * len(matrix.columns) + 3.0),
                            height=max(2.5, 0.42 * len(matrix) + 1.5))
    image = ax.imshow(values, cmap="RdYlGn", norm=norm, aspect="auto")
    ax.set_xticks(range(len(matrix.columns)), matrix.columns, rotation=30, ha="right")
    ax.set_yticks(range(len(matrix)), matrix.index)
    for (row, column), value in pd.DataFrame(values).stack().items():
        ax.text(column, row, f"{value:.2f}", ha="center", va="center", fontsize="small")
    figure.colorbar(image, ax=ax, label="speedup")
    return _plot(figure, "Speedup per workload category",
                 "Per point and category: sum of output tokens / sum of end-to-end time, over the baseline's "
                 "on the same category.")


def throughput_vs_memory(points: pd.DataFrame) -> Plot | None:
    data = tables.trusted(points).dropna(subset=["tokens_per_s", "peak_memory_mb"])
    if not len(data):
        return None
    front = tables.pareto_front(data)
    groups = list(data.groupby(["temperature", "top_p"], sort=True))
    figure, axes = _panels(len(groups))
    for ax, ((temperature, top_p), group) in zip(axes, groups):
        on_front = group[front[group.index]].sort_values("peak_memory_mb")
        ax.scatter(group["peak_memory_mb"], group["tokens_per_s"], color="tab:blue", alpha=0.6, label="point")
        ax.step(on_front["peak_memory_mb"], on_front["tokens_per_s"], where="post", color="tab:red",
                label="Pareto front")
        ax.scatter(on_front["peak_memory_mb"], on_front["tokens_per_s"], color="tab:red", zorder=3)
        for row in on_front.to_dict("records"):
            ax.annotate(_label(row), (row["peak_memory_mb"], row["tokens_per_s"]), fontsize="x-small",
                        xytext=(4, 4), textcoords="offset points")
        ax.margins(0.15)
        ax.set(title=tables.group_title(temperature, top_p), xlabel="peak memory (MB)", ylabel="tokens/s")
        ax.legend(fontsize="small")
    return _plot(figure, "Throughput vs peak memory",
                 "The Pareto front: points that no other point beats on both tokens/s and peak memory.")


def _speculative(points: pd.DataFrame) -> pd.DataFrame:
    trusted = tables.trusted(points)
    return trusted[trusted["method"] != "baseline"]


def _label(row) -> str:
    gamma = row["gamma"]
    return str(row["draft"]) if gamma is None or pd.isna(gamma) else f"{row['draft']} g={int(gamma)}"


def _panels(n: int, *, width: float = PANEL_W, height: float = PANEL_H):
    columns = min(n, MAX_COLUMNS)
    rows = math.ceil(n / columns)
    figure = Figure(figsize=(width * columns, height * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for unused in axes[n:]:
        unused.set_visible(False)
    return figure, list(axes[:n])


def _plot(figure: Figure, title: str, caption: str) -> Plot:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return Plot(title=title, caption=caption, png=buffer.getvalue())

"""The report's plots against load: speedup and p99 latency per load level, goodput against request rate, and
SLO attainment and goodput around each configuration's capacity. Closed-loop levels (requests in flight) and
open-loop levels (request rates) are never put on one axis: each has its own panel."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from specbench.report import capacity, load_tables, tables
from specbench.report.figures import PANEL_H, PANEL_W, Plot, drawn, panels, to_plot

AXIS_LABELS = {"concurrency": "concurrency (requests in flight)", "request_rate": "request rate (requests/s)"}
LOOP_NAMES = {"concurrency": "closed loop", "request_rate": "open loop"}


def load_makers(points: pd.DataFrame) -> list:
    """(title, make, why not drawn) for each plot of a run under load; none at one level."""
    makers = []
    levels = tables.load_levels(points)
    if len(levels) >= 2:
        makers += [(f"Speedup vs {tables.load_axis(levels)}", lambda: speedup_vs_load(points),
                    "no trusted speculative point has a speedup"),
                   ("Latency p99 vs load", lambda: latency_vs_load(points), "no TTFT or TPOT p99 recorded")]
    if "request_rate" in points and points["request_rate"].dropna().nunique() >= 2:
        makers.append(("Goodput vs request rate", lambda: goodput_vs_rate(points), "no point has a goodput"))
    return makers


def load_plots(points: pd.DataFrame) -> list[Plot | tuple[str, str]]:
    """The plots of a run under load (speedup and p99 latency against load at several levels, goodput against
    request rate at several rates), or why not drawn; nothing at one level."""
    return drawn(load_makers(points))


def speedup_vs_load(points: pd.DataFrame) -> Plot | None:
    figure = load_figure(points)
    axis = tables.load_axis(tables.load_levels(points))
    both = len(load_tables.run_axes(points)) == 2
    return None if figure is None else to_plot(
        figure, f"Speedup vs {axis}",
        f"Speedup over the baseline at the same {'concurrency' if axis == 'concurrency' else 'load level'}, per "
        "draft and gamma; bands are the 95 % bootstrap CIs; dashed: the baseline; star: the highest level at which "
        "the CI lies wholly above 1.0. "
        + ("Closed-loop levels (concurrency) and open-loop levels (request rates) are separate panels: they are "
           "not one scale. " if both else "")
        + "Unstable points are drawn (the tables label them); failed and mismatched are not.")


def load_figure(points: pd.DataFrame) -> Figure | None:
    """A panel per temperature, top_p and load axis: x: requests in flight (log2, a tick per level) or the request
    rate (a tick per rate); y: speedup; a line per configuration, a star at its crossover on that axis."""
    speedups = tables.load_speedups(points)
    data = speedups[speedups["status"].isin(["ok", "unstable"]) & (speedups["method"] != "baseline")]
    data = data.dropna(subset=["speedup"])
    if not len(data):
        return None
    crossover = load_tables.crossovers(speedups).dropna(subset=["load"]).set_index(
        ["temperature", "top_p", "configuration", "axis"])
    axes_run = load_tables.run_axes(points)
    data = data.assign(axis=load_tables.axis_of(data))
    groups = [(key, group, axis) for key, group in data.groupby(["temperature", "top_p"], sort=True)
              for axis in axes_run]
    figure, axes = panels(len(groups), columns=len(axes_run) if len(axes_run) == 2 else 3)
    for ax, ((temperature, top_p), group, axis) in zip(axes, groups):
        colors = _colors(group["configuration"])
        for name, line in group[group["axis"] == axis].groupby("configuration", sort=False):
            x = line[axis].astype(float)
            ax.plot(x, line["speedup"], marker="o", label=name, color=colors[name])
            band = line.dropna(subset=["speedup_ci_low", "speedup_ci_high"])
            if len(band):
                ax.fill_between(band[axis].astype(float), band["speedup_ci_low"].astype(float),
                                band["speedup_ci_high"].astype(float), color=colors[name], alpha=0.2, linewidth=0)
            if (temperature, top_p, name, axis) in crossover.index:
                at = line[line["load"] == crossover.loc[(temperature, top_p, name, axis), "load"]].iloc[0]
                ax.plot([float(at[axis])], [at["speedup"]], marker="*", markersize=14, linestyle="none",
                        color=colors[name], markeredgecolor="black", label=f"_crossover {name}")  # the caption says
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="baseline")
        _load_axis(ax, points, axis)
        ax.set(title=_panel_title(temperature, top_p, axis, both=len(axes_run) == 2), ylabel="speedup")
        ax.legend(fontsize="small")
    return figure


def _load_axis(ax, points: pd.DataFrame, axis: str) -> None:
    """Concurrency on a log2 scale with a tick per level; request rates on a linear scale with a tick per rate."""
    if axis == "concurrency":
        ticks = tables.concurrency_levels(points)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(level) for level in ticks])
        ax.set_xticks([], minor=True)
    else:
        rates = sorted(points["request_rate"].dropna().astype(float).unique())
        ax.set_xticks(rates, [f"{rate:g}" for rate in rates])
    ax.set(xlabel=AXIS_LABELS[axis])


def _panel_title(temperature: float, top_p: float, axis: str, *, both: bool) -> str:
    return tables.group_title(temperature, top_p) + (f", {LOOP_NAMES[axis]}" if both else "")


def _colors(names) -> dict[str, str]:
    """A colour per name, the same in every panel of a figure."""
    return {name: f"C{index % 10}" for index, name in enumerate(dict.fromkeys(names))}


LATENCIES = (("ttft_ms_p99", "TTFT p99 (ms)"), ("tpot_ms_p99", "TPOT p99 (ms)"))


def latency_vs_load(points: pd.DataFrame) -> Plot | None:
    figure = latency_figure(points)
    return None if figure is None else to_plot(
        figure, "Latency p99 vs load",
        "The 99th percentile of time to first token and of time per output token at each load level, per "
        "configuration and the baseline (closed-loop and open-loop levels in separate rows); failed and mismatched "
        "points are not drawn.")


def latency_figure(points: pd.DataFrame) -> Figure | None:
    """A row per temperature, top_p and load axis, a TTFT p99 and a TPOT p99 panel each; x: concurrency (log2) or
    request rate, a line per configuration (the baseline too)."""
    columns = [column for column, _ in LATENCIES if column in points]
    data = tables.by_configuration(tables.trusted(points))
    if len(columns) < len(LATENCIES) or data[columns].isna().all().all():
        return None
    axes_run = load_tables.run_axes(points)
    data = data.assign(axis=load_tables.axis_of(data))
    groups = [(key, group, axis) for key, group in data.groupby(["temperature", "top_p"], sort=True)
              for axis in axes_run]
    figure = Figure(figsize=(PANEL_W * 2, PANEL_H * len(groups)), layout="constrained")
    rows = figure.subplots(len(groups), 2, squeeze=False)
    for (ttft_ax, tpot_ax), ((temperature, top_p), group, axis) in zip(rows, groups):
        colors = _colors(group["configuration"])
        for ax, (column, label) in ((ttft_ax, LATENCIES[0]), (tpot_ax, LATENCIES[1])):
            on_axis = group[group["axis"] == axis].dropna(subset=[column])
            for name, line in on_axis.groupby("configuration", sort=False):
                ax.plot(line[axis].astype(float), line[column].astype(float), marker="o", label=name,
                        color=colors[name])
            _load_axis(ax, points, axis)
            ax.set(title=_panel_title(temperature, top_p, axis, both=len(axes_run) == 2), ylabel=label)
        ttft_ax.legend(fontsize="small")
    return figure


def goodput_vs_rate(points: pd.DataFrame) -> Plot | None:
    figure = goodput_figure(points)
    slos = "; ".join(str(slo) for slo in points["slo"].dropna().unique()) if "slo" in points else ""
    return None if figure is None else to_plot(
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
    figure, axes = panels(len(groups))
    for ax, ((temperature, top_p), group) in zip(axes, groups):
        for name, line in group.groupby("configuration", sort=False):
            ax.plot(line["request_rate"].astype(float), line["goodput"].astype(float), marker="o", label=name)
        rates = sorted(group["request_rate"].astype(float).unique())
        ax.plot(rates, rates, color="grey", linestyle="--", linewidth=1, label="offered rate")
        ax.set(title=tables.group_title(temperature, top_p), xlabel="request rate (requests/s)",
               ylabel="goodput (requests/s)")
        ax.legend(fontsize="small")
    return figure


# --- capacity -------------------------------------------------------------------------------------


def capacity_plot(report: capacity.CapacityReport, group: capacity.CapacityGroup) -> Plot | None:
    figure = capacity_figure(report, group)
    return None if figure is None else to_plot(
        figure, f"SLO attainment and goodput, {group.name}",
        f"Left: the share of requests that met the SLO at each load probed, per configuration, with its confidence "
        f"interval; dashed: the target ({report.target_attainment:.0%}). Right: goodput (requests per second that "
        "met the SLO). Dotted verticals: each configuration's capacity, shaded: its interval. A load probed again "
        "with more requests shows its last probe.")


def capacity_figure(report: capacity.CapacityReport, group: capacity.CapacityGroup) -> Figure | None:
    """Two panels: SLO attainment (error bars: its CI) and goodput against load, a line per configuration (the
    baseline first); the target attainment as a horizontal line; each capacity found as a vertical line."""
    probes = capacity.plot_probes(group.probes.dropna(subset=["load", "attainment"]))
    if not len(probes):
        return None
    figure, (attainment_ax, goodput_ax) = panels(2, columns=2)
    colors = _colors(group.configurations["configuration"])
    for name in colors:  # in the group's order, the baseline first
        line = probes[probes["configuration"] == name]
        if not len(line):
            continue
        share = line["attainment"].astype(float)
        low = (share - line["ci_low"].astype(float)).clip(lower=0).fillna(0)
        high = (line["ci_high"].astype(float) - share).clip(lower=0).fillna(0)
        attainment_ax.errorbar(line["load"].astype(float), share, yerr=[low, high], marker="o", capsize=3, label=name,
                               color=colors[name])
        with_goodput = line.dropna(subset=["goodput"])
        goodput_ax.plot(with_goodput["load"].astype(float), with_goodput["goodput"].astype(float), marker="o",
                        label=name, color=colors[name])
    for row in group.configurations.dropna(subset=["capacity"]).to_dict("records"):
        for ax in (attainment_ax, goodput_ax):
            ax.axvline(float(row["capacity"]), color=colors[row["configuration"]], linestyle=":", linewidth=1.5,
                       label=f"_capacity {row['configuration']}")  # the caption says
            low, high = row.get("capacity_low"), row.get("capacity_high")
            if not capacity.missing(low) and not capacity.missing(high) and high > low:
                ax.axvspan(float(low), float(high), color=colors[row["configuration"]], alpha=0.12,
                           label=f"_interval {row['configuration']}")
    attainment_ax.axhline(report.target_attainment, color="grey", linestyle="--", linewidth=1,
                          label=f"target {report.target_attainment:.0%}")
    attainment_ax.set(title=group.name, xlabel=AXIS_LABELS[group.axis], ylabel="share of requests meeting the SLO",
                      ylim=(0, 1.05))
    goodput_ax.set(title=group.name, xlabel=AXIS_LABELS[group.axis], ylabel="goodput (requests/s)")
    attainment_ax.legend(fontsize="small")
    goodput_ax.legend(fontsize="small")
    return figure

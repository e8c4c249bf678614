"""The report's plots of a run's points and of a tune, drawn into PNG bytes (figures.py); the plots against load
are in load_plots.py. Each function returns a Plot, or None when the points hold nothing to draw."""

from __future__ import annotations

import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

from specbench.report import load_plots, tables
from specbench.report.figures import PANEL_H, Plot, drawn, panels, to_plot
from specbench.report.trials import StudyReport


def all_plots(points: pd.DataFrame, categories: pd.DataFrame, *, load: bool = True) -> list[Plot | tuple[str, str]]:
    """Every plot in report order (those against load only with `load`); a (title, why not drawn) pair where there
    was nothing to draw."""
    makers = [
        ("Speedup vs gamma", lambda: speedup_vs_gamma(points), "no speculative point ran"),
        *(load_plots.load_makers(points) if load else []),
        ("Acceptance by draft position", lambda: acceptance_by_position(points),
         "no per-position draft counts (the hf backend does not record them)"),
        ("Measured vs predicted speedup", lambda: measured_vs_predicted(points),
         "no predicted speedups (they need the native backend's draft and verify timings)"),
        ("Speedup per workload category", lambda: category_heatmap(categories),
         "no speculative point with a baseline on the same categories"),
        ("Throughput vs peak memory", lambda: throughput_vs_memory(points), "no tokens/s and peak memory recorded"),
    ]
    return drawn(makers)


def tune_plots(studies: list[StudyReport]) -> list[Plot | tuple[str, str]]:
    """The plots of a tune's output, in report order; (title, why not drawn) where there was nothing."""
    return drawn([
        ("Objective by trial", lambda: objective_by_trial(studies), "no trial finished"),
        ("Parameter importances", lambda: parameter_importances(studies),
         "; ".join(f"{s.study}: {s.importance_note}" for s in studies) or "no study"),
    ])


ROLE_COLORS = {"calibration": "tab:orange", "warm_start": "tab:green", "search": "tab:blue"}


def objective_by_trial(studies: list[StudyReport]) -> Plot | None:
    finished = [s for s in studies if s.trials["value"].notna().any()]
    if not finished:
        return None
    figure, axes = panels(len(finished), height=PANEL_H + 0.7)
    for ax, study in zip(axes, finished):
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
    return to_plot(figure, "Objective by trial",
                 "Each trial's objective in the order trials were numbered, coloured by role: calibration "
                 "(one per draft at the largest gamma), warm start (the analytic model's best predictions), "
                 "search (TPE). Hollow: pruned, at its value when stopped. Star: the recommended trial.")


def parameter_importances(studies: list[StudyReport]) -> Plot | None:
    computed = [s for s in studies if s.importances]
    if not computed:
        return None
    figure, axes = panels(len(computed), height=max(2.2, 0.5 * max(len(s.importances) for s in computed) + 1.4))
    for ax, study in zip(axes, computed):
        names = list(study.importances)[::-1]  # the most important on top
        values = [study.importances[name] for name in names]
        ax.barh(names, values, color="tab:blue")
        for y, value in enumerate(values):
            ax.text(value, y, f" {value:.2f}", va="center", fontsize="small")
        ax.set(title=tables.group_title(study.temperature, study.top_p), xlabel="importance", xlim=(0, 1.15))
    return to_plot(figure, "Parameter importances",
                 "The share of the objective's variance over the completed trials that each parameter explains, "
                 "as Optuna's fANOVA evaluator computes it (importances sum to 1). Few trials make them rough; "
                 "ngram_max, which only n-gram drafts have, is left out when a study mixes drafts.")


def speedup_vs_gamma(points: pd.DataFrame) -> Plot | None:
    figure = gamma_figure(points)
    if figure is None:
        return None
    caption = "Speedup over the baseline per draft; bands are the 95 % bootstrap CIs; dashed: the baseline."
    if len(tables.load_levels(points)) > 1:
        caption = ("Speedup over the baseline per draft, a panel per load level (each point against the baseline at "
                   "its own level); bands are the 95 % bootstrap CIs; dashed: the baseline.")
    return to_plot(figure, "Speedup vs gamma", caption)


def gamma_figure(points: pd.DataFrame) -> Figure | None:
    """A panel per temperature and top_p, and per load level when the run has several (a speedup is against the
    baseline at its own level: levels are never joined); x: gamma, a line per draft (per draft and n-gram length
    where a draft has several), a colour per line the same in every panel."""
    data = _speculative(points).dropna(subset=["gamma", "speedup"])
    if not len(data):
        return None
    rank = {level: index for index, level in enumerate(tables.load_levels(points))}
    per_level = len(rank) > 1
    data = data.assign(load=tables.levels(data), line=_line_names(data))
    data = data.assign(load_rank=data["load"].map(rank))
    groups = list(data.groupby(["temperature", "top_p", *(["load_rank", "load"] if per_level else [])], sort=True))
    colors = {name: f"C{index % 10}" for index, name in enumerate(sorted(data["line"].unique()))}
    figure, axes = panels(len(groups), sharey=per_level)
    for ax, (key, group) in zip(axes, groups):
        for name, lines in group.groupby("line", sort=True):
            lines = lines.sort_values("gamma")
            ax.plot(lines["gamma"].astype(float), lines["speedup"], marker="o", label=name, color=colors[name])
            band = lines.dropna(subset=["speedup_ci_low", "speedup_ci_high"])
            if len(band):
                ax.fill_between(band["gamma"].astype(float), band["speedup_ci_low"], band["speedup_ci_high"],
                                color=colors[name], alpha=0.2, linewidth=0)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="baseline")
        title = tables.group_title(key[0], key[1]) + (f", {key[3]}" if per_level else "")
        ax.set(title=title, xlabel="gamma (draft tokens per step)", ylabel="speedup")
        ax.set_xticks(sorted(group["gamma"].astype(int).unique()))
        ax.legend(fontsize="small")
    return figure


def _line_names(points: pd.DataFrame) -> list[str]:
    """The draft; with its longest n-gram (`ngram n=3`) where the draft ran with several."""
    lengths = points["ngram_max"] if "ngram_max" in points else pd.Series(pd.NA, index=points.index)
    several = lengths.groupby(points["draft"]).nunique()
    return [f"{draft} n={int(n)}" if several[draft] > 1 and not pd.isna(n) else str(draft)
            for draft, n in zip(points["draft"], lengths)]


def acceptance_by_position(points: pd.DataFrame) -> Plot | None:
    data = tables.acceptance_by_position(points)
    if not len(data):
        return None
    groups = list(data.groupby(["temperature", "top_p"], sort=True))
    figure, axes = panels(len(groups))
    for ax, ((temperature, top_p), group) in zip(axes, groups):
        for point_id, line in group.groupby("point_id", sort=False):
            ax.plot(line["position"], line["acceptance_rate"], marker="o", label=_label(line.iloc[0]))
        ax.set(title=tables.group_title(temperature, top_p), xlabel="draft position", ylabel="acceptance rate",
               ylim=(0, 1.05))
        ax.set_xticks(sorted(group["position"].unique()))
        ax.legend(fontsize="small")
    return to_plot(figure, "Acceptance by draft position",
                 "accepted / drafted at each position of the speculated block, per point.")


def measured_vs_predicted(points: pd.DataFrame) -> Plot | None:
    """Measured speedup against the analytic model's: from each point's own steps and, where the run recorded it,
    from its draft's largest-gamma point (the prediction tune's warm start makes for a gamma it has not run)."""
    speculative = _speculative(points)
    sources = [(column, label) for column, label in (
        ("predicted_speedup", "predicted from the point's own steps"),
        ("max_gamma_predicted_speedup", "predicted from the draft's largest gamma"))
        if column in speculative and speculative[column].notna().any()]
    if not sources or "predicted_speedup" not in dict(sources):
        return None
    figure, axes = panels(len(sources), width=6.0, height=4.6)
    for ax, (column, label) in zip(axes, sources):
        data = speculative.dropna(subset=["speedup", column])
        for draft, group in data.groupby("draft", sort=True):
            low = (group["speedup"] - group["speedup_ci_low"]).clip(lower=0).fillna(0)
            high = (group["speedup_ci_high"] - group["speedup"]).clip(lower=0).fillna(0)
            ax.errorbar(group[column], group["speedup"], yerr=[low, high], fmt="o", capsize=3, label=draft)
            if column == "max_gamma_predicted_speedup":
                for _, row in group.iterrows():
                    ax.annotate(f"γ{int(row['gamma'])}", (row[column], row["speedup"]), fontsize="x-small",
                                xytext=(3, 3), textcoords="offset points")
        bounds = pd.concat([data["speedup"], data[column], data["speedup_ci_low"].dropna(),
                            data["speedup_ci_high"].dropna()])
        lo, hi = float(bounds.min()), float(bounds.max())
        pad = 0.05 * (hi - lo or 1.0)
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="grey", linestyle="--", linewidth=1, label="y = x")
        ax.set(xlabel=label, ylabel="measured speedup")
        ax.legend(fontsize="small")
    across = len(sources) > 1
    return to_plot(figure, "Measured vs predicted speedup",
                 "Each point against the analytic model (Leviathan et al. with the measured drafts and acceptance per "
                 "position and the measured costs); error bars are 95 % CIs. Left: from the point's own steps — it "
                 "shows the time is accounted for; below the line, overhead the model does not see. "
                 + ("Right: from the largest-gamma point of the same draft (acceptance per position truncated, the "
                    "verify cost from the run's timing of the target's forward pass at k tokens): the prediction "
                    "tune's warm start acts on for gammas it has not measured." if across else ""))


def category_heatmap(categories: pd.DataFrame) -> Plot | None:
    matrix = tables.category_matrix(categories)
    if not len(matrix) or matrix.isna().all().all():
        return None
    values = matrix.to_numpy(dtype=float)
    finite = values[~pd.isna(values)]
    # red below 1x, green above; each side spans its own range (speedups are never negative)
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(float(finite.min()), 0.95), vmax=max(float(finite.max()), 1.05))
    figure, (ax,) = panels(1, width=max(5.0, 1.1 * len(matrix.columns) + 3.0),
                            height=max(2.5, 0.42 * len(matrix) + 1.5))
    image = ax.imshow(values, cmap="RdYlGn", norm=norm, aspect="auto")
    ax.set_xticks(range(len(matrix.columns)), matrix.columns, rotation=30, ha="right")
    ax.set_yticks(range(len(matrix)), matrix.index)
    for (row, column), value in pd.DataFrame(values).stack().items():
        ax.text(column, row, f"{value:.2f}", ha="center", va="center", fontsize="small")
    figure.colorbar(image, ax=ax, label="speedup")
    return to_plot(figure, "Speedup per workload category",
                 "Per point and category: sum of output tokens / sum of end-to-end time, over the baseline's "
                 "on the same category.")


def throughput_vs_memory(points: pd.DataFrame) -> Plot | None:
    data = tables.trusted(points).dropna(subset=["tokens_per_s", "peak_memory_mb"])
    if not len(data):
        return None
    front = tables.pareto_front(data)
    groups = list(data.groupby(["temperature", "top_p"], sort=True))
    figure, axes = panels(len(groups))
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
    return to_plot(figure, "Throughput vs peak memory",
                 "The Pareto front: points that no other point beats on both tokens/s and peak memory.")


def _speculative(points: pd.DataFrame) -> pd.DataFrame:
    trusted = tables.trusted(points)
    return trusted[trusted["method"] != "baseline"]


def _label(row) -> str:
    gamma = row["gamma"]
    return str(row["draft"]) if gamma is None or pd.isna(gamma) else f"{row['draft']} g={int(gamma)}"

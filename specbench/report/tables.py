"""The report's tables as plain DataFrames, shared by every format: filtered and sorted point tables,
speedup per workload category, speedup against load (concurrency levels and request rates), the comparison
of two runs, the Pareto front, per-position acceptance.

Nothing here formats for a screen except `display_points` and `display_load`, which turn numbers into
the strings every text format shows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from specbench.core import results, stats
from specbench.report.folders import ReportError

LIST_COLUMNS = ("accepted_per_position", "drafted_per_position")
KEYS = tuple(name for name in results.POINT_COLUMNS if name not in LIST_COLUMNS)  # --filter and --sort keys
DESCENDING = frozenset({"speedup", "speedup_ci_low", "speedup_ci_high", "predicted_speedup", "tokens_per_s",
                        "acceptance_rate", "mean_accepted_length", "output_tokens", "n_requests"})

# One row per point. status: ok | failed | mismatch (a greedy point whose outputs differ from the
# baseline's: a broken engine, not a fast one). best: the fastest trustworthy point of its temperature.
TABLE_COLUMNS = (
    "run", "temperature", "top_p", "point_id", "method", "draft", "gamma", "speedup", "speedup_ci_low",
    "speedup_ci_high", "tokens_per_s", "acceptance_rate", "mean_accepted_length", "tpot_ms_p50", "tpot_ms_p90",
    "ttft_ms_p50", "peak_memory_mb", "status", "best", "error",
)
# what a serving engine held over the point (its /metrics, sampled), after peak memory: in the table, and shown,
# only where some point has it
ENGINE_COLUMNS = {"kv_cache_usage_peak": ("KV peak", ".0%"), "requests_waiting_peak": ("waiting peak", ".0f"),
                  "preemptions": ("preempted", ".0f")}
_BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
DISPLAY_COLUMNS = ("point", "speedup", "95% CI", "tok/s", "accept", "MAL", "TPOT p50 ms", "TPOT p90 ms",
                   "TTFT p50 ms", "peak MB", "status")


@dataclass(frozen=True)
class Filter:
    """KEY=VALUE. Filters on one key are alternatives (OR); filters on different keys all apply (AND)."""

    key: str
    value: str

    @classmethod
    def parse(cls, text: str) -> "Filter":
        key, sep, value = text.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ReportError(f"--filter {text!r}: expected KEY=VALUE, e.g. method=draft or temperature=0")
        if key not in KEYS:
            raise ReportError(f"--filter {text!r}: unknown key {key!r}; known keys: {', '.join(KEYS)}")
        return cls(key, value.strip())

    def matches(self, column: pd.Series) -> pd.Series:
        if pd.api.types.is_bool_dtype(column) or self.key == "outputs_match_baseline":
            wanted = _BOOLEANS.get(self.value.lower())
            if wanted is None:
                raise ReportError(f"--filter {self.key}={self.value}: {self.key} is true or false")
            return column.astype("boolean").eq(wanted).fillna(False).astype(bool)
        if pd.api.types.is_numeric_dtype(column):
            try:
                number = float(self.value)
            except ValueError:
                raise ReportError(
                    f"--filter {self.key}={self.value}: {self.key} is numeric, e.g. {self.key}=2") from None
            return column.astype("float64").eq(number).fillna(False).astype(bool)
        return column.astype("string").eq(self.value).fillna(False).astype(bool)


def check_sort_key(column: str) -> None:
    if column not in KEYS:
        raise ReportError(f"--sort {column!r}: unknown column; known columns: {', '.join(KEYS)}")


def apply_filters(points: pd.DataFrame, filters: list[Filter]) -> pd.DataFrame:
    keep = pd.Series(True, index=points.index)
    for key in dict.fromkeys(f.key for f in filters):
        if key not in points.columns:
            keep &= False
            continue
        alternatives = [f.matches(points[key]) for f in filters if f.key == key]
        keep &= np.logical_or.reduce(alternatives)
    return points[keep]


def sort_points(points: pd.DataFrame, column: str) -> pd.DataFrame:
    """Descending for speedup, throughput and acceptance columns, ascending otherwise (latency,
    memory, names); missing values last; ties by point_id."""
    ascending = column not in DESCENDING
    return points.sort_values([column, "point_id"], ascending=[ascending, True], na_position="last", kind="stable")


def status_labels(points: pd.DataFrame) -> pd.Series:
    """failed, mismatch (greedy outputs differ from the baseline's), unstable (measured while other processes
    used the machine: the speedup is not to be trusted), synthetic (acceptance imposed: a what-if, never a real
    draft's speed) or ok."""
    mismatch = points["outputs_match_baseline"].astype("boolean").eq(False).fillna(False).astype(bool)
    failed = points["status"].astype("string").eq("failed").fillna(False).astype(bool)
    unstable = (points["unstable"].astype("boolean").eq(True).fillna(False).astype(bool) if "unstable" in points
                else pd.Series(False, index=points.index))
    synthetic = (points["imposed_acceptance"].notna() if "imposed_acceptance" in points
                 else pd.Series(False, index=points.index)).astype(bool)
    labels = np.where(failed, "failed", np.where(mismatch, "mismatch", np.where(
        synthetic, "synthetic", np.where(unstable, "unstable", "ok"))))
    return pd.Series(labels, index=points.index)


def levels(points: pd.DataFrame) -> pd.Series:
    """Each point's load level: "concurrency 4" (requests in flight) or "2 requests/s" (an open-loop arrival
    rate, never a concurrency); files written before the load axes ran one request at a time."""
    return results.load_labels(points)["load"]


def load_levels(points: pd.DataFrame) -> list[str]:
    """The run's load levels in load order: concurrency levels, then request rates, each ascending."""
    labels = results.load_labels(points)
    return [load for _, load in sorted(set(zip(labels["load_order"], labels["load"])))]


def concurrency_levels(points: pd.DataFrame) -> list[int]:
    """The closed-loop levels only (requests in flight), ascending."""
    if "concurrency" not in points:
        return [1] if len(points) else []
    closed = points if "request_rate" not in points else points[points["request_rate"].isna()]
    return sorted(set(closed["concurrency"].fillna(1).astype(int)))


def load_axis(labels: list[str]) -> str:
    """What the load levels are called together: "concurrency", or "load" once a request rate is among them."""
    return "concurrency" if all(label.startswith("concurrency ") for label in labels) else "load"


def best_point_ids(points: pd.DataFrame) -> set[str]:
    """Per temperature, top_p and load level (speedups at two levels are against two baselines): the highest
    speedup among points that ran and whose greedy outputs match (the baseline itself when nothing beats it;
    the baseline wins exact ties)."""
    trusted = points[(status_labels(points) == "ok") & points["speedup"].notna()]
    best = set()
    for _, group in trusted.assign(load=levels(trusted)).groupby(["temperature", "top_p", "load"]):
        ranked = group.assign(_not_baseline=group["method"] != "baseline").sort_values(
            ["speedup", "_not_baseline", "point_id"], ascending=[False, True, True])
        best.add(ranked.iloc[0]["point_id"])
    return best


def points_table(points: pd.DataFrame, *, run: str, sort: str = "speedup", top: int | None = None) -> pd.DataFrame:
    """TABLE_COLUMNS: per temperature and top_p (ascending), the points sorted by `sort`, the first
    `top` of each. Best and status are decided before the cut."""
    labelled = points.assign(run=run, status=status_labels(points),
                             best=points["point_id"].isin(best_point_ids(points)))
    groups = [sort_points(group, sort).head(top) if top is not None else sort_points(group, sort)
              for _, group in labelled.groupby(["temperature", "top_p"], sort=True)]
    if not groups:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    engine = [name for name in (*ENGINE_COLUMNS, "host") if name in points and points[name].notna().any()]
    return pd.concat(groups)[[*TABLE_COLUMNS, *engine]].reset_index(drop=True)


def display_points(table: pd.DataFrame) -> pd.DataFrame:
    """DISPLAY_COLUMNS as strings, one row per table row; after peak MB, the ENGINE_COLUMNS the table has."""
    engine = [name for name in ENGINE_COLUMNS if name in table]
    rows = [(
        row["point_id"],
        fmt(row["speedup"], ".2f", "x"),
        fmt_ci(row["speedup_ci_low"], row["speedup_ci_high"]),
        fmt(row["tokens_per_s"], ".1f"),
        fmt(row["acceptance_rate"], ".0%"),
        fmt(row["mean_accepted_length"], ".2f"),
        fmt(row["tpot_ms_p50"], ".1f"),
        fmt(row["tpot_ms_p90"], ".1f"),
        fmt(row["ttft_ms_p50"], ".1f"),
        fmt(row["peak_memory_mb"], ".0f"),
        *(fmt(row[name], ENGINE_COLUMNS[name][1]) for name in engine),
        *([str(row["host"])] if "host" in table else []),  # a merge of shards: where the point ran
        row["status"],
    ) for row in table.to_dict("records")]
    return pd.DataFrame(rows, columns=[*DISPLAY_COLUMNS[:-1], *(ENGINE_COLUMNS[name][0] for name in engine),
                                       *(["host"] if "host" in table else []), DISPLAY_COLUMNS[-1]])


def _missing(value: object) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def fmt(value: object, spec: str, suffix: str = "") -> str:
    return "-" if _missing(value) else f"{value:{spec}}{suffix}"


def fmt_ci(low: object, high: object) -> str:
    return "-" if _missing(low) or _missing(high) else f"{low:.2f}-{high:.2f}"


def group_title(temperature: float, top_p: float) -> str:
    return f"temperature {temperature:g}" + (f", top_p {top_p:g}" if top_p < 1 else "")


# --- per category --------------------------------------------------------------------------------


def category_speedups(points: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Per trusted speculative point and workload category: throughput = sum(output_tokens) /
    sum(e2e) over the category's requests, and speedup = that / the baseline's (same temperature and
    top_p) on the same category. Columns: point_id, temperature, top_p, category, tokens_per_s,
    baseline_tokens_per_s, speedup."""
    columns = ["point_id", "temperature", "top_p", "category", "tokens_per_s", "baseline_tokens_per_s", "speedup"]
    if not len(requests):
        return pd.DataFrame(columns=columns)
    sums = requests.groupby(["point_id", "category"], sort=False)[["output_tokens", "e2e_ms"]].sum().reset_index()
    sums["tokens_per_s"] = sums["output_tokens"] / (sums["e2e_ms"] / 1e3)
    ran = trusted(points)
    ran = ran[ran["method"] != "baseline"]
    ran = ran.assign(baseline_id=baseline_ids(ran))
    frame = ran[["point_id", "temperature", "top_p", "baseline_id"]].merge(
        sums[["point_id", "category", "tokens_per_s"]], on="point_id")
    baseline = sums.rename(columns={"point_id": "baseline_id", "tokens_per_s": "baseline_tokens_per_s"})
    frame = frame.merge(baseline[["baseline_id", "category", "baseline_tokens_per_s"]],
                        on=["baseline_id", "category"], how="left")
    frame["speedup"] = frame["tokens_per_s"] / frame["baseline_tokens_per_s"]
    return frame[columns].reset_index(drop=True)


def baseline_ids(points: pd.DataFrame) -> list[str]:
    """Each point's baseline: the same temperature, top_p, load level, capacity search repeat and draw."""
    def column(name: str) -> list:
        return list(points[name]) if name in points else [None] * len(points)

    return [results.baseline_point_id(t, p, concurrency=None if not _missing(r) else 1 if _missing(c) else int(c),
                                      request_rate=None if _missing(r) else float(r),
                                      repeat=0 if _missing(k) else int(k), draw=0 if _missing(d) else int(d))
            for t, p, c, r, k, d in zip(points["temperature"], points["top_p"], column("concurrency"),
                                        column("request_rate"), column("capacity_repeat"), column("capacity_draw"))]


def category_matrix(categories: pd.DataFrame) -> pd.DataFrame:
    """Speedups as point_id x category (points in their first-seen order, categories sorted)."""
    if not len(categories):
        return pd.DataFrame()
    matrix = categories.pivot(index="point_id", columns="category", values="speedup")
    order = list(dict.fromkeys(categories["point_id"]))
    return matrix.loc[order, sorted(matrix.columns)].rename_axis(index="point", columns=None)


# --- speedup against load ------------------------------------------------------------------------

LOAD_COLUMNS = ("temperature", "top_p", "configuration", "method", "load", "load_rank", "concurrency",
                "request_rate", "point_id", "speedup", "speedup_ci_low", "speedup_ci_high", "acceptance_rate",
                "status", "best")

LOAD_NOTE = ("Speedup over the baseline at the same {axis} [95 % CI], and the acceptance rate; best: the fastest "
             "point at each level whose timing and outputs are trusted (the baseline when nothing beats it).")


def load_note(labels: list[str]) -> str:
    return LOAD_NOTE.format(axis="concurrency" if load_axis(labels) == "concurrency" else "load level")


def configuration(row: dict) -> str:
    """A point without its temperature and load: `close g=4`, `ngram n=3 g=2` (n-gram drafts: the longest
    n-gram matched), `baseline`."""
    if row["method"] == "baseline":
        return "baseline"
    ngram = "" if _missing(row.get("ngram_max")) else f" n={int(row['ngram_max'])}"
    gamma = "" if _missing(row["gamma"]) else f" g={int(row['gamma'])}"
    return f"{row['draft']}{ngram}{gamma}"


def by_configuration(points: pd.DataFrame) -> pd.DataFrame:
    """The points with their configuration, load level (`load`, and `load_rank`: its place in load order),
    status and best, by temperature, top_p, baseline first, draft, n-gram length, gamma and level."""
    rank = {label: index for index, label in enumerate(load_levels(points))}
    load = levels(points)
    missing = pd.Series(pd.NA, index=points.index)
    frame = points.assign(configuration=[configuration(row) for row in points.to_dict("records")],
                          load=load, load_rank=load.map(rank).astype(int), status=status_labels(points),
                          best=points["point_id"].isin(best_point_ids(points)),
                          ngram_max=points.get("ngram_max", missing), is_speculative=points["method"] != "baseline",
                          concurrency=points.get("concurrency", missing).astype("Int64"),
                          request_rate=points.get("request_rate", missing).astype("Float64"))
    frame["concurrency"] = frame["concurrency"].where(frame["request_rate"].notna(), frame["concurrency"].fillna(1))
    frame.loc[frame["request_rate"].notna(), "concurrency"] = pd.NA
    return frame.sort_values(["temperature", "top_p", "is_speculative", "draft", "ngram_max", "gamma", "load_rank"],
                             na_position="first", kind="stable")


def load_speedups(points: pd.DataFrame) -> pd.DataFrame:
    """LOAD_COLUMNS, one row per point (the baselines too) of a run at more than one load level, in
    by_configuration's order; empty for a run at one level. The speedup is against the baseline at the same
    temperature, top_p and level; best: the fastest trusted point at its level (best_point_ids)."""
    if len(load_levels(points)) < 2:
        return pd.DataFrame(columns=LOAD_COLUMNS)
    return by_configuration(points)[list(LOAD_COLUMNS)].reset_index(drop=True)


def level_columns(group: pd.DataFrame) -> list[str]:
    """A group's load levels in load order."""
    return list(group.sort_values("load_rank", kind="stable")["load"].drop_duplicates())


def display_load(group: pd.DataFrame, *, sep: str = " ") -> pd.DataFrame:
    """One temperature's load_speedups as strings: a row per speculative configuration, a column per level
    in load order, and a last row naming the best configuration at each level ("-" where no point is
    trusted). `sep` goes before a cell's acceptance ("\n" in a terminal: two narrow lines)."""
    columns = level_columns(group)
    speculative = group[group["method"] != "baseline"]
    rows = []
    for name, cells in speculative.groupby("configuration", sort=False):
        by_level = {row["load"]: load_cell(row, sep=sep) for row in cells.to_dict("records")}
        rows.append([name, *(by_level.get(level, "-") for level in columns)])
    best = group[group["best"]]
    best_by_level = dict(zip(best["load"], best["configuration"]))
    rows.append(["best", *(best_by_level.get(level, "-") for level in columns)])
    return pd.DataFrame(rows, columns=["configuration", *columns])


def load_cell(row: dict, *, sep: str = " ") -> str:
    """`1.12× [1.05, 1.19] accept 80%`, `... (unstable)`; `failed` and `mismatch` (a speed that means
    nothing) without numbers."""
    if row["status"] in ("failed", "mismatch"):
        return row["status"]
    speedup = fmt(row["speedup"], ".2f", "×")
    if not _missing(row["speedup_ci_low"]) and not _missing(row["speedup_ci_high"]):
        speedup += f" [{row['speedup_ci_low']:.2f}, {row['speedup_ci_high']:.2f}]"
    notes = [f"accept {row['acceptance_rate']:.0%}" if not _missing(row["acceptance_rate"]) else "",
             "(unstable)" if row["status"] == "unstable" else ""]
    notes = " ".join(note for note in notes if note)
    return speedup + (sep + notes if notes else "")


def load_title(group: pd.DataFrame) -> str:
    """`Speedup by concurrency, temperature 0`, or `Speedup by load, ...` once a request rate is among the levels."""
    temperature, top_p = group["temperature"].iloc[0], group["top_p"].iloc[0]
    return f"Speedup by {load_axis(level_columns(group))}, {group_title(temperature, top_p)}"


# --- two runs ------------------------------------------------------------------------------------


def compare_runs(a: pd.DataFrame, b: pd.DataFrame, *, name_a: str, name_b: str) -> pd.DataFrame:
    """Per point_id and load level (a point is only ever compared with the same point at the same level:
    their speedups are against that level's baselines): the speedups of run a and run b, the change (b - a),
    whether the 95 % CIs overlap, and a verdict for b against a: faster / slower (CIs apart), no clear change
    (CIs overlap), no CI, failed or mismatch in a run, only in a run. Rows by level in load order (`load`;
    `concurrency` is NA at a request rate), then as in a, then b."""
    a = a.assign(label=status_labels(a), **results.load_labels(a)).set_index(["point_id", "load"])
    b = b.assign(label=status_labels(b), **results.load_labels(b)).set_index(["point_id", "load"])
    rows = []
    for key in list(a.index) + [k for k in b.index if k not in a.index]:
        frame = a if key in a.index else b
        concurrency = frame.at[key, "concurrency"] if "concurrency" in frame else 1
        rate = frame.at[key, "request_rate"] if "request_rate" in frame else None
        row = {"point_id": key[0], "concurrency": pd.NA if not _missing(rate) else
               (1 if _missing(concurrency) else int(concurrency)), "load": key[1], "_order": frame.at[key, "load_order"]}
        for side, frame in (("a", a), ("b", b)):
            present = key in frame.index
            for column in ("speedup", "speedup_ci_low", "speedup_ci_high"):
                row[f"{column}_{side}"] = frame.at[key, column] if present else np.nan
        row["change"] = row["speedup_b"] - row["speedup_a"]
        row["cis_overlap"], row["verdict"] = _verdict(key, a, b, row, name_a=name_a, name_b=name_b)
        rows.append(row)
    columns = ["point_id", "concurrency", "load", "speedup_a", "speedup_ci_low_a", "speedup_ci_high_a", "speedup_b",
               "speedup_ci_low_b", "speedup_ci_high_b", "change", "cis_overlap", "verdict"]
    frame = pd.DataFrame(rows, columns=[*columns, "_order"])
    frame = frame.iloc[sorted(range(len(frame)), key=lambda i: frame["_order"].iloc[i])]  # stable: by level
    frame = frame[columns].reset_index(drop=True)
    frame["cis_overlap"] = frame["cis_overlap"].astype("boolean")
    frame["concurrency"] = frame["concurrency"].astype("Int64")
    numeric = [c for c in columns if c not in ("point_id", "concurrency", "load", "cis_overlap", "verdict")]
    frame[numeric] = frame[numeric].astype("float64")
    return frame


def _verdict(key: tuple[str, str], a: pd.DataFrame, b: pd.DataFrame, row: dict, *, name_a: str,
             name_b: str) -> tuple[bool | None, str]:
    if key not in b.index:
        return None, f"only in {name_a}"
    if key not in a.index:
        return None, f"only in {name_b}"
    for name, frame in ((name_a, a), (name_b, b)):
        if frame.at[key, "label"] != "ok":
            return None, f"{frame.at[key, 'label']} in {name}"
    bounds = [row[f"speedup_ci_{end}_{side}"] for side in ("a", "b") for end in ("low", "high")]
    if any(_missing(value) for value in bounds):
        return None, "no CI"
    low_a, high_a, low_b, high_b = bounds
    if low_b > high_a:
        return False, "faster"
    if high_b < low_a:
        return False, "slower"
    return True, "no clear change"


# --- plot data -----------------------------------------------------------------------------------


def trusted(points: pd.DataFrame) -> pd.DataFrame:
    """Points that ran and whose greedy outputs match the baseline (mismatched speeds mean nothing); an
    unstable point stays, labelled and warned about, but is never the best point."""
    return points[status_labels(points).isin(["ok", "unstable"])]


def pareto_front(points: pd.DataFrame) -> pd.Series:
    """True for trusted points that no other point of the same temperature and top_p beats on both
    tokens/s (higher) and peak memory (lower)."""
    on_front = pd.Series(False, index=points.index)
    usable = trusted(points).dropna(subset=["tokens_per_s", "peak_memory_mb"])
    for _, group in usable.groupby(["temperature", "top_p"]):
        mask = stats.pareto_mask(group["tokens_per_s"].to_numpy(float), group["peak_memory_mb"].to_numpy(float))
        on_front[group.index[mask]] = True
    return on_front


def acceptance_by_position(points: pd.DataFrame) -> pd.DataFrame:
    """Per trusted point that drafted: accepted / drafted at each draft position (1-based)."""
    rows = []
    for row in trusted(points).to_dict("records"):
        accepted, drafted = row["accepted_per_position"], row["drafted_per_position"]
        lists = (list, tuple, np.ndarray)
        if not isinstance(accepted, lists) or not isinstance(drafted, lists) or len(drafted) == 0:
            continue
        for position, (n_accepted, n_drafted) in enumerate(zip(accepted, drafted), start=1):
            if n_drafted > 0:
                rows.append({"point_id": row["point_id"], "draft": row["draft"], "gamma": row["gamma"],
                             "temperature": row["temperature"], "top_p": row["top_p"], "position": position,
                             "acceptance_rate": n_accepted / n_drafted})
    return pd.DataFrame(rows, columns=["point_id", "draft", "gamma", "temperature", "top_p", "position",
                                       "acceptance_rate"])

"""`specbench tune` under load: the profile's load levels (closed-loop concurrency, open-loop request rates) and the
weight of each in the load mix; per temperature, the best configuration at each level, the crossover (the highest
level at which speculation still measurably beats the baseline) and a gamma per concurrency level (a schedule vLLM
runs as its `num_speculative_tokens_per_batch_size`), besides the single setting best over the mix.

A trial evaluates one configuration at every level: one engine launch serves them all. Its value is the objective
averaged over the levels with their mix weights; each level's own value is kept with the trial, and the per-level
choices are made from those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specbench.core.loadmix import parse_load_mix
from specbench.profile import Profile
from specbench.sweep.plan import load_levels
from specbench.tune.recommend import choose
from specbench.tune.objectives import Objective, TuneError

# per level of a trial (its "levels" user attr), the point's columns kept besides the objective's value
LEVEL_COLUMNS = ("point_id", "speedup", "speedup_ci_low", "speedup_ci_high", "tokens_per_s", "goodput",
                 "slo_met_fraction", "acceptance_rate", "mean_accepted_length", "ttft_ms_p99", "tpot_ms_p99",
                 "request_throughput", "unstable")


# the point columns a trial over several levels keeps as its own (the rest differ by level)
IDENTITY_COLUMNS = ("backend", "method", "draft", "gamma", "temperature", "top_p", "target_model", "draft_model",
                    "draft_quantize", "ngram_min", "ngram_max")


@dataclass(frozen=True)
class LoadLevel:
    concurrency: int | None  # closed loop; None at a request-rate level
    request_rate: float | None
    weight: float  # its share of the load mix (the weights sum to 1)

    @property
    def label(self) -> str:
        return f"{self.request_rate:g} requests/s" if self.request_rate is not None else f"concurrency {self.concurrency}"

    def as_dict(self) -> dict[str, Any]:
        return {"load": self.label, "concurrency": self.concurrency, "request_rate": self.request_rate,
                "weight": self.weight}


def plan_levels(profile: Profile, mix: str | None, *, key: str) -> tuple[LoadLevel, ...]:
    """The profile's load levels with their weights: `mix` ("1:0.5,4:0.3,r0.3:0.2": concurrency levels by number,
    request rates as rN) names the levels that count and their weights (normalised to sum 1); without it, every
    level weighs the same. `key` names where the mix came from, for the error."""
    levels = load_levels(profile)
    if mix is None:
        return tuple(LoadLevel(c, r, 1 / len(levels)) for c, r in levels)
    try:
        weights = parse_load_mix(mix, levels)
    except ValueError as error:
        raise TuneError(f"{key}: {error}") from None
    total = sum(weights.values())
    return tuple(LoadLevel(c, r, weights.get((c, r), 0.0) / total) for c, r in levels)


def mix_value(values: list[float | None], levels: tuple[LoadLevel, ...]) -> float | None:
    """The objective over the load mix: each level's value by its weight (None when a weighted level has none)."""
    total = 0.0
    for value, level in zip(values, levels):
        if level.weight == 0:
            continue
        if value is None:
            return None
        total += level.weight * value
    return total


def level_entry(level: LoadLevel, value: float, metrics: dict[str, Any]) -> dict[str, Any]:
    """What a trial keeps of one level: the objective's value and the columns of LEVEL_COLUMNS."""
    return {"concurrency": level.concurrency, "request_rate": level.request_rate, "value": value,
            **{name: metrics.get(name) for name in LEVEL_COLUMNS}}


def measurably_faster(entry: dict[str, Any] | None) -> bool:
    """The baseline lies below the speedup's 95 % CI (without a CI: the speedup alone is above 1)."""
    if entry is None:
        return False
    low = entry.get("speedup_ci_low")
    if low is not None:
        return low > 1.0
    return (entry.get("speedup") or 0.0) > 1.0


def measurably_slower(entry: dict[str, Any] | None) -> bool:
    if entry is None:
        return False
    high = entry.get("speedup_ci_high")
    return high < 1.0 if high is not None else (entry.get("speedup") or 1.0) < 1.0


def recommend(rows: list[dict[str, Any]], *, levels: tuple[LoadLevel, ...], baselines: list[dict[str, Any]],
              objective: Objective, tolerance: float, single: dict[str, Any] | None, max_batch: int | None,
              speculative_config) -> dict[str, Any]:
    """The "load" part of a temperature's recommendation (see the module docstring). `rows`: the study's trial rows
    (each with `levels`), `baselines`: per level the baseline's value, `single`: the trial chosen over the mix (or
    None), `speculative_config(row, ranges)`: vLLM's config of a schedule."""
    done = [r for r in rows if r["state"] == "COMPLETE" and r["feasible"] and r.get("levels")]
    per_level = []
    for index, level in enumerate(levels):
        best, _ = choose(_at_level(done, index), objective=objective, tolerance=tolerance)
        single_here = single["levels"][index] if single is not None else None
        per_level.append({
            **level.as_dict(), "baseline_value": baselines[index].get("value"),
            "best": _describe(best), "speculate": measurably_faster(best),
            "single": None if single_here is None else {
                "value": single_here["value"], "speedup": single_here.get("speedup"),
                "speedup_ci": [single_here.get("speedup_ci_low"), single_here.get("speedup_ci_high")],
                "loses": measurably_slower(single_here)},
        })
    out = {"objective": objective.name, "mix": [level.as_dict() for level in levels], "levels": per_level,
           "crossover": crossover(per_level), "schedule": None, "single": None}
    if single is not None:
        out["single"] = {**_describe(single), "mix_value": single["value"],
                         "loses_at": [entry["load"] for entry in per_level if entry["single"] and entry["single"]["loses"]]}
    out["schedule"] = schedule(done, levels=levels, baselines=baselines, objective=objective, tolerance=tolerance,
                               max_batch=max_batch, speculative_config=speculative_config)
    return out


def _at_level(rows: list[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """The trial rows as measured at level `index` (its point and figures; one measurement, so no noise band)."""
    return [{**r, **r["levels"][index], "noise": 0.0} for r in rows if r["levels"][index].get("value") is not None]


def _describe(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {"point_id": row["point_id"], "draft": row["draft"], "gamma": _int(row["gamma"]),
            "ngram_max": _int(row.get("ngram_max")), "value": row["value"], "speedup": row.get("speedup"),
            "speedup_ci": [row.get("speedup_ci_low"), row.get("speedup_ci_high")]}


def _int(value: Any) -> int | None:
    return None if value is None or value != value else int(value)


def crossover(per_level: list[dict[str, Any]]) -> dict[str, Any]:
    """Per load axis, the highest level at which the best configuration is measurably faster than the baseline."""
    out: dict[str, Any] = {}
    words = []
    for axis in ("concurrency", "request_rate"):
        entries = [e for e in per_level if e[axis] is not None]
        paying = [e for e in entries if e["speculate"]]
        top = paying[-1] if paying else None
        out[axis] = None if top is None else {
            "load": top["load"], "concurrency": top["concurrency"], "request_rate": top["request_rate"],
            "speedup": top["best"]["speedup"], "speedup_ci": top["best"]["speedup_ci"]}
        if not entries:
            continue
        if top is None:
            words.append(f"at no {'concurrency' if axis == 'concurrency' else 'request rate'} level does speculation "
                         f"measurably beat the baseline ({', '.join(_speedup_words(e) for e in entries)})")
            continue
        above = [e for e in entries if entries.index(e) > entries.index(top)]
        gaps = [e for e in entries[: entries.index(top)] if not e["speculate"]]
        text = f"speculation measurably beats the baseline up to {top['load']} ({_speedup_words(top)})"
        if above:
            text += f"; not at {', '.join(_speedup_words(e) for e in above)}"
        if gaps:
            text += f" (though not measurably at {', '.join(_speedup_words(e) for e in gaps)})"
        words.append(text)
    out["note"] = "; ".join(words)
    return out


def _speedup_words(entry: dict[str, Any]) -> str:
    best = entry.get("best")
    if best is None or best.get("speedup") is None:
        return f"{entry['load']}: not measured"
    low, high = best["speedup_ci"]
    ci = f", 95% CI {low:.2f}-{high:.2f}" if low is not None and high is not None else ""
    return f"{entry['load']}: {best['speedup']:.2f}x{ci}"


def schedule(done: list[dict[str, Any]], *, levels: tuple[LoadLevel, ...], baselines: list[dict[str, Any]],
             objective: Objective, tolerance: float, max_batch: int | None, speculative_config) -> dict[str, Any] | None:
    """A gamma per concurrency level for one draft (a schedule launches one draft): per draft (and n-gram length),
    at each concurrency level its best gamma where that is measurably faster than the baseline, else 0 (no
    drafting); the draft whose schedule is best over the mix. None without concurrency levels, or where speculation
    pays at none. Batch sizes between two levels take the lower level's gamma."""
    closed = [(i, level) for i, level in enumerate(levels) if level.concurrency is not None]
    if not closed:
        return None
    sign = 1 if objective.directions[0] == "maximize" else -1
    candidates = []
    for variant in dict.fromkeys((r["draft"], _int(r.get("ngram_max"))) for r in done):
        rows = [r for r in done if (r["draft"], _int(r.get("ngram_max"))) == variant]
        gammas, total, weight = [], 0.0, 0.0
        for index, level in closed:
            best, _ = choose(_at_level(rows, index), objective=objective, tolerance=tolerance)
            pays = measurably_faster(best)
            gammas.append({"load": level.label, "concurrency": level.concurrency,
                           "gamma": _int(best["gamma"]) if pays else 0,
                           "speedup": best.get("speedup") if pays else 1.0,
                           "value": best["value"] if pays else baselines[index].get("value")})
            if gammas[-1]["value"] is not None:
                total += level.weight * gammas[-1]["value"]
                weight += level.weight
        if any(g["gamma"] for g in gammas):
            candidates.append((sign * (total / weight if weight else 0.0), variant, rows[0], gammas))
    if not candidates:
        return None
    _, (draft, ngram_max), row, gammas = max(candidates, key=lambda c: c[0])
    ranges = batch_size_ranges([(g["concurrency"], g["gamma"]) for g in gammas], max_batch=max_batch)
    return {"draft": draft, "method": row["method"], "ngram_max": ngram_max, "gammas": gammas,
            "batch_size_ranges": [list(r) for r in ranges], "uniform": len({g["gamma"] for g in gammas}) == 1,
            "recommended": True,  # until the verification measures it worse than the single setting
            "speculative_config": speculative_config(row, ranges)}


def batch_size_ranges(gammas: list[tuple[int, int]], *, max_batch: int | None) -> tuple[tuple[int, int, int], ...]:
    """(concurrency, gamma) per level, ascending -> vLLM's inclusive batch-size ranges: each level's gamma from its
    concurrency (the first from 1) up to the next level's, the last up to `max_batch` (vLLM's max-num-seqs; vLLM
    carries the last range's gamma beyond it anyway); neighbours with the same gamma merged."""
    ranges: list[list[int]] = []
    for index, (concurrency, gamma) in enumerate(gammas):
        start = 1 if index == 0 else concurrency
        end = gammas[index + 1][0] - 1 if index + 1 < len(gammas) else max(concurrency, max_batch or concurrency)
        if ranges and ranges[-1][2] == gamma:
            ranges[-1][1] = end
        else:
            ranges.append([start, end, gamma])
    return tuple(tuple(r) for r in ranges)


def max_num_seqs(profile: Profile) -> int | None:
    """vLLM's --max-num-seqs in the profile's extra args, where given."""
    args = list(profile.server.extra_args) if profile.server is not None else []
    for index, arg in enumerate(args):
        if arg == "--max-num-seqs" and index + 1 < len(args) and args[index + 1].isdigit():
            return int(args[index + 1])
        if arg.startswith("--max-num-seqs=") and arg.partition("=")[2].isdigit():
            return int(arg.partition("=")[2])
    return None

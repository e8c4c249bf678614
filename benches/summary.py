"""The bench's figures, derived from its request rows: each backend's points through `summary.summarize`
(on each prompt's fastest repeat), the analytic model through `summary.predict`, the native-over-HF ratios and
the ratios between native eager, native compiled and vLLM through `stats`'s paired bootstraps, and greedy
output equality from the recorded output hashes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from specbench.core import stats, summary
from benches.measure import ENGINE, Measurement
from specbench.core.results import PointSpec


@dataclass(frozen=True)
class Interval:
    value: float
    low: float | None  # None for one prompt: nothing to resample
    high: float | None


@dataclass(frozen=True)
class BackendFigures:
    tokens_per_s: float
    mean_accepted_length: float  # tokens per target step, bonus included
    speedup: Interval | None  # over the same backend's baseline; None for the baseline itself


@dataclass(frozen=True)
class MethodComparison:
    method: str  # baseline | ngram | draft
    native: BackendFigures
    hf: BackendFigures | None  # None when HF could not run the method
    hf_skipped: str | None
    native_over_hf: Interval | None  # baseline: tokens/s ratio; other methods: ratio of speedups
    acceptance_rate: float | None  # native: accepted / drafted
    alpha: float | None  # native: the per-token model parameter, accepted / (accepted + rejections)
    prediction: stats.Prediction | None  # the analytic model of the native requests
    identical: int  # requests whose native and HF outputs equal the native baseline's
    compared: int

    @property
    def predicted_over_measured(self) -> float | None:
        if self.prediction is None or self.native.speedup is None:
            return None
        return self.prediction.speedup / self.native.speedup.value


@dataclass(frozen=True)
class PathFigures:
    """One method on one backend, from each prompt's fastest repeat."""
    tokens_per_s: float
    speedup: Interval | None  # over the same backend's baseline; None for the baseline itself
    mean_accepted_length: float | None  # tokens per target step (the engine's counters for vLLM); None: not recorded


# the ratios the bench exists for: (numerator, denominator) backends
PAIRS = (("compiled", "native"), ("compiled", ENGINE), ("native", ENGINE))
NAMES = {"native": "native eager", "compiled": "native compiled", "hf": "HF", ENGINE: "vLLM"}


@dataclass(frozen=True)
class BenchSummary:
    measurement: Measurement
    target_ms_per_token: float | None  # native baseline: mean time of a 1-token target step
    methods: tuple[MethodComparison, ...]
    mismatches: tuple[str, ...]
    repeat_spread: float | None  # median over (backend, point, prompt) of slowest / fastest repeat - 1
    paths: dict[tuple[str, str], PathFigures]  # (backend, method) -> its figures, every backend that ran it
    ratios: tuple[tuple[str, Interval], ...]  # "baseline tokens/s, native compiled ÷ vLLM" -> value [CI]


def summarize(measurement: Measurement) -> BenchSummary:
    requests = measurement.requests
    fastest = fastest_repeats(requests)
    prompt_ids = list(dict.fromkeys(requests["prompt_id"]))
    baseline = measurement.specs[0]
    points = {backend: _points(list(measurement.specs), fastest[fastest["backend"] == backend])
              for backend in ("native", "hf")}
    comparisons = []
    for spec in measurement.specs:
        hf_skipped = measurement.skipped.get(("hf", spec.point_id))
        sides = {backend: [_per_prompt(fastest, backend, s, prompt_ids) for s in (spec, baseline)]
                 for backend in ("native", "hf")}
        if hf_skipped is not None or measurement.skipped.get(("hf", baseline.point_id)) is not None:
            native_over_hf = None
        elif spec.method == "baseline":
            native_over_hf = Interval(*stats.paired_bootstrap_speedup(*sides["native"][0], *sides["hf"][0]))
        else:
            native_over_hf = Interval(*stats.paired_bootstrap_speedup_ratio(
                (*sides["native"][0], *sides["native"][1]), (*sides["hf"][0], *sides["hf"][1])))
        native = points["native"].loc[spec.point_id]
        identical, compared = _identical(requests, spec, baseline)
        comparisons.append(MethodComparison(
            method=spec.method,
            native=_figures(native),
            hf=_figures(points["hf"].loc[spec.point_id]) if spec.point_id in points["hf"].index else None,
            hf_skipped=hf_skipped,
            native_over_hf=native_over_hf,
            acceptance_rate=_number(native["acceptance_rate"]),
            alpha=_number(native["alpha"]),
            prediction=None if spec.method == "baseline" else summary.predict(
                _rows(fastest, "native", spec), _rows(fastest, "native", baseline)),
            identical=identical,
            compared=compared,
        ))
    target_ms = next((c.prediction.target_ms_per_token for c in comparisons if c.prediction is not None), None)
    paths, ratios = _across_backends(measurement, fastest, prompt_ids)
    return BenchSummary(measurement, target_ms, tuple(comparisons), _mismatches(requests, baseline),
                        _repeat_spread(requests), paths, ratios)


def _across_backends(measurement: Measurement, fastest: pd.DataFrame, prompt_ids: list[str]
                     ) -> tuple[dict[tuple[str, str], PathFigures], tuple[tuple[str, Interval], ...]]:
    """Every backend's tokens/s and speedup per method, and the ratios of PAIRS: tokens/s for each method, and
    each method's speedup over its own backend's baseline, with paired bootstrap CIs over prompts."""
    baseline = measurement.specs[0]
    ran = {(backend, spec.method): spec for spec in measurement.specs for backend in measurement.backends
           if not _rows(fastest, backend, spec).empty}
    sides = {key: (*_per_prompt(fastest, key[0], spec, prompt_ids), *_per_prompt(fastest, key[0], baseline, prompt_ids))
             for key, spec in ran.items() if (key[0], "baseline") in ran}
    paths = {}
    for (backend, method), side in sides.items():
        tokens, ms = side[0], side[1]
        speedup = None if method == "baseline" else Interval(*stats.paired_bootstrap_speedup(*side))
        paths[backend, method] = PathFigures(float(tokens.sum() / (ms.sum() / 1e3)), speedup,
                                             _accepted_length(_rows(fastest, backend, ran[backend, method])))
    ratios = []
    for method in dict.fromkeys(spec.method for spec in measurement.specs):
        for first, second in PAIRS:
            if (first, method) not in sides or (second, method) not in sides:
                continue
            one, other = sides[first, method], sides[second, method]  # ratios: ms serve as well as seconds
            label = f"{NAMES[first]} ÷ {NAMES[second]}"
            ratios.append((f"{method} tokens/s, {label}", Interval(*stats.paired_bootstrap_speedup(*one[:2], *other[:2]))))
            if method != "baseline":
                ratios.append((f"{method} speedup, {label}", Interval(*stats.paired_bootstrap_speedup_ratio(one, other))))
    return paths, tuple(ratios)


def _accepted_length(rows: pd.DataFrame) -> float | None:
    """Tokens per target step: decode tokens over target steps, or the engine's own figure (vLLM)."""
    if "engine_mean_accepted_length" in rows and rows["engine_mean_accepted_length"].notna().any():
        return float(rows["engine_mean_accepted_length"].dropna().iloc[0])
    steps = pd.to_numeric(rows["target_steps"], errors="coerce")
    if steps.isna().any() or not steps.sum():
        return None
    return float(rows["decode_tokens"].sum() / steps.sum())


def fastest_repeats(requests: pd.DataFrame) -> pd.DataFrame:
    """Each (backend, point, prompt)'s fastest repeat: other processes on a shared machine only ever add
    time, so the fastest repeat is the least disturbed one."""
    fastest = requests.groupby(["backend", "point_id", "prompt_id"], sort=False)["e2e_ms"].idxmin()
    return requests.loc[fastest.to_numpy()].reset_index(drop=True)


def _points(specs: list[PointSpec], rows: pd.DataFrame) -> pd.DataFrame:
    return summary.summarize(specs, rows, failures={}, context={}).set_index("point_id")


def _rows(requests: pd.DataFrame, backend: str, spec: PointSpec) -> pd.DataFrame:
    return requests[(requests["backend"] == backend) & (requests["point_id"] == spec.point_id)]


def _per_prompt(requests: pd.DataFrame, backend: str, spec: PointSpec,
                prompt_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Output tokens [P] and e2e ms [P] of one request per prompt, in prompt order."""
    rows = _rows(requests, backend, spec).set_index("prompt_id").reindex(prompt_ids)
    return rows["output_tokens"].to_numpy(float), rows["e2e_ms"].to_numpy(float)


def _figures(point: pd.Series) -> BackendFigures:
    speedup = None
    if point["method"] != "baseline" and _number(point["speedup"]) is not None:
        speedup = Interval(float(point["speedup"]), _number(point["speedup_ci_low"]), _number(point["speedup_ci_high"]))
    return BackendFigures(tokens_per_s=float(point["tokens_per_s"]),
                          mean_accepted_length=float(point["mean_accepted_length"]), speedup=speedup)


def _number(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _baseline_shas(requests: pd.DataFrame, baseline: PointSpec, backend: str = "native") -> dict[tuple[str, int], str]:
    rows = _rows(requests, backend, baseline)
    return dict(zip(zip(rows["prompt_id"], rows["repeat"]), rows["output_sha"]))


def _identical(requests: pd.DataFrame, spec: PointSpec, baseline: PointSpec) -> tuple[int, int]:
    """(native requests whose output, and their HF twin's where there is one, equal the native baseline's,
    native requests)."""
    expected = _baseline_shas(requests, baseline)
    hf = _rows(requests, "hf", spec)
    hf_shas = dict(zip(zip(hf["prompt_id"], hf["repeat"]), hf["output_sha"]))
    native = _rows(requests, "native", spec)
    same = sum(1 for key, sha in zip(zip(native["prompt_id"], native["repeat"]), native["output_sha"])
               if sha == expected[key] and hf_shas.get(key, sha) == sha)
    return same, len(native)


def _mismatches(requests: pd.DataFrame, baseline: PointSpec) -> tuple[str, ...]:
    """Requests whose greedy output differs from the native baseline's (vLLM's: from vLLM's own baseline, another
    engine's fp32 kernels may round a near-tie the other way)."""
    expected = {"native": _baseline_shas(requests, baseline), ENGINE: _baseline_shas(requests, baseline, ENGINE)}
    prompt_number = {prompt_id: n for n, prompt_id in enumerate(dict.fromkeys(requests["prompt_id"]), start=1)}
    return tuple(
        f"{r['backend']} {r['point_id']}, prompt {prompt_number[r['prompt_id']]}, repeat {r['repeat'] + 1}"
        for r in requests.to_dict("records")
        if r["output_sha"] != expected[ENGINE if r["backend"] == ENGINE else "native"].get((r["prompt_id"], r["repeat"]))
    )


def _repeat_spread(requests: pd.DataFrame) -> float | None:
    """Median of (slowest / fastest - 1) over the repeats of each (backend, point, prompt); None for 1 repeat."""
    times = requests.groupby(["backend", "point_id", "prompt_id"])["e2e_ms"]
    spreads = (times.max() / times.min() - 1)[times.count() > 1]
    return float(np.median(spreads)) if len(spreads) else None

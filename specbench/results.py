"""Result files: per-request rows (the source of truth), per-point summaries derived from them, and
atomic parquet/JSON writes.

requests.parquet: one row per prompt x repeat x point. points.parquet: one row per point, recomputed
from the request rows every time it is written.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from specbench import stats
from specbench.engine.trace import Trace

REQUESTS_FILE = "requests.parquet"
POINTS_FILE = "points.parquet"
MANIFEST_FILE = "manifest.json"
RESULTS_DIR = Path("results")


def default_out_dir(profile_name: str, *, suffix: str = "") -> Path:
    """results/<profile name><suffix>: where `run` (no suffix) and `tune` ("-tune") write by default."""
    return RESULTS_DIR / f"{profile_name}{suffix}"


def stable_hash(data: Any) -> str:
    """A short content hash of plain data (run keys, point keys, grids)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PointSpec:
    """One configuration of a sweep. The baseline of a (temperature, top_p) has method and draft
    "baseline" and no gamma."""

    point_id: str
    method: str  # baseline | draft | ngram
    draft: str  # the draft's name in the profile; "baseline" for the baseline
    gamma: int | None
    temperature: float
    top_p: float
    draft_model: str | None = None
    draft_quantize: str | None = None
    ngram_min: int | None = None
    ngram_max: int | None = None

    @property
    def baseline_id(self) -> str:
        return baseline_point_id(self.temperature, self.top_p)

    @classmethod
    def baseline(cls, temperature: float, top_p: float) -> "PointSpec":
        return cls(baseline_point_id(temperature, top_p), "baseline", "baseline", None, temperature, top_p)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "PointSpec":
        """The spec of a row of points.parquet (or of any frame with its columns)."""
        return cls(**{name: plain(row[name]) for name in cls.__dataclass_fields__})


def baseline_point_id(temperature: float, top_p: float) -> str:
    return f"baseline-t{temperature:g}-p{top_p:g}"


def point_id(draft: str, gamma: int, temperature: float, top_p: float, *, ngram_max: int | None = None) -> str:
    """`<draft>[-n<ngram_max>]-g<gamma>-t<T>-p<top_p>`; the n-gram length only where it is tuned."""
    ngram = f"-n{ngram_max}" if ngram_max is not None else ""
    return f"{draft}{ngram}-g{gamma}-t{temperature:g}-p{top_p:g}"


def plain(value: Any) -> Any:
    """A parquet cell as a plain Python value (nullable ints come back as floats or NA)."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value.item() if hasattr(value, "item") else value


def request_row(spec: PointSpec, *, point_key: str, prompt_id: str, category: str, repeat: int, seed: int,
                trace: Trace) -> dict[str, Any]:
    """The raw measurements of one request."""
    stamps = sorted(set(trace.token_times_s))  # emission events: tokens of one step arrive together
    decode_s = trace.e2e_s - trace.ttft_s
    return {
        "point_id": spec.point_id,
        "point_key": point_key,
        "request_id": f"{prompt_id}#{repeat}",
        "prompt_id": prompt_id,
        "category": category,
        "repeat": repeat,
        "seed": seed,
        "prompt_tokens": trace.prompt_tokens,
        "output_tokens": trace.output_tokens,
        "ttft_ms": trace.ttft_s * 1e3,
        "e2e_ms": trace.e2e_s * 1e3,
        "tokens_per_s": trace.output_tokens / trace.e2e_s if trace.e2e_s > 0 else None,
        "tpot_ms": decode_s * 1e3 / (trace.output_tokens - 1) if trace.output_tokens > 1 else None,
        "itl_ms": [float(b - a) * 1e3 for a, b in zip(stamps, stamps[1:])],
        "target_steps": trace.target_steps,
        "decode_tokens": sum(step.emitted for step in trace.steps),
        "drafted_tokens": trace.drafted_tokens,
        "accepted_tokens": trace.accepted_tokens,
        "rejected_steps": trace.rejected_steps,
        "accepted_per_position": list(trace.accepted_per_position),
        "drafted_per_position": list(trace.drafted_per_position) if trace.drafted_per_position is not None else None,
        "draft_ms": _sum_ms(step.draft_s for step in trace.steps),
        "verify_ms": _sum_ms(step.verify_s for step in trace.steps),
        "peak_memory_growth_mb": (trace.peak_memory_growth_bytes / 2**20
                                  if trace.peak_memory_growth_bytes is not None else None),
        "output_sha": hashlib.sha256(json.dumps(trace.output_ids).encode()).hexdigest()[:16],
    }


def _sum_ms(values) -> float | None:
    values = list(values)
    if not values or any(v is None for v in values):
        return None
    return sum(values) * 1e3


def summarize(
    specs: list[PointSpec],
    requests: pd.DataFrame,
    *,
    failures: dict[str, str],
    context: dict[str, dict[str, Any]],
) -> pd.DataFrame:
    """One row per point that has requests or a failure. `context[point_id]` adds constant columns
    (backend, models, weight_mb, point_key)."""
    rows = []
    by_point = {point_id: group for point_id, group in requests.groupby("point_id", sort=False)} if len(requests) else {}
    for spec in specs:
        if spec.point_id not in by_point and spec.point_id not in failures:
            continue
        row = {**asdict(spec), **context.get(spec.point_id, {})}
        if spec.point_id in failures:
            rows.append({**row, "status": "failed", "error": failures[spec.point_id]})
            continue
        point = by_point[spec.point_id]
        baseline = by_point.get(spec.baseline_id)
        row.update(status="ok", error=None, **_metrics(point, baseline, spec, weight_mb=row.get("weight_mb")))
        rows.append(row)
    frame = pd.DataFrame(rows, columns=_POINT_COLUMNS)
    return frame.astype(_POINT_DTYPES)


def _metrics(point: pd.DataFrame, baseline: pd.DataFrame | None, spec: PointSpec, *,
             weight_mb: float | None) -> dict[str, Any]:
    drafted = point["drafted_tokens"].sum() if point["drafted_tokens"].notna().all() else None
    accepted = point["accepted_tokens"].sum()
    itl = np.concatenate([np.asarray(v, dtype=float) for v in point["itl_ms"]]) if len(point) else np.array([])
    growth = point["peak_memory_growth_mb"]
    metrics: dict[str, Any] = {
        "n_requests": len(point),
        "output_tokens": int(point["output_tokens"].sum()),
        "tokens_per_s": stats.throughput(point["output_tokens"], point["e2e_ms"] / 1e3),
        "acceptance_rate": accepted / drafted if drafted else None,
        "alpha": _alpha(point, accepted) if drafted else None,
        "mean_accepted_length": point["decode_tokens"].sum() / point["target_steps"].sum()
        if point["target_steps"].sum() else None,
        "accepted_per_position": _sum_lists(point["accepted_per_position"]),
        "drafted_per_position": _sum_lists(point["drafted_per_position"]) if drafted is not None else None,
        "ttft_ms_p50": stats.percentile(point["ttft_ms"], 50),
        "tpot_ms_p50": stats.percentile(point["tpot_ms"].dropna(), 50),
        "tpot_ms_p90": stats.percentile(point["tpot_ms"].dropna(), 90),
        "itl_ms_p50": stats.percentile(itl, 50),
        "itl_ms_p99": stats.percentile(itl, 99),
        "e2e_ms_p50": stats.percentile(point["e2e_ms"], 50),
        "e2e_ms_p99": stats.percentile(point["e2e_ms"], 99),
        "peak_memory_mb": (weight_mb or 0.0) + growth.max() if growth.notna().all() else None,
        "draft_ms_per_token": point["draft_ms"].sum() / drafted if drafted and point["draft_ms"].notna().all() else None,
        "verify_ms_per_step": point["verify_ms"].sum() / point["target_steps"].sum()
        if point["target_steps"].sum() and point["verify_ms"].notna().all() else None,
    }
    metrics.update(_against_baseline(point, baseline, spec, metrics))
    return metrics


def _against_baseline(point: pd.DataFrame, baseline: pd.DataFrame | None, spec: PointSpec,
                      metrics: dict[str, Any]) -> dict[str, Any]:
    """speedup with a paired bootstrap CI, the analytic prediction, and greedy output equality."""
    empty = {"speedup": None, "speedup_ci_low": None, "speedup_ci_high": None, "predicted_speedup": None,
             "outputs_match_baseline": None}
    if baseline is None or spec.method == "baseline":
        if spec.method == "baseline":
            return {**empty, "speedup": 1.0, "speedup_ci_low": 1.0, "speedup_ci_high": 1.0,
                    "outputs_match_baseline": True if spec.temperature == 0 else None}
        return empty
    mine = point.groupby("prompt_id")[["output_tokens", "e2e_ms"]].sum()
    theirs = baseline.groupby("prompt_id")[["output_tokens", "e2e_ms"]].sum()
    shared = mine.index.intersection(theirs.index)
    result = dict(empty)
    if len(shared):
        mine, theirs = mine.loc[shared], theirs.loc[shared]
        speedup, low, high = stats.paired_bootstrap_speedup(
            mine["output_tokens"].to_numpy(float), mine["e2e_ms"].to_numpy(float),
            theirs["output_tokens"].to_numpy(float), theirs["e2e_ms"].to_numpy(float),
        )
        # one prompt gives no spread to resample: the CI stays empty rather than falsely tight
        result.update(speedup=speedup, speedup_ci_low=low if len(shared) > 1 else None,
                      speedup_ci_high=high if len(shared) > 1 else None)
    target_ms = (baseline["verify_ms"].sum() / baseline["target_steps"].sum()
                 if baseline["verify_ms"].notna().all() and baseline["target_steps"].sum() else None)
    if target_ms and metrics["acceptance_rate"] is not None and metrics["verify_ms_per_step"] is not None:
        result["predicted_speedup"] = stats.predicted_speedup(
            alpha=metrics["alpha"] if metrics["alpha"] is not None else metrics["acceptance_rate"],
            gamma=spec.gamma, draft_s_per_token=metrics["draft_ms_per_token"] or 0.0,
            verify_s=metrics["verify_ms_per_step"], target_s_per_token=target_ms,
        )
    if spec.temperature == 0:
        expected = dict(zip(baseline["request_id"], baseline["output_sha"]))
        result["outputs_match_baseline"] = bool(all(
            expected.get(request_id) == sha for request_id, sha in zip(point["request_id"], point["output_sha"])
        ))
    return result


def _alpha(point: pd.DataFrame, accepted: int) -> float | None:
    """The per-token acceptance probability of the analytic model (Leviathan et al.'s alpha): each
    drafted token is accepted with probability alpha until the first rejection, so its estimate is
    accepted / (accepted + rejections). accepted / drafted (the acceptance_rate) is lower: tokens drafted
    after a rejection are never judged."""
    if "rejected_steps" not in point or point["rejected_steps"].isna().any():
        return None
    judged = accepted + point["rejected_steps"].sum()
    return float(accepted / judged) if judged else None


def _sum_lists(column: pd.Series) -> list[int]:
    arrays = [np.asarray(v, dtype=np.int64) for v in column if v is not None]
    if not arrays:
        return []
    width = max(len(a) for a in arrays)
    return np.sum([np.pad(a, (0, width - len(a))) for a in arrays], axis=0).astype(int).tolist()


_POINT_COLUMNS = [
    "point_id", "status", "error", "backend", "method", "draft", "gamma", "temperature", "top_p",
    "n_requests", "output_tokens", "tokens_per_s", "speedup", "speedup_ci_low", "speedup_ci_high",
    "predicted_speedup", "acceptance_rate", "alpha", "mean_accepted_length", "accepted_per_position",
    "drafted_per_position", "ttft_ms_p50", "tpot_ms_p50", "tpot_ms_p90", "itl_ms_p50", "itl_ms_p99",
    "e2e_ms_p50", "e2e_ms_p99", "peak_memory_mb", "weight_mb", "draft_ms_per_token", "verify_ms_per_step",
    "outputs_match_baseline", "target_model", "draft_model", "draft_quantize", "ngram_min", "ngram_max",
    "point_key",
]
POINT_COLUMNS = tuple(_POINT_COLUMNS)
_POINT_DTYPES = {
    "point_id": "string", "status": "string", "error": "string", "backend": "string", "method": "string",
    "draft": "string", "gamma": "Int64", "temperature": "float64", "top_p": "float64", "n_requests": "Int64",
    "output_tokens": "Int64", "outputs_match_baseline": "boolean", "target_model": "string",
    "draft_model": "string", "draft_quantize": "string", "ngram_min": "Int64", "ngram_max": "Int64",
    "point_key": "string", "alpha": "float64", **{name: "float64" for name in _POINT_COLUMNS if name.endswith(
        ("_s", "speedup", "_low", "_high", "_rate", "_length", "_p50", "_p90", "_p99", "_mb", "_per_token", "_per_step"))},
}


# --- files ------------------------------------------------------------------------------------


def write_parquet_atomic(frame: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def write_json_atomic(data: dict[str, Any], path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


def read_parquet(path: Path) -> pd.DataFrame | None:
    """One whole version of the file (None when there is none), even while a writer replaces it: pyarrow
    looks up a path's size and opens it separately, and a rename in between reads the new file with the
    old size ("Couldn't deserialize thrift"). One read of the bytes holds one inode throughout."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return pd.read_parquet(io.BytesIO(data))
POINT_DTYPES = dict(_POINT_DTYPES)  # the dtypes of points.parquet's columns, for tables that reuse them

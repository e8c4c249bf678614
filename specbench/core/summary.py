"""Per-point summaries derived from the per-request rows (the source of truth): throughput, acceptance,
latency percentiles, the speedup over the baseline with its paired bootstrap CI, the analytic prediction,
greedy output equality and where it first diverges, and whether the machine was quiet enough to trust the
timing. Recomputed every time points.parquet is written."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd

from specbench.core import contention, cost, imposed, predictions, stats
from specbench.core.trace import first_divergence
from specbench.core.results import POINT_COLUMNS, POINT_DTYPES, PointSpec, typed_frame

RATE_TOLERANCE = 0.02  # an open-loop client that sent further than this from the asked rate fell behind
LATENESS_LIMIT_MS = 5.0  # an open-loop client whose p99 send lateness is above this fell behind its schedule
NEAR_TIE_GAP = 0.1  # logits: a greedy divergence this close is a near-tie (bf16/fp16 rounding), not a bug


def summarize(specs: list[PointSpec], requests: pd.DataFrame, *, failures: dict[str, str],
              context: dict[str, dict[str, Any]], slo: Mapping[str, float] | None = None,
              usd_per_hour: float | None = None, verify_ms_by_tokens: Sequence[float] = ()) -> pd.DataFrame:
    """One row per point that has requests or a failure. `context[point_id]` adds constant columns
    (backend, models, weight_mb, point_key, how quiet the machine was, the engine's own counters); `slo`
    ({"ttft_ms": 500, ...}: a request meets it when each value is at most its limit) gives goodput; the price of
    a replica-hour, what a million output tokens cost at the point's throughput; `verify_ms_by_tokens` (the target's
    forward pass timed at k = 1.. tokens) the verify costs of the speedup each point's draft predicts for it from
    its largest gamma."""
    rows = []
    sent = {point_id: group for point_id, group in requests.groupby("point_id", sort=False)} if len(requests) else {}
    by_point = {point_id: _measured(group) for point_id, group in sent.items()}  # failed requests apart
    from_largest = predictions.from_largest_gamma(specs, by_point, verify_ms_by_tokens=verify_ms_by_tokens)
    for spec in specs:
        if spec.point_id not in by_point and spec.point_id not in failures:
            continue
        row = {**asdict(spec), **context.get(spec.point_id, {})}
        if spec.point_id not in failures and not len(by_point[spec.point_id]):
            failures = {**failures, spec.point_id: f"every request failed ({_errors(sent[spec.point_id])})"}
        if spec.point_id in failures:
            rows.append({**row, "status": "failed", "error": failures[spec.point_id]})
            continue
        point = by_point[spec.point_id]
        baseline = by_point.get(spec.baseline_id)
        steady = not pd.isna(row.get("lead_in_requests", None))  # a steady state: a lead-in before its window
        row.update(status="ok", error=None, **_metrics(point, baseline, spec, row, steady=steady),
                   **_load(point, sent[spec.point_id], spec, slo or {}, steady=steady), **_spreads(point, spec))
        row.update(_stability(row, context.get(spec.baseline_id, {}), baseline, spec))
        row["usd_per_mtok"] = cost.usd_per_mtok(usd_per_hour, row["tokens_per_s"])
        row["max_gamma_predicted_speedup"] = from_largest.get(spec.point_id)
        rows.append(row)
    return typed_frame(rows, POINT_COLUMNS, POINT_DTYPES)


def mismatch_warning(row: dict) -> str:
    """Why greedy outputs differ: a near-tie (bf16/fp16 rounding flips an argmax between a multi-token
    verification and one-token decoding) or a real bug, told by the target's top-2 logit gap where the first
    mismatching output diverges."""
    fraction, position, gap = (_cell(row.get(key)) for key in ("outputs_match_fraction", "first_divergence",
                                                                  "divergence_top2_gap"))
    matched = f" ({fraction:.0%} of requests match)" if fraction is not None else ""
    head = f"greedy outputs differ from the baseline at {row['point_id']}{matched}"
    if row.get("backend") == "server":  # a serving engine: no logits to tell a near-tie from a bug
        return (f"{head}: the engine's speculative path is not bit-exact with its plain decoding here (quantised "
                "kernels and batching round differently for multi-token verification); compare output quality, "
                "not just speed")
    if position is None:
        return f"{head}: the decoding is broken for this point, its speed means nothing"
    where = f"first divergence at output token {int(position)}"
    if gap is None:
        return f"{head}; {where}: the decoding is broken for this point, its speed means nothing"
    if gap <= NEAR_TIE_GAP:
        return (f"{head}; {where}, where the target's top-2 logits differ by {gap:.3g}: a near-tie that "
                "reduced-precision verification can flip, not necessarily a bug")
    return (f"{head}; {where}, where the target's top-2 logits differ by {gap:.3g} (not a near-tie): the "
            "decoding is broken for this point, its speed means nothing")


def _cell(value: Any) -> Any:
    """A cell as a value, or None where it is missing (None, NaN, NA: files written before the column)."""
    return None if value is None or pd.isna(value) else value


def _metrics(point: pd.DataFrame, baseline: pd.DataFrame | None, spec: PointSpec, row: dict[str, Any], *,
             steady: bool = False) -> dict[str, Any]:
    drafted = point["drafted_tokens"].sum() if point["drafted_tokens"].notna().all() else None
    accepted = point["accepted_tokens"].sum() if point["accepted_tokens"].notna().all() else None
    itl = np.concatenate([np.asarray(v, dtype=float) for v in point["itl_ms"]]) if len(point) else np.array([])
    growth = point["peak_memory_growth_mb"]
    steps = point["target_steps"].sum() if point["target_steps"].notna().all() else 0
    metrics: dict[str, Any] = {
        "n_requests": len(point),
        "output_tokens": int(point["output_tokens"].sum()),
        "tokens_per_s": _throughput(point, spec, steady=steady),
        "acceptance_rate": accepted / drafted if drafted else None,
        "alpha": _alpha(point, accepted) if drafted else None,
        "mean_accepted_length": point["decode_tokens"].sum() / steps if steps else None,
        "accepted_per_position": _sum_lists(point["accepted_per_position"]),
        "drafted_per_position": _sum_lists(point["drafted_per_position"]) if drafted is not None else None,
        **{f"{name}_p{q}": stats.percentile(values, q) for name, values in (
            ("ttft_ms", point["ttft_ms"]), ("tpot_ms", point["tpot_ms"].dropna()), ("itl_ms", itl),
            ("e2e_ms", point["e2e_ms"])) for q in (50, 90, 99)},
        "peak_memory_mb": (row.get("weight_mb") or 0.0) + growth.max() if growth.notna().all() else None,
        "draft_ms_per_token": point["draft_ms"].sum() / drafted if drafted and point["draft_ms"].notna().all() else None,
        "verify_ms_per_step": point["verify_ms"].sum() / steps if steps and point["verify_ms"].notna().all() else None,
    }
    if row.get("server_peak_rss_mb") is not None:
        metrics["peak_memory_mb"] = row["server_peak_rss_mb"]
    # on a GPU, what a GPU user sizes by: NVML's view of the run's (or the engine's) processes, everything included
    # (weights, KV and static caches, CUDA-graph pools, the context); else torch's peak reserved memory
    gpu_peak = next((row[key] for key in ("gpu_peak_memory_mb", "gpu_peak_reserved_mb") if _cell(row.get(key))), None)
    if gpu_peak is not None:
        metrics["peak_memory_mb"] = gpu_peak
    energy = _cell(row.get("gpu_energy_j"))
    metrics["energy_per_output_token_j"] = energy / metrics["output_tokens"] \
        if energy is not None and metrics["output_tokens"] else None
    metrics.update(engine_acceptance(row, spec, decode_tokens=int((point["output_tokens"] - 1).clip(lower=0).sum())))
    if spec.method == "baseline" and metrics["mean_accepted_length"] is None:
        metrics["mean_accepted_length"] = 1.0  # one token per target forward pass, by definition
    metrics["drafted_per_step"] = _drafted_per_step(point, row, metrics, drafted=drafted, steps=steps)
    if "shared_vocabulary_mass" in point and point["shared_vocabulary_mass"].notna().any():
        measured = point.dropna(subset=["shared_vocabulary_mass"])  # each request weighted by its decode steps
        metrics["shared_vocabulary_mass"] = float(np.average(measured["shared_vocabulary_mass"],
                                                             weights=measured["target_steps"].clip(lower=1)))
    metrics.update(_against_baseline(point, baseline, spec))
    if spec.synthetic:  # imposed, not its draft's: said wherever the point appears, and its outputs never compared
        metrics.update(acceptance_source="synthetic", outputs_match_baseline=None, outputs_match_fraction=None,
                       first_divergence=None, divergence_top2_gap=None)
    return metrics


def _drafted_per_step(point: pd.DataFrame, row: dict[str, Any], metrics: dict[str, Any], *, drafted, steps) -> float | None:
    """Mean tokens drafted per target pass (fewer than gamma where an n-gram lookup found no match): the steps' own
    counts in-process; on an engine its drafted tokens over its passes (decode tokens / mean accepted length)."""
    if drafted is not None and steps:
        return float(drafted / steps)
    draft_tokens, length = _cell(row.get("engine_draft_tokens")), metrics.get("mean_accepted_length")
    decode_tokens = float((point["output_tokens"] - 1).clip(lower=0).sum())
    if draft_tokens is None or not length or not decode_tokens:
        return None
    return float(draft_tokens / (decode_tokens / length))


def _measured(point: pd.DataFrame) -> pd.DataFrame:
    """The requests that were measured: not those that failed (a row with an `error`; files from before have none)."""
    return point[point["error"].isna()] if "error" in point else point


def _errors(sent: pd.DataFrame, *, kinds: int = 3) -> str | None:
    """The failed requests' errors, grouped, the most frequent first: "3 x timed out after 124 s; 1 x HTTP 503"."""
    if "error" not in sent or not sent["error"].notna().any():
        return None
    counted = sent["error"].dropna().value_counts()
    text = "; ".join(f"{n} x {error}" for error, n in counted.head(kinds).items())
    return text + (f"; and {len(counted) - kinds} other errors" if len(counted) > kinds else "")


def _wall_s(point: pd.DataFrame, spec: PointSpec, *, steady: bool = False) -> float:
    """The point's measured time: one request at a time, the requests' own times added up; under load (more
    than one in flight) the wall time from the first send to the last finish; at a request rate from the schedule's
    start (its first arrival comes one gap after it) to the last finish, as vLLM's benchmark client times its run —
    in a steady state from its window's start, which is not recorded: one mean gap before its first scheduled
    arrival (the wait from a fixed instant to the next Poisson arrival is one mean gap), not the lead-in's start."""
    under_load = spec.open_loop or (spec.concurrency or 1) > 1
    if under_load and "start_ms" in point and point["start_ms"].notna().all():
        start = point["start_ms"].min()
        if spec.open_loop:  # the server backend records when each request was due (`scheduled_ms`)
            due = point["scheduled_ms"] if "scheduled_ms" in point and point["scheduled_ms"].notna().all() \
                else point["start_ms"]
            start = max(0.0, float(due.min()) - 1e3 / spec.request_rate) if steady else 0.0
        return float(((point["start_ms"] + point["e2e_ms"]).max() - start) / 1e3)
    return float(point["e2e_ms"].sum() / 1e3)


def _throughput(point: pd.DataFrame, spec: PointSpec, *, steady: bool = False) -> float:
    """Output tokens per second over the point's measured time (never a sum of per-request rates)."""
    wall_s = _wall_s(point, spec, steady=steady)
    return float(point["output_tokens"].sum() / wall_s) if wall_s > 0 else float("nan")


def _load(point: pd.DataFrame, sent: pd.DataFrame, spec: PointSpec, slo: Mapping[str, float], *,
          steady: bool = False) -> dict[str, Any]:
    """Requests per second over the measured time; goodput (requests per second that met every SLO) and the
    fraction that did, where SLOs are given — a failed request (in `sent`, not in `point`) met none; at a request
    rate, the rate the client actually sent at and how late it sent (p99)."""
    wall_s = _wall_s(point, spec, steady=steady)
    failed = len(sent) - len(point)
    out: dict[str, Any] = {"request_throughput": len(point) / wall_s if wall_s > 0 else None, "goodput": None,
                           "slo_met_fraction": None, "achieved_request_rate": None,
                           "slo": ", ".join(f"{name} <= {limit:g}" for name, limit in slo.items()) or None,
                           "failed_requests": failed, "request_errors": _errors(sent), "send_lateness_ms_p99": None}
    if slo:
        met = meets_slo(point, slo)
        out.update(slo_met_fraction=float(met.sum() / len(sent)) if len(sent) else None,
                   goodput=float(met.sum() / wall_s) if wall_s > 0 else None)
    if spec.open_loop and len(sent) > 1 and sent["start_ms"].notna().all():
        out["achieved_request_rate"] = _sent_rate(sent, spec.request_rate)
        if "send_lateness_ms" in sent and sent["send_lateness_ms"].notna().any():
            out["send_lateness_ms_p99"] = stats.percentile(sent["send_lateness_ms"].dropna(), 99)
    return out


FROM_ARRIVAL = ("ttft_ms", "e2e_ms")  # figures a user counts from the moment the request arrived


def meets_slo(rows: pd.DataFrame, slo: Mapping[str, float]) -> np.ndarray:
    """Per request: whether it met every SLO limit. A request without the figure (one output token: no TPOT) meets
    that limit. TTFT and end to end count from the request's scheduled arrival where the open-loop client sent it
    late (its `send_lateness_ms` added): a late client must not hide the queueing a user would have waited through."""
    met = np.ones(len(rows), dtype=bool)
    late = (pd.to_numeric(rows["send_lateness_ms"], errors="coerce").clip(lower=0).fillna(0.0).to_numpy(float)
            if "send_lateness_ms" in rows else np.zeros(len(rows)))
    for name, limit in slo.items():
        values = pd.to_numeric(rows[name], errors="coerce").to_numpy(float)
        met &= ~((values + late if name in FROM_ARRIVAL else values) > limit)
    return met


def _sent_rate(sent: pd.DataFrame, request_rate: float) -> float | None:
    """The rate the requests were sent at: the asked rate times how much longer the actual sends took to reach the
    last than the schedule (which spans count / rate from its start, as vLLM's client schedules; files from before
    scheduled the first request at the start, and spanned (count - 1) / rate)."""
    last_ms = sent["start_ms"].max()
    if "scheduled_ms" in sent and sent["scheduled_ms"].notna().all() and last_ms > 0:
        return float(request_rate * sent["scheduled_ms"].max() / last_ms)
    span_s = (last_ms - sent["start_ms"].min()) / 1e3
    return (len(sent) - 1) / span_s if span_s > 0 else None


def engine_acceptance(row: dict[str, Any], spec: PointSpec, *, decode_tokens: int) -> dict[str, Any]:
    """A serving engine's acceptance from its own counters (never guessed): acceptance_rate = accepted /
    draft tokens; mean accepted length = tokens per target forward pass, bonus included: each forward pass after the
    prefill emits its accepted tokens plus one, so the passes are the decode tokens (output tokens after each
    request's first) less the accepted ones, and at least the passes that drafted (an engine that stops a request
    within a step counts accepted tokens it did not send). vLLM's own "mean acceptance length", 1 + accepted / drafts,
    counts only the passes that had a draft: n-gram lookup drafts nothing where it finds no match, and that figure
    read 1.90 where the passes were 1.45 tokens each (the embedded model, n-gram gamma 3)."""
    source = row.get("acceptance_source")
    if source == "synthetic" and _cell(row.get("engine_draft_tokens")) is None:  # imposed in-process: its own steps
        return {}
    if source is None or spec.method == "baseline":
        return {}
    if source == "gauge":  # SGLang: its accepted-length gauge (a recent running mean, bonus token included)
        length = _cell(row.get("engine_accept_length_gauge"))
        return {} if length is None else {"mean_accepted_length": length,
                                          "acceptance_rate": (length - 1) / spec.gamma if spec.gamma else None}
    drafts, draft_tokens, accepted = row.get("engine_drafts"), row.get("engine_draft_tokens"), row.get("engine_accepted_tokens")
    out: dict[str, Any] = {"acceptance_rate": accepted / draft_tokens if draft_tokens else None}
    if accepted is not None and decode_tokens > accepted:
        out["mean_accepted_length"] = decode_tokens / max(decode_tokens - accepted, drafts or 0)
    elif drafts is not None and accepted is not None:  # no drafts: one token per forward pass
        out["mean_accepted_length"] = 1.0 + accepted / drafts if drafts else 1.0
    positions = row.get("engine_accepted_per_position")
    if positions is not None and len(positions):
        out["accepted_per_position"] = [int(round(v)) for v in positions]
    return out


def _against_baseline(point: pd.DataFrame, baseline: pd.DataFrame | None, spec: PointSpec) -> dict[str, Any]:
    """speedup with a paired bootstrap CI, the analytic prediction, and greedy output equality."""
    empty = {"speedup": None, "speedup_ci_low": None, "speedup_ci_high": None, "predicted_speedup": None,
             "outputs_match_baseline": None, "outputs_match_fraction": None, "first_divergence": None,
             "divergence_top2_gap": None}
    if baseline is None or spec.method == "baseline":
        if spec.method == "baseline":
            greedy = spec.temperature == 0
            return {**empty, "speedup": 1.0, "speedup_ci_low": 1.0, "speedup_ci_high": 1.0,
                    "outputs_match_baseline": True if greedy else None, "outputs_match_fraction": 1.0 if greedy else None}
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
    prediction = predict(point, baseline)
    result["predicted_speedup"] = prediction.speedup if prediction is not None else None
    if spec.temperature == 0:
        result.update(_greedy_equality(point, baseline))
    return result


def _greedy_equality(point: pd.DataFrame, baseline: pd.DataFrame) -> dict[str, Any]:
    """Whether every greedy output equals the baseline's, the fraction that do, and where the first mismatch
    diverges with the target's top-2 logit gap there (a near-tie when small: not necessarily a bug)."""
    expected = baseline.set_index("request_id")
    matches = [expected["output_sha"].get(request_id) == sha for request_id, sha in zip(point["request_id"], point["output_sha"])]
    out: dict[str, Any] = {"outputs_match_baseline": bool(all(matches)),
                           "outputs_match_fraction": float(np.mean(matches)) if matches else None}
    if all(matches) or "output_ids" not in point or "output_ids" not in expected:
        return out
    divergences = []
    for row, match in zip(point.to_dict("records"), matches):
        if match or row["request_id"] not in expected.index or row.get("output_ids") is None:
            continue
        reference = expected.loc[row["request_id"]]
        if reference["output_ids"] is None:
            continue
        found = first_divergence(tuple(row["output_ids"]), tuple(reference["output_ids"]),
                                 gaps=tuple(row.get("top2_gap") if row.get("top2_gap") is not None else ()),
                                 reference_gaps=tuple(reference.get("top2_gap") if reference.get("top2_gap") is not None else ()))
        if found is not None:
            divergences.append(found)
    if divergences:
        position, gap = min(divergences, key=lambda d: d[0])
        out.update(first_divergence=position, divergence_top2_gap=gap)
    return out


def _stability(row: dict[str, Any], baseline_context: dict[str, Any], baseline: pd.DataFrame | None,
               spec: PointSpec) -> dict[str, Any]:
    """How far the point's timing (and its baseline's, which its speedup divides by) can be trusted."""
    point_reasons = contention.unstable_reasons(
        other_cpu_share=row.get("other_cpu_share"), gpu_other_processes=row.get("gpu_other_processes"),
        repeat_spread=row.get("repeat_spread"), tpot_spread=row.get("tpot_spread"))
    reasons = list(point_reasons)
    if other := _cell(row.get("other_traffic_tokens")):
        reasons.append(f"the attached server generated {other:.0f} output tokens beyond the {row['output_tokens']} "
                       "specbench's requests received: other traffic shared it")
    achieved = row.get("achieved_request_rate")
    if spec.open_loop and achieved is not None and abs(achieved / spec.request_rate - 1) > RATE_TOLERANCE:
        reasons.append(f"the client sent {achieved:.3g} requests/s, not the {spec.request_rate:g} asked for: "
                       "the client, not the server, was the bottleneck")
    lateness = row.get("send_lateness_ms_p99")
    if spec.open_loop and lateness is not None and lateness > LATENESS_LIMIT_MS:
        reasons.append(f"the client sent requests late of their arrival times (p99 {lateness:.3g} ms, limit "
                       f"{LATENESS_LIMIT_MS:g} ms): the client, not the server, shaped the load")
    if spec.synthetic and row.get("drafted_per_position") is not None:
        if wrong := imposed.kept_mismatch(spec.imposed_rates, row.get("accepted_per_position") or [],
                                          row.get("drafted_per_position") or []):
            reasons.append(wrong)
    if spec.method != "baseline" and baseline is not None:
        baseline_spreads = _spreads(baseline, spec)
        reasons += [f"baseline: {r}" for r in contention.unstable_reasons(
            other_cpu_share=baseline_context.get("other_cpu_share"),
            gpu_other_processes=baseline_context.get("gpu_other_processes"), **baseline_spreads)]
    return {"unstable": bool(reasons), "unstable_reason": "; ".join(reasons) or None}


def _spreads(point: pd.DataFrame, spec: PointSpec) -> dict[str, float | None]:
    """How much repeats of a prompt, and TPOT across requests, differ. Not at a request rate: there a prompt's
    draws meet different queues by design, and TPOT varies with the batch."""
    if spec.open_loop:
        return {"repeat_spread": None, "tpot_spread": None}
    by_prompt = [list(group) for _, group in point.groupby("prompt_id")["e2e_ms"]]
    tpot = point["tpot_ms"].dropna()
    tpot_spread = None
    if len(tpot) >= 4 and stats.percentile(tpot, 10):
        tpot_spread = stats.percentile(tpot, 90) / stats.percentile(tpot, 10)
    return {"repeat_spread": contention.repeat_spread(by_prompt), "tpot_spread": tpot_spread}


def predict(point: pd.DataFrame, baseline: pd.DataFrame) -> stats.Prediction | None:
    """The analytic model of a point's requests against its baseline's: how many tokens its steps drafted
    and accepted per position, its draft time per drafted token and verify time per step, over the
    baseline's time per step, and both sides' prefill (TTFT) per request. None when the backend does not
    record what it drafted (HF generate) or nothing was drafted."""
    steps = point["target_steps"].sum()
    baseline_steps = baseline["target_steps"].sum()
    timed = point["draft_ms"].notna().all() and point["verify_ms"].notna().all() and baseline["verify_ms"].notna().all()
    if (not steps or not baseline_steps or not timed or point["drafted_tokens"].isna().any()
            or "drafted_per_position" not in point or point["drafted_per_position"].isna().any()):
        return None
    drafted = point["drafted_tokens"].sum()
    if not drafted:
        return None
    model = stats.StepModel.from_counts(steps=int(steps),
                                        drafted_per_position=_sum_lists(point["drafted_per_position"]),
                                        accepted_per_position=_sum_lists(point["accepted_per_position"]))
    return stats.Prediction(model, draft_ms_per_token=float(point["draft_ms"].sum() / drafted),
                            verify_ms_per_step=float(point["verify_ms"].sum() / steps),
                            target_ms_per_token=float(baseline["verify_ms"].sum() / baseline_steps),
                            decode_tokens=float(point["decode_tokens"].mean()), ttft_ms=float(point["ttft_ms"].mean()),
                            baseline_ttft_ms=float(baseline["ttft_ms"].mean()))


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

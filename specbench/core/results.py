"""Result files: the point spec and ids, per-request rows (the source of truth), the schema of the per-point
summaries (derived from the rows in `specbench.core.summary`), and atomic parquet/JSON writes.

requests.parquet: one row per prompt x repeat x point. points.parquet: one row per point, recomputed
from the request rows every time it is written.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from specbench.core.trace import Trace

if TYPE_CHECKING:
    from specbench.workloads.prompts import Prompt  # a request row names the prompt it sent

REQUESTS_FILE = "requests.parquet"
POINTS_FILE = "points.parquet"
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
    concurrency: int | None = 1  # requests in flight (closed loop); None at a request-rate level
    request_rate: float | None = None  # requests/s arriving whatever the server's state (open loop)
    # a gamma per batch size ("1-3:3,4-8:0", specbench.engines.schedule_text; `gamma` is its largest): vLLM's dynamic
    # speculation, launched as one setting that serves every load level
    gamma_schedule: str | None = None
    # which repeat of a capacity search ([capacity] repeats) sent the point: 0 for the first and every sweep point;
    # a later repeat's probes are points of their own (`-rep<k+1>` in the id), with their own draws
    capacity_repeat: int = 0
    # which draw of a capacity probe's load within its search: 0 for the first and every sweep point; a load probed
    # again with more requests (to decide it) is a point of its own (`-d<k+1>` in the id), a new draw of prompts
    # and arrivals, so that the fit keeps every draw's requests
    capacity_draw: int = 0
    # an acceptance what-if ([[drafts]] acceptance): the per-position unconditional acceptance rates imposed instead of
    # verifying ("0.8,0.6,0.4", one per position up to gamma); the point's acceptance is not its draft's, its output
    # not the target's
    imposed_acceptance: str | None = None

    @property
    def imposed_rates(self) -> tuple[float, ...] | None:
        """The imposed per-position acceptance as numbers (None: the draft's own, verified)."""
        if self.imposed_acceptance is None:
            return None
        return tuple(float(r) for r in self.imposed_acceptance.split(","))

    @property
    def synthetic(self) -> bool:
        return self.imposed_acceptance is not None

    @property
    def baseline_id(self) -> str:
        return baseline_point_id(self.temperature, self.top_p, concurrency=self.concurrency,
                                 request_rate=self.request_rate, repeat=self.capacity_repeat, draw=self.capacity_draw)

    @property
    def open_loop(self) -> bool:
        return self.request_rate is not None

    @property
    def load_level(self) -> str:
        """The point's load in words: "concurrency 4", "2 requests/s"."""
        return f"{self.request_rate:g} requests/s" if self.open_loop else f"concurrency {self.concurrency}"

    @classmethod
    def baseline(cls, temperature: float, top_p: float, *, concurrency: int | None = 1,
                 request_rate: float | None = None) -> "PointSpec":
        concurrency = None if request_rate is not None else concurrency
        return cls(baseline_point_id(temperature, top_p, concurrency=concurrency, request_rate=request_rate), "baseline",
                   "baseline", None, temperature, top_p, concurrency=concurrency, request_rate=request_rate)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "PointSpec":
        """The spec of a row of points.parquet (or of any frame with its columns); files written before the
        concurrency axis ran one request at a time."""
        values = {name: plain(row.get(name)) for name in cls.__dataclass_fields__}
        if values["request_rate"] is None:
            values["concurrency"] = values["concurrency"] or 1
        values["capacity_repeat"] = int(values["capacity_repeat"] or 0)
        values["capacity_draw"] = int(values["capacity_draw"] or 0)
        return cls(**values)

    def at_load(self, *, concurrency: int | None = None, request_rate: float | None = None) -> "PointSpec":
        """The same configuration at another load level (a request rate, else a concurrency), its id's load
        suffix replaced."""
        stem = self.point_id.removesuffix(_load_suffix(self.concurrency, self.request_rate))
        concurrency = None if request_rate is not None else (concurrency or 1)
        return replace(self, point_id=stem + _load_suffix(concurrency, request_rate), concurrency=concurrency,
                       request_rate=request_rate)

    def in_repeat(self, repeat: int) -> "PointSpec":
        """The same point sent again by repeat `repeat` of a capacity search (0: the point itself)."""
        load = _load_suffix(self.concurrency, self.request_rate)
        stem = self.point_id.removesuffix(load).removesuffix(_repeat_suffix(self.capacity_repeat))
        return replace(self, point_id=stem + _repeat_suffix(repeat) + load, capacity_repeat=repeat)

    def in_draw(self, draw: int) -> "PointSpec":
        """The same point's load drawn again (`draw` 0: the point itself), its id's draw suffix replaced."""
        stem = self.point_id.removesuffix(_draw_suffix(self.capacity_draw))
        return replace(self, point_id=stem + _draw_suffix(draw), capacity_draw=draw)

    def identity(self) -> dict[str, Any]:
        """The point as hashed into its point key (concurrency 1 and no request rate left out: keys from before
        those axes hold)."""
        data = asdict(self)
        if data["concurrency"] == 1:
            del data["concurrency"]
        if data["request_rate"] is None:
            del data["request_rate"]
        if data["gamma_schedule"] is None:
            del data["gamma_schedule"]
        if not data["capacity_repeat"]:
            del data["capacity_repeat"]
        if not data["capacity_draw"]:
            del data["capacity_draw"]
        if data["imposed_acceptance"] is None:
            del data["imposed_acceptance"]
        return data


def _load_suffix(concurrency: int | None, request_rate: float | None = None) -> str:
    if request_rate is not None:
        return f"-r{request_rate:g}"
    return f"-c{concurrency}" if concurrency != 1 else ""


def _repeat_suffix(repeat: int) -> str:
    return f"-rep{repeat + 1}" if repeat else ""


def _draw_suffix(draw: int) -> str:
    return f"-d{draw + 1}" if draw else ""


def baseline_point_id(temperature: float, top_p: float, *, concurrency: int | None = 1,
                      request_rate: float | None = None, repeat: int = 0, draw: int = 0) -> str:
    return (f"baseline-t{temperature:g}-p{top_p:g}{_repeat_suffix(repeat)}{_load_suffix(concurrency, request_rate)}"
            f"{_draw_suffix(draw)}")


def point_id(draft: str, gamma: int, temperature: float, top_p: float, *, ngram_max: int | None = None,
             concurrency: int | None = 1, request_rate: float | None = None, scheduled: bool = False,
             synthetic: int | None = None) -> str:
    """`<draft>[-n<ngram_max>]-g<gamma>[-syn<k>]-t<T>-p<top_p>[-c<concurrency> | -r<request rate>]`; the n-gram
    length only where it is tuned, the concurrency only where it is not 1; a draft with a gamma per batch size has
    `-sched` for its gamma; the k-th imposed acceptance of an acceptance what-if `-syn<k>` (from 1)."""
    ngram = f"-n{ngram_max}" if ngram_max is not None else ""
    length = "-sched" if scheduled else f"-g{gamma}"
    imposed = f"-syn{synthetic}" if synthetic is not None else ""
    return f"{draft}{ngram}{length}{imposed}-t{temperature:g}-p{top_p:g}{_load_suffix(concurrency, request_rate)}"


def load_labels(points: pd.DataFrame) -> pd.DataFrame:
    """Per row of a points table: its load level as `load_order` (closed-loop concurrency levels first, then
    request rates, each ascending) and `load` ("concurrency 4", "2 requests/s"). Files written before the load
    axes ran one request at a time."""
    index = points.index
    rate = points["request_rate"].astype("Float64") if "request_rate" in points else pd.Series(pd.NA, index=index, dtype="Float64")
    concurrency = (points["concurrency"].astype("Float64") if "concurrency" in points
                   else pd.Series(1.0, index=index, dtype="Float64")).fillna(1.0)
    open_loop = rate.notna()
    order = [(1, float(r)) if is_open else (0, float(c)) for is_open, r, c in zip(open_loop, rate, concurrency)]
    labels = [f"{r:g} requests/s" if is_open else f"concurrency {int(c)}" for is_open, r, c in zip(open_loop, rate, concurrency)]
    return pd.DataFrame({"load_order": order, "load": labels}, index=index)


def at_load(points: pd.DataFrame, *, concurrency: int | None, request_rate: float | None) -> pd.Series:
    """Which rows of a points table are at this load level (files written before the load axes ran one request
    at a time)."""
    rate = points["request_rate"] if "request_rate" in points else pd.Series(float("nan"), index=points.index)
    if request_rate is not None:
        return rate == request_rate
    closed = points["concurrency"].fillna(1) if "concurrency" in points else pd.Series(1, index=points.index)
    return rate.isna() & (closed == concurrency)


def plain(value: Any) -> Any:
    """A parquet cell as a plain Python value (nullable ints come back as floats or NA; lists as arrays)."""
    if hasattr(value, "__len__") and not isinstance(value, (str, bytes, dict)):
        return [plain(item) for item in value]
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value.item() if hasattr(value, "item") else value


def prompt_columns(prompt: Prompt) -> dict[str, Any]:
    """A request row's columns that say which prompt it sent: id, category, and a multi-turn dataset's
    conversation and turn (None elsewhere)."""
    return {"prompt_id": prompt.prompt_id, "category": prompt.category, "conversation_id": prompt.conversation_id,
            "turn": prompt.turn}


def request_row(spec: PointSpec, *, point_key: str, prompt: Prompt, repeat: int, seed: int,
                trace: Trace) -> dict[str, Any]:
    """The raw measurements of one request."""
    stamps = sorted(set(trace.token_times_s))  # emission events: tokens of one step arrive together
    decode_s = trace.e2e_s - trace.ttft_s
    return {
        "point_id": spec.point_id,
        "point_key": point_key,
        "request_id": f"{prompt.prompt_id}#{repeat}",
        **prompt_columns(prompt),
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
        "output_ids": list(trace.output_ids),
        "top2_gap": list(trace.top2_gap) if trace.top2_gap else None,  # greedy only: where a divergence is a near-tie
        # a draft with another tokenizer: the target's mean mass on the tokens the draft can propose, per step
        "shared_vocabulary_mass": sum(trace.shared_mass) / len(trace.shared_mass) if trace.shared_mass else None,
        "start_ms": None,  # one request at a time: each request's own time is what counts
    }


def _sum_ms(values) -> float | None:
    values = list(values)
    if not values or any(v is None for v in values):
        return None
    return sum(values) * 1e3


_POINT_COLUMNS = [
    "point_id", "status", "error", "backend", "method", "draft", "gamma", "temperature", "top_p",
    "n_requests", "output_tokens", "tokens_per_s", "speedup", "speedup_ci_low", "speedup_ci_high",
    "predicted_speedup", "acceptance_rate", "alpha", "mean_accepted_length", "accepted_per_position",
    "drafted_per_position", "ttft_ms_p50", "tpot_ms_p50", "tpot_ms_p90", "itl_ms_p50", "itl_ms_p99",
    "e2e_ms_p50", "e2e_ms_p99", "peak_memory_mb", "weight_mb", "draft_ms_per_token", "verify_ms_per_step",
    "outputs_match_baseline", "target_model", "draft_model", "draft_quantize", "ngram_min", "ngram_max",
    "point_key",
    # added with load levels, greedy divergence and contention (absent from files written before)
    "concurrency", "outputs_match_fraction", "first_divergence", "divergence_top2_gap",
    "other_cpu_share", "gpu_other_processes", "repeat_spread", "tpot_spread", "unstable", "unstable_reason",
    "acceptance_source", "engine_drafts", "engine_draft_tokens", "engine_accepted_tokens",
    "engine_accepted_per_position", "server_peak_rss_mb",
    # added with open-loop load levels and SLOs
    "request_rate", "achieved_request_rate", "request_throughput", "goodput", "slo_met_fraction", "slo",
    "ttft_ms_p90", "ttft_ms_p99", "tpot_ms_p99", "itl_ms_p90", "e2e_ms_p90",
    # added with gamma schedules
    "gamma_schedule",
    # added with cost: what a million output tokens cost at the point's throughput ([cost] usd_per_hour)
    "usd_per_mtok",
    # added with failed requests (kept as rows with an error) and the open-loop client's send lateness
    "failed_requests", "request_errors", "send_lateness_ms_p99",
    # added with predictions across gamma: the speedup this point's draft at its largest gamma predicts for it
    "max_gamma_predicted_speedup",
    # added with static caches: "static" (compiled steps) or "dynamic", and why dynamic (native backend)
    "kv_cache", "kv_cache_reason",
    # added with the server's /metrics sampled during a point: what the engine held (KV-cache usage 0-1, requests
    # running and waiting, preemptions over the point) and how many samples say so
    "kv_cache_usage_peak", "kv_cache_usage_mean", "requests_running_peak", "requests_waiting_peak", "preemptions",
    "metrics_samples",
    # added with GPUs as resources: what the point's GPUs showed over its measured requests (NVML: the run's or the
    # engine's processes' peak memory, utilisation, energy, the window), torch's peak reserved memory in-process, energy
    # per output token; an attached server's output tokens beyond specbench's (other traffic); SGLang's accepted-length
    # gauge
    "gpu_count", "gpu_peak_memory_mb", "gpu_memory_source", "gpu_utilization_pct", "gpu_energy_j", "gpu_window_s",
    "gpu_samples", "gpu_peak_reserved_mb", "energy_per_output_token_j", "engine_generated_tokens",
    "other_traffic_tokens", "engine_accept_length_gauge",
    # added with steady-state points ([load] lead_in_s, window_s): the requests sent before the measured window and
    # after it (not measured), and the window's span from its first request's send (or arrival) to its last's
    "lead_in_requests", "tail_requests", "window_s",
    # added with repeated capacity searches ([capacity] repeats): which repeat sent the probe (0: the first); whether
    # the engine's queue still grew over the point (requests waiting, last quarter of the samples less the second)
    "capacity_repeat", "requests_waiting_growth",
    # added with the engine's time series per point: the mean time requests waited in its queue (vLLM's histogram),
    # and each /metrics sample taken while the requests ran (ms from the sample before the first; lists, one entry
    # per sample)
    "queue_time_ms_mean", "series_t_ms", "series_requests_running", "series_requests_waiting", "series_kv_cache_usage",
    "series_preemptions",
    # whether a steady point began with the engine's prefix cache emptied (None: not tried — attached, or no endpoint);
    # which draw of its load a capacity probe is (0: the first; a load probed again to decide it draws anew)
    "prefix_cache_reset", "capacity_draw",
    # added with acceptance what-ifs: the per-position acceptance imposed instead of verifying ("0.8,0.6,0.4"; its
    # points say acceptance_source = "synthetic"), and the mean drafted tokens per target step (what a prediction
    # from acceptance needs beside it: an n-gram lookup proposes fewer than gamma where nothing matches)
    "imposed_acceptance", "drafted_per_step",
    # added with drafts of another tokenizer: how the draft proposes ("intersection" or "text"; empty for a draft of
    # the target's own vocabulary), how many tokens both vocabularies share, and the target's mean probability mass on
    # them over the point's decode steps (what an intersection draft can ever propose)
    "vocabulary", "shared_tokens", "shared_vocabulary_mass",
    # added with containers: how the engine's processes were told apart on its GPUs ("pid": NVML lists the run's own
    # pids; "launch": the processes that appeared with the launch, NVML's pids being another namespace's, as in a pod)
    "gpu_process_match",
    # added with SGLang's n-gram tree: the candidates per draft step a launch was given (SGLang's n-gram breadth,
    # --speculative-ngram-max-bfs-breadth, or its --speculative-eagle-topk; 1: a chain); empty where the engine has no
    # such setting (vLLM, llama.cpp, the in-process backends: chains) or it is not known (attached)
    "tree_breadth",
]
POINT_COLUMNS = tuple(_POINT_COLUMNS)
_POINT_DTYPES = {
    "point_id": "string", "status": "string", "error": "string", "backend": "string", "method": "string",
    "draft": "string", "gamma": "Int64", "temperature": "float64", "top_p": "float64", "n_requests": "Int64",
    "output_tokens": "Int64", "outputs_match_baseline": "boolean", "target_model": "string",
    "draft_model": "string", "draft_quantize": "string", "ngram_min": "Int64", "ngram_max": "Int64",
    "point_key": "string", "alpha": "float64", "concurrency": "Int64", "first_divergence": "Int64",
    "gpu_other_processes": "Int64", "unstable": "boolean", "unstable_reason": "string", "acceptance_source": "string",
    "outputs_match_fraction": "float64", "divergence_top2_gap": "float64", "other_cpu_share": "float64",
    "repeat_spread": "float64", "tpot_spread": "float64", "engine_drafts": "float64", "engine_draft_tokens": "float64",
    "engine_accepted_tokens": "float64", "slo": "string", "request_throughput": "float64", "goodput": "float64",
    "slo_met_fraction": "float64", "gamma_schedule": "string", "usd_per_mtok": "float64",
    "failed_requests": "Int64", "request_errors": "string", "kv_cache": "string", "kv_cache_reason": "string",
    "kv_cache_usage_peak": "float64", "kv_cache_usage_mean": "float64", "requests_running_peak": "Int64",
    "requests_waiting_peak": "Int64", "preemptions": "Int64", "metrics_samples": "Int64",
    "gpu_count": "Int64", "gpu_memory_source": "string", "gpu_utilization_pct": "float64", "gpu_energy_j": "float64",
    "gpu_samples": "Int64", "energy_per_output_token_j": "float64", "engine_generated_tokens": "float64",
    "other_traffic_tokens": "float64", "engine_accept_length_gauge": "float64", "lead_in_requests": "Int64",
    "tail_requests": "Int64", "capacity_repeat": "Int64", "requests_waiting_growth": "float64",
    "queue_time_ms_mean": "float64", "prefix_cache_reset": "boolean",
    "capacity_draw": "Int64", "imposed_acceptance": "string", "drafted_per_step": "float64",
    "vocabulary": "string", "shared_tokens": "Int64", "shared_vocabulary_mass": "float64",
    "gpu_process_match": "string", "tree_breadth": "Int64",
    **{name: "float64" for name in _POINT_COLUMNS if name.endswith(
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


def typed_frame(rows: list[dict[str, Any]], columns: tuple[str, ...], dtypes: dict[str, str]) -> pd.DataFrame:
    """`pd.DataFrame(rows, columns=columns).astype(dtypes)`, column by column: the same frame in a third of the time
    (a frame-wide astype re-blocks every column; summaries are rebuilt after every point and every tune trial)."""
    untyped = pd.DataFrame(rows, columns=[name for name in columns if name not in dtypes])  # inferred as before
    data = {}
    for name in columns:
        dtype = dtypes.get(name)
        if dtype is None:
            data[name] = untyped[name]
            continue
        values = [row.get(name) for row in rows]
        try:
            data[name] = pd.array(values, dtype=dtype)
        except (TypeError, ValueError):  # what pd.array will not take as it stands (a number for a string): converted
            data[name] = pd.Series(values, dtype=object).astype(dtype).array
    return pd.DataFrame(data, columns=list(columns))

"""What an engine's Prometheus /metrics text says, parsed with prometheus_client's parser.

- Acceptance as the engine counts it, read before and after a point and differenced. vLLM (`vllm:spec_decode_*`)
  and llama.cpp (`llamacpp:spec_decode_*`) expose counters of the same shape, with or without the `_total` suffix:
  num_drafts, num_draft_tokens, num_accepted_tokens, num_accepted_tokens_per_pos{position}.
- What it holds (`engine_load`): KV-cache usage, requests running and waiting, preemptions, by each engine's names
  (`LOAD_NAMES`), sampled during a point (`sampler.py`) and summarised over it (`summarize_load`).
- Signs of work (`work_samples`): whether anything the engine counts moved, for telling a hung engine from a slow
  one (`watch.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


@dataclass(frozen=True)
class SpecCounters:
    drafts: float  # verification steps that drafted (vLLM: one per request per step)
    draft_tokens: float
    accepted_tokens: float
    accepted_per_position: tuple[float, ...]

    def minus(self, before: "SpecCounters") -> "SpecCounters":
        n = max(len(self.accepted_per_position), len(before.accepted_per_position))
        mine = self.accepted_per_position + (0.0,) * (n - len(self.accepted_per_position))
        theirs = before.accepted_per_position + (0.0,) * (n - len(before.accepted_per_position))
        return SpecCounters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                            self.accepted_tokens - before.accepted_tokens,
                            tuple(a - b for a, b in zip(mine, theirs)))


def spec_counters(text: str, *, prefix: str) -> SpecCounters | None:
    """The engine's cumulative spec-decode counters (summed over label sets such as model name), or None
    when it exposes none (no speculation configured, or an engine without them)."""
    totals: dict[str, float] = {}
    per_position: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if not name.startswith(prefix + "spec_decode_"):
                continue
            key = name.removeprefix(prefix + "spec_decode_")
            if key == "num_accepted_tokens_per_pos" and "position" in sample.labels:
                position = int(sample.labels["position"])
                per_position[position] = per_position.get(position, 0.0) + sample.value
            elif key in COUNTERS:
                totals[key] = totals.get(key, 0.0) + sample.value
    if not totals:
        return None
    positions = tuple(per_position.get(i, 0.0) for i in range(max(per_position) + 1)) if per_position else ()
    return SpecCounters(totals.get("num_drafts", 0.0), totals.get("num_draft_tokens", 0.0),
                        totals.get("num_accepted_tokens", 0.0), positions)


# --- what the engine holds: KV cache, requests running and waiting, preemptions ---------------------------------


@dataclass(frozen=True)
class LoadNames:
    """The engine's metric names (without its prefix or a `_total` suffix) for what it holds; the first of each
    tuple that is present is read."""

    kv_cache_usage: tuple[str, ...]  # a gauge, 0-1
    requests_running: tuple[str, ...]  # a gauge
    requests_waiting: tuple[str, ...]  # a gauge
    preemptions: tuple[str, ...]  # a cumulative counter; () where the engine has none
    generated_tokens: tuple[str, ...] = ()  # a cumulative counter of output tokens (what tells other traffic)
    accept_length: tuple[str, ...] = ()  # a gauge of the mean accepted length, where there are no counters (SGLang)
    queue_time: tuple[str, ...] = ()  # a histogram (its _sum in seconds and _count) of the time requests waited


LOAD_NAMES = {
    # vLLM 0.32 (read in its source, v1/metrics/loggers.py, and on a real vLLM CPU /metrics): kv_cache_usage_perc is
    # 0-1 despite its name; gpu_cache_usage_perc is its name before v1
    "vllm:": LoadNames(("kv_cache_usage_perc", "gpu_cache_usage_perc"), ("num_requests_running",),
                       ("num_requests_waiting",), ("num_preemptions",), ("generation_tokens",),
                       queue_time=("request_queue_time_seconds",)),
    # llama.cpp (a real llama-server, build 11434): requests in slots, and requests deferred until a slot frees;
    # kv_cache_usage_ratio only in builds before mid-2025 (none since), and no preemption counter
    "llamacpp:": LoadNames(("kv_cache_usage_ratio",), ("requests_processing",), ("requests_deferred",), (),
                           ("tokens_predicted",)),
    # SGLang, taken from its documentation (docs/references/production_metrics.md; not installed here): token_usage
    # is a gauge of the share of its KV token pool in use, sampled like the others — SGLang keeps no peak itself;
    # num_retracted_requests_total (its preemptions: retractions) is not on that page: read only where present;
    # spec_accept_length is a gauge of its recent mean accepted length (it keeps no spec-decode counters)
    "sglang:": LoadNames(("token_usage",), ("num_running_reqs",), ("num_queue_reqs",), ("num_retracted_requests",),
                         ("generation_tokens",), ("spec_accept_length",)),
}


@dataclass(frozen=True)
class EngineLoad:
    """One /metrics sample of what the engine holds; None where it exposes no such figure."""

    kv_cache_usage: float | None  # the fullest KV cache (of several engines: data parallel), 0-1
    requests_running: float | None  # summed over label sets (engines)
    requests_waiting: float | None
    preemptions: float | None  # cumulative
    generated_tokens: float | None = None  # cumulative
    accept_length: float | None = None  # a gauge (SGLang)
    queue_time_s: float | None = None  # cumulative: the seconds the requests that left the queue so far waited in it
    queued_requests: float | None = None  # cumulative: how many left it
    t_ms: float | None = None  # when it was taken, from the sample before the point's first request (the sampler's)


def engine_load(text: str, *, prefix: str) -> EngineLoad | None:
    """What the engine holds now, from its /metrics text; None for an engine whose names are not known."""
    names = LOAD_NAMES.get(prefix)
    if names is None:
        return None
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(prefix):
                values.setdefault(sample.name.removeprefix(prefix).removesuffix("_total"), []).append(sample.value)

    def first(candidates: tuple[str, ...]) -> list[float] | None:
        return next((values[name] for name in candidates if name in values), None)

    kv, running, waiting, preempted = (first(names.kv_cache_usage), first(names.requests_running),
                                       first(names.requests_waiting), first(names.preemptions))
    generated, accept = first(names.generated_tokens), first(names.accept_length)
    waited = first(tuple(name + "_sum" for name in names.queue_time))
    left = first(tuple(name + "_count" for name in names.queue_time))
    return EngineLoad(max(kv) if kv else None, sum(running) if running else None, sum(waiting) if waiting else None,
                      sum(preempted) if preempted else None, sum(generated) if generated else None,
                      sum(accept) / len(accept) if accept else None, sum(waited) if waited else None,
                      sum(left) if left else None)


@dataclass(frozen=True)
class LoadSummary:
    """What the engine held over a point, from its samples: None where it exposes no such figure or no sample was
    taken while the requests ran (a point shorter than the sampling interval), never a guess."""

    kv_cache_usage_peak: float | None
    kv_cache_usage_mean: float | None
    requests_running_peak: int | None
    requests_waiting_peak: int | None
    preemptions: int | None  # the counter's rise over the point
    metrics_samples: int  # samples taken while the requests ran
    engine_generated_tokens: float | None = None  # the output-token counter's rise, before to after
    engine_accept_length_gauge: float | None = None  # the mean of an accepted-length gauge over the samples (SGLang)
    # requests waiting, mean over the last quarter of the samples less the mean over the second (the first is the
    # engine filling from idle): above 0 by more than noise, the queue was still growing — no steady state
    requests_waiting_growth: float | None = None
    # the mean time a request waited in the engine's queue, over the requests that left it during the point (vLLM's
    # histogram, before to after: the warm-up's and a steady point's lead-in and tail included); None where none left
    queue_time_ms_mean: float | None = None
    # the engine's own time series over the point, one entry per sample taken while the requests ran: ms from the
    # sample taken before the first request, and each figure then (None where the engine has no such figure);
    # preemptions counted from `before`
    series_t_ms: list[float] | None = None
    series_requests_running: list[float | None] | None = None
    series_requests_waiting: list[float | None] | None = None
    series_kv_cache_usage: list[float | None] | None = None
    series_preemptions: list[float | None] | None = None


def summarize_load(during: list[EngineLoad], *, before: EngineLoad | None = None,
                   after: EngineLoad | None = None) -> LoadSummary:
    """Peaks and the mean over the samples taken while the requests ran (at a fixed interval: the mean over time);
    the preemption counter's rise from the first sample to the last, `before` (taken before the first request) and
    `after` (after the last response) included — they bound the point but, taken with nothing in flight, say nothing
    of its load."""

    def present(field: str) -> list[float]:
        return [getattr(s, field) for s in during if getattr(s, field) is not None]

    kv, running, waiting = present("kv_cache_usage"), present("requests_running"), present("requests_waiting")
    accept = present("accept_length")
    counted = [s.preemptions for s in (before, *during, after) if s is not None]
    generated = None
    if before is not None and after is not None and None not in (before.generated_tokens, after.generated_tokens):
        generated = after.generated_tokens - before.generated_tokens
    return LoadSummary(
        kv_cache_usage_peak=max(kv) if kv else None,
        kv_cache_usage_mean=sum(kv) / len(kv) if kv else None,
        requests_running_peak=int(max(running)) if running else None,
        requests_waiting_peak=int(max(waiting)) if waiting else None,
        preemptions=int(counted[-1] - counted[0]) if counted and None not in (counted[0], counted[-1]) else None,
        metrics_samples=len(during),
        engine_generated_tokens=generated,
        engine_accept_length_gauge=sum(accept) / len(accept) if accept else None,
        requests_waiting_growth=waiting_growth(waiting),
        queue_time_ms_mean=_queue_time_ms(before, after),
        **_series(during, before=before),
    )


def _queue_time_ms(before: EngineLoad | None, after: EngineLoad | None) -> float | None:
    if before is None or after is None or None in (before.queue_time_s, after.queue_time_s, before.queued_requests,
                                                   after.queued_requests):
        return None
    left = after.queued_requests - before.queued_requests
    return (after.queue_time_s - before.queue_time_s) / left * 1e3 if left > 0 else None


def _series(during: list[EngineLoad], *, before: EngineLoad | None) -> dict[str, list | None]:
    """The samples as lists, one entry per sample (columns `series_*`); None without a timed sample."""
    timed = [s for s in during if s.t_ms is not None]
    if not timed:
        return {}
    start = before.preemptions if before is not None and before.preemptions is not None else None
    return {"series_t_ms": [s.t_ms for s in timed],
            "series_requests_running": [s.requests_running for s in timed],
            "series_requests_waiting": [s.requests_waiting for s in timed],
            "series_kv_cache_usage": [s.kv_cache_usage for s in timed],
            "series_preemptions": [None if s.preemptions is None or start is None else s.preemptions - start
                                   for s in timed]}


def waiting_growth(waiting: list[float]) -> float | None:
    """The mean of the last quarter of `waiting` (samples in time order) less that of the second quarter; None with
    fewer than 8 samples."""
    if len(waiting) < 8:
        return None
    quarter = len(waiting) // 4
    second, last = waiting[quarter:2 * quarter], waiting[-quarter:]
    return sum(last) / len(last) - sum(second) / len(second)


# --- signs of work, for telling a hung engine from a slow one ---------------------------------------------------

# The Prometheus client's own collectors (process_*, python_*) and HTTP instrumentation (http_*): a spinning thread
# and specbench's own /health and /metrics requests move them, so they are no sign of work.
NOT_WORK = ("process_", "python_", "http_")


def work_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample the engine itself keeps (name and labels -> value): all but NOT_WORK's. Each is moved by its
    scheduler or its output loop as work happens — tokens prefilled and generated, requests admitted and finished,
    KV blocks allocated step by step during a long chunked prefill, drafts verified, llama.cpp's decode calls — and
    none moves while that loop is stuck: on vLLM and llama.cpp, two /metrics texts of an idle engine 5 s apart
    differ only in process_* samples. Every sample, not a list of names: a renamed counter must not make a working
    engine look hung (not seeing a hang costs a request timeout; killing a working engine costs the point)."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if not sample.name.startswith(NOT_WORK)}

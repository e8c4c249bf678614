"""One point on a server: warm-up requests (prompts that are not measured), the engine's counters before, every
prompt x repeat at the point's concurrency (or at its arrival times) while a sampler reads what the engine holds, the
counters after; one request row per request, with what was seen on the wire — or, for a request that failed, why."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import statistics
import time
import urllib.request
from dataclasses import asdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from specbench.backends.base import AfterPrompt, OnRequest
from specbench.backends.server import client
from specbench.backends.server.metrics import LoadSummary, SpecCounters, spec_counters, summarize_load
from specbench.backends.server.process import peak_rss_mb, reset_peak_rss
from specbench.backends.server.sampler import MetricsSampler
from specbench.backends.server.steady import Window, gamma_arrivals, run_steady
from specbench.core import gpus
from specbench.core.results import PointSpec, prompt_columns

if TYPE_CHECKING:
    from specbench.backends.server.process import ServerProcess
    from specbench.engines import ServingEngine
    from specbench.profile import Profile
    from specbench.workloads.build import Workload
    from specbench.workloads.prompts import Prompt


class ServerSession(Protocol):
    """What measuring a point reads of its session (backend.py's ServerSession, which calls in here)."""

    profile: Profile
    engine: ServingEngine | None
    server: ServerProcess | None  # the launched engine (None: attached)
    claim: gpus.Claim | None
    attached: bool
    api_key: str | None
    keep_alive: bool
    model_name: str | None
    tokenizer: Any
    workload: Workload
    prompts: list[Prompt]
    prompt_tokens: list[int]

    def gpu_uuids(self) -> tuple[str, ...]: ...
    def limits(self, spec: PointSpec, requests: list[client.Request]) -> client.Limits: ...
    def request_timeout_s(self, budget: int) -> float: ...

WARMUP_TEXT = "Before it is measured, the engine answers a few requests like this one to warm up. "


def request_plan(session: "ServerSession", spec: PointSpec) -> list[tuple[int, Any, int, int]]:
    """(prompt index, prompt, repeat, seed) per request. Closed loop: every prompt x repeat. At a request rate:
    `load.requests` requests (default: as many), prompts in a seeded cyclic order (`cyclic_order`: every prompt once
    before any twice), a prompt's repeat counting its draws — the same for every configuration at one level
    (`draw_seed`)."""
    profile, run, prompts = session.profile, session.profile.run, session.prompts
    if not spec.open_loop:
        return [(index, prompt, repeat, run.seed + 1000 * index + repeat)
                for index, prompt in enumerate(prompts) for repeat in range(run.repeats)]
    count = profile.load.requests or len(prompts) * run.repeats
    order = cyclic_order(len(prompts), seed=draw_seed(run.seed, spec, count))
    drawn = [order[i % len(order)] for i in range(count)]
    seen: dict[int, int] = {}
    plan = []
    for index in drawn:
        repeat = seen[index] = seen.get(index, -1) + 1
        plan.append((index, prompts[index], repeat, run.seed + 1000 * index + repeat))
    return plan


def cyclic_order(prompts: int, *, seed: int) -> list[int]:
    """A seeded permutation of the prompt indices, sent round and round: request i takes prompt order[i % prompts].
    Any `prompts` consecutive requests then hold each prompt once, so a window of a point holds the prompt set in
    the same proportions whichever draw it is and wherever its lead-in ended; independent draws with replacement let
    the mix move the attainment of a prompt-sensitive draft (n-gram lookup) from probe to probe."""
    order = list(range(prompts))
    random.Random(seed).shuffle(order)
    return order


def draw_seed(seed: int, spec: PointSpec, count: int) -> int:
    """The seed of one load level's draws, its prompts and (at a request rate) its arrivals: from the run's seed, the
    level, the number of requests and the capacity search's repeat. Every configuration at one level gets the same
    draws (common random numbers: the difference between two configurations is not the draw's); each level its own,
    a level sent again with more requests (a capacity probe confirmed) a new draw rather than the first one's
    prefix, and each repeat of a capacity search ([capacity] repeats) and each draw of a load within it its own."""
    level = f"{float(spec.request_rate)!r}" if spec.open_loop else f"c{spec.concurrency or 1}"
    repeat = f"|rep{spec.capacity_repeat}" if spec.capacity_repeat else ""  # a repeated search draws afresh
    draw = f"|draw{spec.capacity_draw}" if spec.capacity_draw else ""  # and a load probed again within it
    key = f"{seed}|{level}|{count}{repeat}{draw}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


def warmup_requests(session: "ServerSession", spec: PointSpec, requests: list[client.Request],
                    count: int) -> list[client.Request]:
    """`count` warm-up requests that no measured request shares a prompt with (with prefix caching, warming up on a
    measured prompt makes its measured TTFT a cache hit): a filler text about as long as the median measured
    prompt, numbered so no two share a prefix, with the budgets of the measured requests."""
    tokens = int(statistics.median(session.prompt_tokens)) if session.prompt_tokens else 32
    filler = session.tokenizer(WARMUP_TEXT * (1 + tokens // 12), add_special_tokens=False)["input_ids"][:tokens]
    text = session.tokenizer.decode(filler)
    return [client.Request(-1 - i, [{"role": "user", "content": f"Warm-up request {i + 1}. {text}"}],
                           spec.temperature, spec.top_p, requests[i % len(requests)].max_tokens,
                           session.profile.run.seed, session.workload.ignore_eos, requests[i % len(requests)].timeout_s)
            for i in range(count)]


def measure_point(session: "ServerSession", spec: PointSpec, *, url: str, point_key: str, on_request: OnRequest,
                  after_prompt: AfterPrompt | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    run = session.profile.run
    concurrency = spec.concurrency or 1  # at a request rate: warm-up one at a time
    plan = request_plan(session, spec)
    budgets, ignore_eos = session.workload.max_new_tokens, session.workload.ignore_eos
    requests = [client.Request(i, [dict(m) for m in prompt.messages], spec.temperature, spec.top_p, budgets[index],
                               seed, ignore_eos, session.request_timeout_s(budgets[index]))
                for i, (index, prompt, _, seed) in enumerate(plan)]
    load = session.profile.load
    # a steady point measures at least load.requests (default: every prompt x repeat), at either kind of level
    count = (load.requests or len(session.prompts) * run.repeats) if load.steady else len(requests)
    limits = session.limits(spec, [requests[i % len(requests)] for i in range(count)])
    call = dict(model=session.model_name, api_key=session.api_key, keep_alive=session.keep_alive, limits=limits)
    warmup = warmup_requests(session, spec, requests, run.warmup * concurrency)
    if warmup:  # not measured; every one failing says the engine does not serve
        failed = [r.error for r in client.run(url, warmup, concurrency=concurrency, **call) if r.error]
        if len(failed) == len(warmup):
            raise client.PointAborted(f"every warm-up request failed ({client.describe_errors(failed)})",
                                      engine_unusable=False)

    prefix = session.engine.metrics_prefix if session.engine is not None else None
    before = counters(url, prefix, session.api_key)
    pids = session.server.engine_pids() if session.server is not None else []
    reset_peak_rss(pids)
    rows: list[dict[str, Any]] = []

    def record(response: client.Response, prompt, repeat: int, seed: int) -> None:
        rows.append(request_row(spec, response, session=session, point_key=point_key, prompt=prompt, repeat=repeat,
                                seed=seed))
        on_request()

    # what the engine holds (KV cache, queue, preemptions) sampled from its /metrics while the requests run, and on
    # GPUs what its processes hold there, how busy the GPUs are and the energy they use (NVML)
    steady: dict[str, Any] = {"lead_in_requests": None, "tail_requests": None, "window_s": None,
                              "prefix_cache_reset": None}
    if load.steady:  # a steady point starts with nothing cached from the points before it (its lead-in warms it)
        steady["prefix_cache_reset"] = reset_prefix_cache(session, url)
    with MetricsSampler(url, prefix=prefix, api_key=session.api_key) as sampler, \
            gpus.watched(session.gpu_uuids(), session.server.engine_pids if session.server else list,
                         claim=session.claim) as gpu:
        if load.steady:
            steady |= steady_point(session, spec, url=url, call=call, record=record)
        elif spec.open_loop:
            arrivals = client.arrival_times(len(requests), request_rate=spec.request_rate,
                                            burstiness=session.profile.load.burstiness,
                                            seed=draw_seed(run.seed, spec, len(requests)))
            for response in client.run_open_loop(url, requests, arrivals, **call):
                record(response, *plan[response.index][1:])
        else:
            # one request at a time: prompt by prompt, so a tune can prune after each; else all at the level's
            # concurrency
            batches = ([[r for r, p in zip(requests, plan) if p[0] == i] for i in range(len(session.prompts))]
                       if concurrency == 1 else [requests])
            for batch in batches:
                for response in client.run(url, batch, concurrency=concurrency, **call):
                    record(response, *plan[response.index][1:])
                if after_prompt is not None and concurrency == 1:
                    after_prompt(rows)
    engine_gone(limits, waited_s=1.0 if any(row["error"] for row in rows) else 0.0)
    check_failures(rows)
    after = counters(url, prefix, session.api_key)
    measured = point_measurements(before, after, rows, peak_mb=peak_rss_mb(pids) if pids else None,
                                  speculates=spec.method != "baseline", load=sampler.summary(),
                                  attached=session.attached)
    return rows, {**measured, **steady, **gpus.window_columns(gpu)}


def reset_prefix_cache(session: "ServerSession", url: str, *, timeout_s: float = 10.0) -> bool | None:
    """Empty the engine's prefix cache (nothing may be running): True once it says so, False where it refused or
    failed; None where it was not tried — an attached server (another's cache is not specbench's to empty) or an engine
    without such an endpoint (llama.cpp)."""
    path = session.engine.prefix_cache_reset if session.engine is not None else None
    if session.attached or path is None:
        return None
    headers = {"Authorization": f"Bearer {session.api_key}"} if session.api_key else {}
    request = urllib.request.Request(url + path, data=b"", method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as http:
            body = http.read().decode("utf-8", errors="replace")
    except (OSError, ValueError):  # refused, timed out, or an HTTP error (404: vLLM launched without its dev mode)
        return False
    try:
        answer = json.loads(body)
    except ValueError:
        return True  # SGLang answers 200 with plain text
    return bool(answer.get("success", True)) if isinstance(answer, dict) else True


def steady_point(session: "ServerSession", spec: PointSpec, *, url: str, call: dict[str, Any],
                 record: Callable[..., None]) -> dict[str, Any]:
    """A point in a steady state ([load] lead_in_s, window_s; backends/server/steady.py): requests taking the prompts
    round and round in a seeded cyclic order (the same for every configuration at the level), at the level's arrival
    times or concurrency; each measured response recorded (`record(response, prompt, repeat, seed)`: a prompt's
    repeat counts its measured requests). What the lead-in and the tail sent, and the window's span, as the point's
    columns."""
    load, run, prompts = session.profile.load, session.profile.run, session.prompts
    at_least = load.requests or len(prompts) * run.repeats  # as measure_point's deadline counts them
    seed = draw_seed(run.seed, spec, at_least)
    order = cyclic_order(len(prompts), seed=seed)
    budgets, ignore_eos = session.workload.max_new_tokens, session.workload.ignore_eos

    def make_request(index: int) -> client.Request:
        prompt = order[index % len(order)]
        return client.Request(index, [dict(m) for m in prompts[prompt].messages], spec.temperature, spec.top_p,
                              budgets[prompt], run.seed + 1000 * prompt + index, ignore_eos,
                              session.request_timeout_s(budgets[prompt]))

    window = Window(lead_in_s=load.lead_in_s, window_s=load.window_s, at_least=at_least)
    arrivals = gamma_arrivals(request_rate=spec.request_rate, burstiness=load.burstiness, seed=seed) \
        if spec.open_loop else None
    result = run_steady(url, make_request, window, arrivals_s=arrivals,
                        concurrency=None if spec.open_loop else spec.concurrency or 1, **call)
    repeats: dict[int, int] = {}
    for response in result.responses:
        prompt = order[response.index % len(order)]
        repeat = repeats[prompt] = repeats.get(prompt, -1) + 1
        record(response, prompts[prompt], repeat, run.seed + 1000 * prompt + response.index)
    return {"lead_in_requests": result.lead_in, "tail_requests": result.tail, "window_s": result.window_s}


def engine_gone(limits: client.Limits, *, waited_s: float) -> None:
    """Fail the point when its engine exited. After failed requests, look for `waited_s`: an engine killed mid-point
    closes its connections a moment before it is seen to have exited."""
    deadline = time.monotonic() + waited_s
    while limits.exited is not None:
        if (gone := limits.exited()) is not None:
            raise client.PointAborted(gone, engine_unusable=True)
        if time.monotonic() >= deadline:
            return
        time.sleep(0.1)


def check_failures(rows: list[dict[str, Any]], *, share: float = 0.5) -> None:
    """A point is measured when at least one request was, and no more than `share` of them failed."""
    errors = [row["error"] for row in rows if row["error"] is not None]
    if errors and (len(errors) == len(rows) or len(errors) > share * len(rows)):
        which = "every request" if len(errors) == len(rows) else f"more than {share:.0%} of the requests"
        raise client.PointAborted(f"{which} failed ({len(errors)} of {len(rows)}: {client.describe_errors(errors)})",
                                  engine_unusable=False)


def counters(url: str, prefix: str | None, api_key: str | None) -> SpecCounters | None:
    """The engine's spec-decode counters from its /metrics; None where it has none, does not answer, or sends text
    that is not Prometheus' (per-response counts are used instead, and the point says so)."""
    if prefix is None:
        return None
    try:
        status, text = asyncio.run(client.get_text(f"{url}/metrics", api_key=api_key))
        return spec_counters(text, prefix=prefix) if status == 200 else None
    except Exception:  # noqa: BLE001 - no /metrics, or unparseable: per-response counts, if any
        return None


def point_measurements(before: SpecCounters | None, after: SpecCounters | None, rows: list[dict[str, Any]], *,
                       peak_mb: float | None, speculates: bool = True, load: LoadSummary | None = None,
                       attached: bool = False) -> dict[str, Any]:
    """The engine's acceptance over the point, and where it came from: its measured requests' own ("requests":
    vLLM's per-request metrics, every answered request with its per-position counts), else its /metrics counters
    (over the whole point: warm-up, lead-in and tail included), else the sum of per-response counts (llama.cpp
    timings; a response that drafted nothing omits them: 0), else nothing —
    never a guess. A speculating launch whose counters did not move drafted nothing (a gamma schedule's 0 at this
    batch size): zeros, from the counters. With `load` (the sampler's), what the engine held over the point:
    KV-cache usage (peak, mean), requests running and waiting (peaks), preemptions, and how many samples say so; on an
    `attached` server, the output tokens it generated beyond those specbench's requests received (other traffic
    shares it). An engine with no spec-decode counters but an accepted-length gauge (SGLang): acceptance from the
    gauge ("gauge": its recent running mean, not this point's own count)."""
    measured: dict[str, Any] = {"server_peak_rss_mb": peak_mb, "acceptance_source": None, "engine_drafts": None,
                                "engine_draft_tokens": None, "engine_accepted_tokens": None,
                                "engine_accepted_per_position": None,
                                **asdict(load if load is not None else summarize_load([]))}
    answered = [row for row in rows if row.get("error") is None]
    if speculates and answered and all(row.get("drafted_per_position") is not None for row in answered):
        # each measured request's own (vLLM's per-request metrics): not the lead-in's, the tail's or the warm-up's
        positions = [sum(column) for column in zip(*(row["accepted_per_position"] for row in answered))]
        measured.update(acceptance_source="requests",
                        engine_drafts=float(sum(row["drafted_per_position"][0] if row["drafted_per_position"] else 0
                                                for row in answered)),
                        engine_draft_tokens=float(sum(row["drafted_tokens"] or 0 for row in answered)),
                        engine_accepted_tokens=float(sum(row["accepted_tokens"] or 0 for row in answered)),
                        engine_accepted_per_position=[float(n) for n in positions] or None)
    elif before is not None and after is not None and (speculates or after.minus(before).draft_tokens > 0):
        diff = after.minus(before)
        measured.update(acceptance_source="metrics", engine_drafts=diff.drafts, engine_draft_tokens=diff.draft_tokens,
                        engine_accepted_tokens=diff.accepted_tokens,
                        engine_accepted_per_position=list(diff.accepted_per_position) or None)
    elif speculates and answered and any(row["drafted_tokens"] is not None for row in answered):
        measured.update(acceptance_source="responses",
                        engine_draft_tokens=float(sum(row["drafted_tokens"] or 0 for row in answered)),
                        engine_accepted_tokens=float(sum(row["accepted_tokens"] or 0 for row in answered)))
    elif speculates and measured["engine_accept_length_gauge"] is not None:
        measured["acceptance_source"] = "gauge"
    generated, sent = measured["engine_generated_tokens"], sum(row["output_tokens"] or 0 for row in answered)
    measured["other_traffic_tokens"] = (max(0.0, generated - sent) if generated - sent > OTHER_TRAFFIC_SLACK * sent + 8
                                        else 0.0) if attached and generated is not None else None
    return measured


OTHER_TRAFFIC_SLACK = 0.05  # an engine's own count may differ from what the responses carried by a few tokens


def request_row(spec: PointSpec, response: client.Response, *, session: "ServerSession", point_key: str, prompt,
                repeat: int, seed: int) -> dict[str, Any]:
    """The raw measurements of one streamed response, in requests.parquet's columns; a failed request keeps which
    request it was, when it was sent and its error, and no figures."""
    scheduled = response.scheduled_s
    row: dict[str, Any] = {
        "point_id": spec.point_id, "point_key": point_key, "request_id": f"{prompt.prompt_id}#{repeat}",
        **prompt_columns(prompt), "repeat": repeat, "seed": seed, "start_ms": response.start_s * 1e3,
        "scheduled_ms": scheduled * 1e3 if scheduled is not None else None,  # open loop: its arrival time
        "send_lateness_ms": (response.start_s - scheduled) * 1e3 if scheduled is not None else None,
        "error": response.error,
    }
    if response.error is not None:
        return {**row, "prompt_tokens": None, "output_tokens": None, "ttft_ms": None, "e2e_ms": None,
                "tokens_per_s": None, "tpot_ms": None, "itl_ms": [], "drafted_tokens": None, "accepted_tokens": None,
                "output_sha": None, "finish_reason": None, "first_content_ms": None, "reasoning_tokens": None,
                **_UNMEASURED}
    usage = response.usage or {}
    output_tokens = usage.get("completion_tokens")
    if output_tokens is None:
        output_tokens = len(session.tokenizer(response.reasoning + response.text, add_special_tokens=False)["input_ids"])
    tokens = _tokens_per_chunk(response)
    ttft_s = response.chunk_times_s[0] if response.chunk_times_s else response.end_s
    # ITL per token: the gap before a chunk for its first token, 0 for the others it carries
    itl = [gap for a, b, n in zip(response.chunk_times_s, response.chunk_times_s[1:], tokens[1:])
           for gap in [(b - a) * 1e3] + [0.0] * (n - 1)]
    timings = response.timings
    drafted = accepted = None
    if timings is not None and spec.method != "baseline":  # llama.cpp omits its counts where nothing was drafted
        drafted, accepted = int(timings.get("draft_n") or 0), int(timings.get("draft_n_accepted") or 0)
    steps = per_request_acceptance(response.spec_decoding) if spec.method != "baseline" else None
    if steps is not None:
        drafted, accepted = steps["drafted_tokens"], steps["accepted_tokens"]
    reasoning_tokens = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    return {
        **row, "prompt_tokens": usage.get("prompt_tokens"), "output_tokens": output_tokens,
        "ttft_ms": ttft_s * 1e3, "e2e_ms": response.end_s * 1e3,
        "tokens_per_s": output_tokens / response.end_s if response.end_s > 0 else None,
        "tpot_ms": (response.end_s - ttft_s) * 1e3 / (output_tokens - 1) if output_tokens > 1 else None,
        "itl_ms": itl, "drafted_tokens": drafted, "accepted_tokens": accepted,
        "output_sha": hashlib.sha256((response.reasoning + response.text).encode()).hexdigest()[:16],
        "finish_reason": response.finish_reason,
        # a reasoning model's answer starts after its reasoning: TTFT counts the first token of either
        "first_content_ms": response.first_content_s * 1e3 if response.first_content_s is not None else None,
        "reasoning_tokens": reasoning_tokens if reasoning_tokens is not None else (0 if not response.reasoning else None),
        **_UNMEASURED,
        **({"accepted_per_position": steps["accepted_per_position"],
            "drafted_per_position": steps["drafted_per_position"]} if steps is not None else {}),
    }


def per_request_acceptance(metrics: dict[str, Any] | None) -> dict[str, Any] | None:
    """One response's acceptance from vLLM's `metrics.speculative_decoding` (--per-request-spec-decode-metrics):
    draft tokens proposed and accepted, and per draft position the verify steps that proposed a token there and
    that accepted it (position i accepted where a step accepted more than i). The per-step arrays (`detailed`) give
    both; the histogram alone (`summary`) gives the accepted ones, and the proposed per position stays unknown
    (None: never guessed). None without the metrics."""
    if not metrics:
        return None
    histogram = [int(n) for n in metrics.get("acceptance_histogram") or ()]
    accepted_steps, drafted_steps = metrics.get("per_step_accepted"), metrics.get("per_step_drafted")
    gamma = max(len(histogram) - 1, 0)
    if accepted_steps is not None and drafted_steps is not None:
        accepted = [sum(1 for a in accepted_steps if a > i) for i in range(gamma)]
        drafted = [sum(1 for d in drafted_steps if d > i) for i in range(gamma)]
    else:
        accepted = [sum(histogram[i + 1:]) for i in range(gamma)]
        drafted = None if sum(histogram) else [0] * gamma  # a request that never drafted proposed nothing anywhere
    return {"drafted_tokens": int(metrics.get("num_draft_tokens") or 0),
            "accepted_tokens": int(metrics.get("num_accepted_draft_tokens") or 0),
            "accepted_per_position": accepted, "drafted_per_position": drafted}


# columns of the in-process backends that a server does not show
_UNMEASURED = {"target_steps": None, "decode_tokens": None, "rejected_steps": None, "accepted_per_position": [],
               "drafted_per_position": None, "draft_ms": None, "verify_ms": None, "peak_memory_growth_mb": None,
               "output_ids": None, "top2_gap": None}


def _tokens_per_chunk(response: client.Response) -> list[int]:
    """Tokens carried by each chunk where the server says (logprobs or token ids); else 1 per chunk, so the
    ITL list holds the measured gaps between chunks rather than a guess at how tokens split among them."""
    if response.chunk_tokens and all(n > 0 for n in response.chunk_tokens):
        return list(response.chunk_tokens)
    return [1] * len(response.chunk_times_s)

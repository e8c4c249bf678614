"""One point on a server: warm-up requests, the engine's counters before, every prompt x repeat at the
point's concurrency, the counters after; one request row per response, with what was seen on the wire."""

from __future__ import annotations

import asyncio
import hashlib
import random
from typing import TYPE_CHECKING, Any

from specbench.backends.base import AfterPrompt, OnRequest
from specbench.backends.server import client
from specbench.backends.server.metrics import SpecCounters, spec_counters
from specbench.backends.server.process import peak_rss_mb, reset_peak_rss
from specbench.results import PointSpec, prompt_columns

if TYPE_CHECKING:
    from specbench.backends.server import ServerSession


def request_plan(session: "ServerSession", spec: PointSpec) -> list[tuple[int, Any, int, int]]:
    """(prompt index, prompt, repeat, seed) per request. Closed loop: every prompt x repeat. At a request rate:
    `load.requests` requests (default: as many), prompts drawn in a seeded order — with replacement when more
    requests than prompts are asked for, a prompt's repeat counting its draws — the same for every point."""
    profile, run, prompts = session.profile, session.profile.run, session.prompts
    if not spec.open_loop:
        return [(index, prompt, repeat, run.seed + 1000 * index + repeat)
                for index, prompt in enumerate(prompts) for repeat in range(run.repeats)]
    count = profile.load.requests or len(prompts) * run.repeats
    rng = random.Random(run.seed)
    drawn = rng.sample(range(len(prompts)), count) if count <= len(prompts) else rng.choices(range(len(prompts)), k=count)
    seen: dict[int, int] = {}
    plan = []
    for index in drawn:
        repeat = seen[index] = seen.get(index, -1) + 1
        plan.append((index, prompts[index], repeat, run.seed + 1000 * index + repeat))
    return plan


def measure_point(session: "ServerSession", spec: PointSpec, *, url: str, point_key: str, on_request: OnRequest,
                  after_prompt: AfterPrompt | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    profile = session.profile
    run = profile.run
    concurrency = spec.concurrency or 1  # at a request rate: warm-up one at a time
    plan = request_plan(session, spec)
    budgets, ignore_eos = session.workload.max_new_tokens, session.workload.ignore_eos
    requests = [client.Request(i, [dict(m) for m in prompt.messages], spec.temperature, spec.top_p,
                               budgets[index], seed, ignore_eos) for i, (index, prompt, _, seed) in enumerate(plan)]
    call = dict(model=session.model_name, api_key=session.api_key)
    warmup = [client.Request(-1 - i, requests[i % len(requests)].messages, spec.temperature, spec.top_p,
                             requests[i % len(requests)].max_tokens, run.seed, ignore_eos)
              for i in range(run.warmup * concurrency)]
    if warmup:
        client.run(url, warmup, concurrency=concurrency, **call)

    prefix = session.engine.metrics_prefix if session.engine is not None else None
    before = _counters(url, prefix, session.api_key)
    pids = session.server.descendants() if session.server is not None else []
    reset_peak_rss(pids)
    rows: list[dict[str, Any]] = []
    if spec.open_loop:
        arrivals = client.arrival_times(len(requests), request_rate=spec.request_rate,
                                        burstiness=profile.load.burstiness, seed=run.seed)
        for response in client.run_open_loop(url, requests, arrivals, **call):
            index, prompt, repeat, seed = plan[response.index]
            rows.append(request_row(spec, response, session=session, point_key=point_key, prompt=prompt,
                                    repeat=repeat, seed=seed, scheduled_s=arrivals[response.index]))
            on_request()
    else:
        # one request at a time: prompt by prompt, so a tune can prune after each; else all at the level's concurrency
        batches = ([[r for r, p in zip(requests, plan) if p[0] == i] for i in range(len(session.prompts))]
                   if concurrency == 1 else [requests])
        for batch in batches:
            for response in client.run(url, batch, concurrency=concurrency, **call):
                index, prompt, repeat, seed = plan[response.index]
                rows.append(request_row(spec, response, session=session, point_key=point_key, prompt=prompt,
                                        repeat=repeat, seed=seed))
                on_request()
            if after_prompt is not None and concurrency == 1:
                after_prompt(rows)
    after = _counters(url, prefix, session.api_key)
    return rows, point_measurements(before, after, rows, peak_mb=peak_rss_mb(pids) if pids else None,
                                    speculates=spec.method != "baseline")


def _counters(url: str, prefix: str | None, api_key: str | None) -> SpecCounters | None:
    if prefix is None:
        return None
    try:
        status, text = asyncio.run(client.get_text(f"{url}/metrics", api_key=api_key))
    except Exception:  # noqa: BLE001 - a server without /metrics: per-response counts, if any
        return None
    return spec_counters(text, prefix=prefix) if status == 200 else None


def point_measurements(before: SpecCounters | None, after: SpecCounters | None, rows: list[dict[str, Any]], *,
                       peak_mb: float | None, speculates: bool = True) -> dict[str, Any]:
    """The engine's acceptance over the point, and where it came from: its /metrics counters, else the sum
    of per-response counts (llama.cpp timings), else nothing — never a guess. A speculating launch whose counters
    did not move drafted nothing (a gamma schedule's 0 at this batch size): zeros, from the counters."""
    measured: dict[str, Any] = {"server_peak_rss_mb": peak_mb, "acceptance_source": None, "engine_drafts": None,
                                "engine_draft_tokens": None, "engine_accepted_tokens": None,
                                "engine_accepted_per_position": None}
    if before is not None and after is not None and (speculates or after.minus(before).draft_tokens > 0):
        diff = after.minus(before)
        measured.update(acceptance_source="metrics", engine_drafts=diff.drafts, engine_draft_tokens=diff.draft_tokens,
                        engine_accepted_tokens=diff.accepted_tokens,
                        engine_accepted_per_position=list(diff.accepted_per_position) or None)
    elif rows and all(r["drafted_tokens"] is not None for r in rows) and sum(r["drafted_tokens"] for r in rows):
        measured.update(acceptance_source="responses",
                        engine_draft_tokens=float(sum(r["drafted_tokens"] for r in rows)),
                        engine_accepted_tokens=float(sum(r["accepted_tokens"] for r in rows)))
    return measured


def request_row(spec: PointSpec, response: client.Response, *, session: "ServerSession", point_key: str, prompt,
                repeat: int, seed: int, scheduled_s: float | None = None) -> dict[str, Any]:
    """The raw measurements of one streamed response, in requests.parquet's columns."""
    usage = response.usage or {}
    output_tokens = usage.get("completion_tokens")
    if output_tokens is None:
        output_tokens = len(session.tokenizer(response.text, add_special_tokens=False)["input_ids"])
    tokens = _tokens_per_chunk(response)
    ttft_s = response.chunk_times_s[0] if response.chunk_times_s else response.end_s
    # ITL per token: the gap before a chunk for its first token, 0 for the others it carries
    itl = [gap for a, b, n in zip(response.chunk_times_s, response.chunk_times_s[1:], tokens[1:])
           for gap in [(b - a) * 1e3] + [0.0] * (n - 1)]
    timings = response.timings or {}
    drafted = timings.get("draft_n")
    accepted = timings.get("draft_n_accepted")
    return {
        "point_id": spec.point_id, "point_key": point_key, "request_id": f"{prompt.prompt_id}#{repeat}",
        **prompt_columns(prompt), "repeat": repeat, "seed": seed,
        "prompt_tokens": usage.get("prompt_tokens"), "output_tokens": output_tokens,
        "ttft_ms": ttft_s * 1e3, "e2e_ms": response.end_s * 1e3,
        "tokens_per_s": output_tokens / response.end_s if response.end_s > 0 else None,
        "tpot_ms": (response.end_s - ttft_s) * 1e3 / (output_tokens - 1) if output_tokens > 1 else None,
        "itl_ms": itl, "target_steps": None, "decode_tokens": None,
        "drafted_tokens": int(drafted) if drafted is not None else None,
        "accepted_tokens": int(accepted) if accepted is not None else None,
        "rejected_steps": None, "accepted_per_position": [], "drafted_per_position": None,
        "draft_ms": None, "verify_ms": None, "peak_memory_growth_mb": None,
        "output_sha": hashlib.sha256(response.text.encode()).hexdigest()[:16],
        "output_ids": None, "top2_gap": None,
        "start_ms": response.start_s * 1e3, "finish_reason": response.finish_reason,
        "scheduled_ms": scheduled_s * 1e3 if scheduled_s is not None else None,  # open loop: its arrival time
    }


def _tokens_per_chunk(response: client.Response) -> list[int]:
    """Tokens carried by each chunk where the server says (logprobs or token ids); else 1 per chunk, so the
    ITL list holds the measured gaps between chunks rather than a guess at how tokens split among them."""
    if response.chunk_tokens and all(n > 0 for n in response.chunk_tokens):
        return list(response.chunk_tokens)
    return [1] * len(response.chunk_times_s)

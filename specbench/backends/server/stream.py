"""One streamed chat completion on the wire: the request body, and what the response showed as it arrived — when
each chunk of tokens came (a chunk may carry several: speculative engines emit a step's accepted tokens together),
which chunks were reasoning and which the answer, and what the server reported (usage, llama.cpp's timings, vLLM's
per-request acceptance)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from specbench.core import progress

DRAIN_S = 1.0  # the most spent reading past [DONE] to keep a connection reusable


class RequestFailed(RuntimeError):
    """The server answered a request with an error."""


@dataclass(frozen=True)
class Request:
    index: int  # position in the point's request list
    messages: list[dict[str, str]]
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    ignore_eos: bool = False  # generate max_tokens whatever the model emits (vLLM, SGLang and llama.cpp take it)
    timeout_s: float = 600.0  # the most it may take, from send to its last byte (server.request_timeout_s)


@dataclass
class Response:
    index: int
    start_s: float  # sent, seconds after the point started
    scheduled_s: float | None = None  # open loop: when it was due (start_s - scheduled_s: the client's lateness)
    chunk_times_s: list[float] = field(default_factory=list)  # each chunk with tokens of any kind, from its send
    chunk_tokens: list[int] = field(default_factory=list)  # tokens per chunk (from the server where it says)
    first_content_s: float | None = None  # the first chunk of the answer itself (after any reasoning)
    text: str = ""  # the answer (delta.content)
    reasoning: str = ""  # a reasoning model's reasoning (delta.reasoning_content / delta.reasoning)
    end_s: float = 0.0  # last byte, from its send
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None  # llama.cpp's per-response timings (draft_n, draft_n_accepted)
    spec_decoding: dict[str, Any] | None = None  # vLLM's per-request acceptance (metrics.speculative_decoding)
    finish_reason: str | None = None
    error: str | None = None  # why it failed; its other figures are then not measurements


def payload(request: Request, *, model: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model, "messages": request.messages, "max_tokens": request.max_tokens, "stream": True,
        "stream_options": {"include_usage": True}, "temperature": request.temperature,
    }
    if request.temperature > 0:  # greedy needs no seed (a seeded request can take an engine's slower sampling path)
        body.update(top_p=request.top_p, seed=request.seed)
    if request.ignore_eos:
        body["ignore_eos"] = True
    return body


async def stream_response(session: aiohttp.ClientSession, url: str, request: Request, response: Response, *,
                          model: str, headers: dict[str, str], on_bytes: Callable[[], None]) -> None:
    """Send `request` and fill `response` as its chunks arrive; `on_bytes` is called whenever the server sends
    anything. Raises RequestFailed on an HTTP or in-stream error."""
    sent = time.perf_counter()
    async with session.post(f"{url}/v1/chat/completions", json=payload(request, model=model), headers=headers) as http:
        on_bytes()
        if http.status != 200:
            raise RequestFailed(f"HTTP {http.status}: {' '.join((await http.text()).split())[:200]}")
        answer, reasoning = [], []
        async for raw in http.content:
            on_bytes()
            progress.mark()
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if event.get("error"):
                raise RequestFailed(f"error in the stream: {' '.join(str(event['error']).split())[:200]}")
            now = time.perf_counter() - sent
            if event.get("usage"):
                response.usage = event["usage"]
            if event.get("timings"):
                response.timings = event["timings"]
            if (event.get("metrics") or {}).get("speculative_decoding"):  # vLLM's final chunk, beside its usage
                response.spec_decoding = event["metrics"]["speculative_decoding"]
            for choice in event.get("choices") or ():
                delta = choice.get("delta") or {}
                content = delta.get("content")
                thought = delta.get("reasoning_content") or delta.get("reasoning")
                if content or thought or delta.get("tool_calls"):  # a token of any kind: TTFT counts from the first
                    response.chunk_times_s.append(now)
                    response.chunk_tokens.append(_tokens_in(choice))
                if content:
                    answer.append(content)
                    if response.first_content_s is None:
                        response.first_content_s = now
                if thought:
                    reasoning.append(thought)
                if choice.get("finish_reason"):
                    response.finish_reason = choice["finish_reason"]
        response.text, response.reasoning = "".join(answer), "".join(reasoning)
        response.end_s = time.perf_counter() - sent
        await _drain(http)


async def _drain(http: aiohttp.ClientResponse) -> None:
    """Read what follows [DONE] (the chunked body's last chunk) so the connection goes back to the pool: a response
    left unread is closed on release, and the next request pays for a new connection. A server that keeps the
    stream open after [DONE] gets a second, then the connection is dropped."""
    if http.content.at_eof():
        return
    try:
        await asyncio.wait_for(http.content.read(), DRAIN_S)
    except (asyncio.TimeoutError, aiohttp.ClientError):
        pass


def _tokens_in(choice: dict[str, Any]) -> int:
    """Tokens a chunk carries: the length of its logprobs content or token ids where the server sends them,
    else 0 (counted from the text later)."""
    logprobs = (choice.get("logprobs") or {}).get("content")
    if logprobs:
        return len(logprobs)
    ids = choice.get("token_ids") or (choice.get("delta") or {}).get("token_ids")
    return len(ids) if ids else 0

"""The load generator: streaming OpenAI-compatible chat completions from one asyncio client, with exactly
`concurrency` requests in flight (closed loop), or sent at scheduled arrival times whatever the server's state
(open loop, `run_open_loop`). Per request it keeps what was observed on the wire: when the request
was sent, when each chunk of tokens arrived (a chunk may carry several tokens: speculative engines emit a
step's accepted tokens together), and what the server reported (usage, timings)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp


class RequestFailed(RuntimeError):
    """The server answered a request with an error, or the connection broke."""


@dataclass(frozen=True)
class Request:
    index: int  # position in the point's request list
    messages: list[dict[str, str]]
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    ignore_eos: bool = False  # generate max_tokens whatever the model emits (vLLM, SGLang and llama.cpp take it)


@dataclass
class Response:
    index: int
    start_s: float  # sent, seconds after the point started
    chunk_times_s: list[float] = field(default_factory=list)  # arrival of each chunk with content, from start
    chunk_tokens: list[int] = field(default_factory=list)  # tokens per chunk (from the server where it says)
    text: str = ""
    end_s: float = 0.0  # last byte, from start
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None  # llama.cpp's per-response timings (draft_n, draft_n_accepted)
    finish_reason: str | None = None


# One connection per request (force_close): llama-server drops kept-alive connections between requests, and
# aiohttp 3.14 then fails the next request on a pooled one ("Can not write request body", measured with 4 in
# flight). The cost, measured on vLLM at concurrency 4: a mean TTFT 13-32 % above vLLM's own kept-alive client's
# (its API server accepts connections on the loop that streams); a retry on a fresh connection was not enough (the
# pool handed out another dropped one), so the fix is left for a pool that checks connections before reuse.


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


async def _one(session: aiohttp.ClientSession, url: str, request: Request, *, model: str, origin: float,
               headers: dict[str, str]) -> Response:
    response = Response(request.index, start_s=time.perf_counter() - origin)
    sent = time.perf_counter()
    async with session.post(f"{url}/v1/chat/completions", json=payload(request, model=model), headers=headers) as http:
        if http.status != 200:
            raise RequestFailed(f"HTTP {http.status} from {url}: {(await http.text())[:200]}")
        pieces = []
        async for raw in http.content:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if event.get("error"):
                raise RequestFailed(f"error from {url}: {str(event['error'])[:200]}")
            now = time.perf_counter() - sent
            if event.get("usage"):
                response.usage = event["usage"]
            if event.get("timings"):
                response.timings = event["timings"]
            for choice in event.get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    pieces.append(content)
                    response.chunk_times_s.append(now)
                    response.chunk_tokens.append(_tokens_in(choice, event))
                if choice.get("finish_reason"):
                    response.finish_reason = choice["finish_reason"]
        response.text = "".join(pieces)
        response.end_s = time.perf_counter() - sent
    return response


def _tokens_in(choice: dict[str, Any], event: dict[str, Any]) -> int:
    """Tokens a chunk carries: the length of its logprobs content or token ids where the server sends them,
    else 0 (counted from the text later)."""
    logprobs = (choice.get("logprobs") or {}).get("content")
    if logprobs:
        return len(logprobs)
    ids = choice.get("token_ids") or (choice.get("delta") or {}).get("token_ids")
    return len(ids) if ids else 0


async def run_requests(url: str, requests: list[Request], *, model: str, concurrency: int,
                       api_key: str | None = None, timeout_s: float = 600.0) -> list[Response]:
    """All `requests`, at most `concurrency` in flight (a new one starts as soon as one finishes). The
    first failure cancels the rest and is raised."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_s)
    queue: asyncio.Queue[Request] = asyncio.Queue()
    for request in requests:
        queue.put_nowait(request)
    responses: list[Response] = []
    origin = time.perf_counter()

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async def worker() -> None:
            while not queue.empty():
                request = queue.get_nowait()
                responses.append(await _one(session, url, request, model=model, origin=origin, headers=headers))

        try:
            await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
        except aiohttp.ClientError as error:
            raise RequestFailed(f"{type(error).__name__} talking to {url}: {error}") from None
    return sorted(responses, key=lambda r: r.index)


async def run_scheduled(url: str, requests: list[Request], arrivals_s: list[float], *, model: str,
                        api_key: str | None = None, timeout_s: float = 600.0) -> list[Response]:
    """Each request sent at its arrival time (seconds from the first), however many are in flight. The
    first failure cancels the rest and is raised. A response's `start_s` is when it was actually sent: the
    gap to its arrival time is the client's own lateness."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    connector = aiohttp.TCPConnector(limit=0, force_close=True)  # open loop: no cap on connections in flight
    timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_s)
    origin = time.perf_counter()

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async def send(request: Request, at_s: float) -> Response:
            await asyncio.sleep(max(0.0, at_s - (time.perf_counter() - origin)))
            return await _one(session, url, request, model=model, origin=origin, headers=headers)

        try:
            responses = await asyncio.gather(*(send(r, at) for r, at in zip(requests, arrivals_s)))
        except aiohttp.ClientError as error:
            raise RequestFailed(f"{type(error).__name__} talking to {url}: {error}") from None
    return sorted(responses, key=lambda r: r.index)


def arrival_times(count: int, *, request_rate: float, burstiness: float, seed: int) -> list[float]:
    """`count` arrival times (seconds, the first at 0) of a seeded renewal process: gamma-distributed gaps of
    shape `burstiness` (1: Poisson), as vLLM's benchmark client draws them, then scaled so that the mean rate
    over the schedule is exactly `request_rate` (a short draw of a Poisson process strays from its rate by
    about 1/sqrt(count); the shape of the gaps is kept). Every point of a level gets the same times."""
    import numpy as np

    if count < 2:
        return [0.0] * count
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (request_rate * burstiness), size=count - 1)
    gaps *= (count - 1) / request_rate / gaps.sum()
    return [0.0, *np.cumsum(gaps).tolist()]


def run_open_loop(url: str, requests: list[Request], arrivals_s: list[float], *, model: str,
                  api_key: str | None = None) -> list[Response]:
    return asyncio.run(run_scheduled(url, requests, arrivals_s, model=model, api_key=api_key))


def run(url: str, requests: list[Request], *, model: str, concurrency: int, api_key: str | None = None) -> list[Response]:
    return asyncio.run(run_requests(url, requests, model=model, concurrency=concurrency, api_key=api_key))


async def get_json(url: str, *, api_key: str | None = None, timeout_s: float = 5.0) -> Any:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async with session.get(url, headers=headers) as http:
            http.raise_for_status()
            return await http.json(content_type=None)


async def get_text(url: str, *, api_key: str | None = None, timeout_s: float = 5.0) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async with session.get(url, headers=headers) as http:
            return http.status, await http.text()

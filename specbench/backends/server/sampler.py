"""What the engine holds while a point is measured: its /metrics read every `interval_s` on a background thread —
a thread, not an asyncio task, because the load generator runs one `asyncio.run` per batch of a point and the
samples must span them all. A sample when the sampler starts (before the first request) and one when it stops
(after the last response) bound the point, so the preemption counter's rise covers all of it; the peaks and the
mean come from the samples between, and the samples themselves are the point's time series (`series_*` columns,
ms from the sample before the first request). Only the few figures of each sample are kept (`EngineLoad`); a sample
that does not answer within `timeout_s` or is not Prometheus text is skipped (and not counted)."""

from __future__ import annotations

import dataclasses
import threading
import time
import urllib.request

from specbench.backends.server.metrics import EngineLoad, LoadSummary, engine_load, summarize_load

INTERVAL_S = 0.5
TIMEOUT_S = 2.0


class MetricsSampler:
    """`with MetricsSampler(url, prefix=..., api_key=...) as sampler:` around the measured requests, then
    `sampler.summary()`. With no prefix (an engine whose metrics are not known) it samples nothing."""

    def __init__(self, url: str, *, prefix: str | None, api_key: str | None, interval_s: float = INTERVAL_S,
                 timeout_s: float = TIMEOUT_S):
        self.url, self.prefix, self.interval_s, self.timeout_s = f"{url}/metrics", prefix, interval_s, timeout_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.before: EngineLoad | None = None
        self.samples: list[EngineLoad] = []  # taken while the requests ran
        self.after: EngineLoad | None = None
        self._started: float | None = None  # time.monotonic() of the first sample: the series' zero
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="metrics-sampler", daemon=True)

    def __enter__(self) -> "MetricsSampler":
        if self.prefix is not None:
            self.before = self._sample()
            self._thread.start()
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            if kind is None:  # a point that failed keeps no figures: no last sample from an engine that may be hung
                self.after = self._sample()

    def summary(self) -> LoadSummary:
        return summarize_load(self.samples, before=self.before, after=self.after)

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            if (load := self._sample()) is not None:
                self.samples.append(load)

    def _sample(self) -> EngineLoad | None:
        taken = time.monotonic()
        if self._started is None:
            self._started = taken
        load = self._read()
        return dataclasses.replace(load, t_ms=(taken - self._started) * 1e3) if load is not None else None

    def _read(self) -> EngineLoad | None:
        request = urllib.request.Request(self.url, headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as http:
                text = http.read().decode("utf-8", errors="replace")
            return engine_load(text, prefix=self.prefix)
        except Exception:  # noqa: BLE001 - refused, timed out, an HTTP error or text that is not Prometheus': skipped
            return None

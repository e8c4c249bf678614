"""Acceptance as the engine counts it: its Prometheus /metrics text read before and after a point, parsed
with prometheus_client's parser, and differenced. vLLM (`vllm:spec_decode_*`) and llama.cpp
(`llamacpp:spec_decode_*`) expose counters of the same shape, with or without the `_total` suffix:
num_drafts, num_draft_tokens, num_accepted_tokens, num_accepted_tokens_per_pos{position}."""

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

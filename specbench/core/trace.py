"""What one generation request did, step by step, and the metrics derived from it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepRecord:
    """One target forward pass after the prefill.

    drafted: tokens the proposer offered, less those after an accepted end-of-sequence token, which lie
    past the end of the output and were never judged (None when the backend cannot tell, e.g. HF
    `generate`); accepted: drafted tokens kept; emitted: tokens appended = accepted + bonus, where the
    bonus (the target's own token: a correction or the token after a fully accepted draft) is 1, or 0 when
    an accepted end-of-sequence token ended the request. Times in seconds; None when not measured.
    """

    drafted: int | None
    accepted: int
    emitted: int
    draft_s: float | None = None
    verify_s: float | None = None


@dataclass(frozen=True)
class Trace:
    """One request. Times are seconds from the request start, read after a device synchronize."""

    prompt_tokens: int
    output_ids: tuple[int, ...]
    ttft_s: float  # prefill (target and draft) and the first token
    token_times_s: tuple[float, ...]  # emission time of every output token
    steps: tuple[StepRecord, ...]  # decode steps; the prefill's first token is not a step
    gamma: int
    peak_memory_growth_bytes: int | None = None
    # [output_tokens] at temperature 0 (else empty): the target's top logit minus its second one in the row
    # that chose each output token; near 0, a low-precision verification may flip the argmax
    top2_gap: tuple[float, ...] = ()
    # a draft with another tokenizer: per decode step, the target's probability mass on the tokens the draft can
    # propose (the shared vocabulary), in the rows that chose the step's tokens (their mean); else empty
    shared_mass: tuple[float, ...] = ()

    @property
    def output_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def e2e_s(self) -> float:
        return self.token_times_s[-1] if self.token_times_s else self.ttft_s

    @property
    def target_steps(self) -> int:
        return len(self.steps)

    @property
    def drafted_tokens(self) -> int | None:
        if any(step.drafted is None for step in self.steps):
            return None
        return sum(step.drafted for step in self.steps)

    @property
    def accepted_tokens(self) -> int:
        return sum(step.accepted for step in self.steps)

    @property
    def rejected_steps(self) -> int | None:
        """Steps that rejected a drafted token (accepted < drafted)."""
        if self.drafted_tokens is None:
            return None
        return sum(1 for step in self.steps if step.accepted < step.drafted)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted draft tokens / drafted tokens; None when nothing was drafted."""
        drafted = self.drafted_tokens
        return self.accepted_tokens / drafted if drafted else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens emitted per target decode step, bonus included (baseline: 1.0)."""
        if not self.steps:
            return None
        return sum(step.emitted for step in self.steps) / len(self.steps)

    @property
    def accepted_length_histogram(self) -> tuple[int, ...]:
        """histogram[n] = number of steps that accepted exactly n drafted tokens, n = 0..gamma."""
        histogram = [0] * (self.gamma + 1)
        for step in self.steps:
            histogram[step.accepted] += 1
        return tuple(histogram)

    @property
    def accepted_per_position(self) -> tuple[int, ...]:
        """accepted_per_position[i] = steps whose drafted token at position i was accepted
        (the histogram's reverse cumulative sum: non-increasing in i)."""
        counts, running = [], 0
        for n in reversed(self.accepted_length_histogram[1:]):
            running += n
            counts.append(running)
        return tuple(reversed(counts))

    @property
    def drafted_per_position(self) -> tuple[int, ...] | None:
        """drafted_per_position[i] = steps that drafted a token at position i."""
        if self.drafted_tokens is None:
            return None
        return tuple(sum(1 for step in self.steps if step.drafted > i) for i in range(self.gamma))


def first_divergence(
    output_ids: tuple[int, ...], reference_ids: tuple[int, ...], *,
    gaps: tuple[float, ...], reference_gaps: tuple[float, ...],
) -> tuple[int, float | None] | None:
    """(position, gap) of the first output token where two greedy runs differ, gap being the smaller of
    their top-2 gaps there (None where neither recorded one); None when the outputs are identical.
    A small gap says the runs parted at a near-tie of the target's logits, not necessarily at a bug."""
    if output_ids == reference_ids:
        return None
    position = next((i for i, (a, b) in enumerate(zip(output_ids, reference_ids)) if a != b),
                    min(len(output_ids), len(reference_ids)))  # one output is a prefix of the other
    recorded = [g[position] for g in (gaps, reference_gaps) if position < len(g)]
    return position, min(recorded) if recorded else None

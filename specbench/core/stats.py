"""Statistics over raw per-request measurements: percentiles, paired bootstrap speedups, the analytic
model of a speculative step, and the Pareto front.

Everything a summary reports is derived here, from the per-request rows; nothing is tracked in parallel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PerPrompt = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # point tokens, s, baseline tokens, s: [P] each


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (linear interpolation), None for no values."""
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def throughput(output_tokens: Sequence[int], e2e_s: Sequence[float]) -> float:
    """Tokens per second over requests run one after another: total tokens / total time."""
    total_s = float(np.sum(e2e_s))
    return float(np.sum(output_tokens)) / total_s if total_s > 0 else float("nan")


# --- paired bootstrap over prompts ----------------------------------------------------------------


def paired_bootstrap_speedup(
    point_tokens: np.ndarray,
    point_s: np.ndarray,
    baseline_tokens: np.ndarray,
    baseline_s: np.ndarray,
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Speedup = throughput(point) / throughput(baseline) on the same prompts, with a percentile
    bootstrap CI that resamples prompts (pairs), keeping each prompt's point and baseline together.

    Inputs are per prompt (repeats already summed): tokens [P] and seconds [P] for each side.
    """
    sides = (point_tokens, point_s, baseline_tokens, baseline_s)
    return _paired_bootstrap(lambda picks: _speedup(sides, picks), sides, n_resamples=n_resamples,
                             confidence=confidence, seed=seed)


def paired_bootstrap_speedup_ratio(
    first: PerPrompt,
    second: PerPrompt,
    *,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(speedup of `first`) / (speedup of `second`) on the same prompts, e.g. one backend's speedup over
    another's; the bootstrap resamples prompts, keeping each prompt's four measurements together.

    Each side is (point tokens, point seconds, baseline tokens, baseline seconds), per prompt [P].
    """
    return _paired_bootstrap(lambda picks: _speedup(first, picks) / _speedup(second, picks), (*first, *second),
                             n_resamples=n_resamples, confidence=confidence, seed=seed)


def _speedup(sides: PerPrompt, picks: np.ndarray) -> np.ndarray:
    """Throughput ratio over the picked prompts: picks [P] -> scalar, or [B, P] -> [B]."""
    point_tokens, point_s, baseline_tokens, baseline_s = (np.asarray(a, dtype=float)[picks] for a in sides)
    return (point_tokens.sum(-1) / point_s.sum(-1)) / (baseline_tokens.sum(-1) / baseline_s.sum(-1))


def _paired_bootstrap(statistic, arrays, *, n_resamples: int, confidence: float,
                      seed: int) -> tuple[float, float, float]:
    """(statistic on all prompts, percentile bootstrap CI) where statistic(picks) takes prompt indices."""
    n = len(arrays[0])
    if n == 0 or any(len(a) != n for a in arrays):
        raise ValueError("paired bootstrap needs the same non-empty set of prompts on both sides")
    picks = np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))  # [B, P]
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(statistic(picks), [tail, 100 - tail])
    return float(statistic(np.arange(n))), float(low), float(high)


# --- the analytic model ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StepModel:
    """What one speculative step drafts and keeps, as measured: per draft position k = 0..gamma - 1,

    drafted_at_least[k] = P(a step drafts at least k + 1 tokens)  (drafted_per_position[k] / steps)
    accepted_through[k] = P(a step accepts drafted tokens 0..k)    (accepted_per_position[k] / steps)

    A draft model drafts gamma tokens every step (drafted_at_least all 1); n-gram lookup drafts fewer, or
    none, when nothing matches. Both are non-increasing in k and accepted_through <= drafted_at_least.
    """

    drafted_at_least: tuple[float, ...]  # [gamma]
    accepted_through: tuple[float, ...]  # [gamma]

    def __post_init__(self):
        drafted, accepted = np.asarray(self.drafted_at_least), np.asarray(self.accepted_through)
        if len(drafted) != len(accepted):
            raise ValueError(f"per-position lists of different lengths: drafted {len(drafted)}, "
                             f"accepted {len(accepted)}")
        if np.any(accepted > drafted + 1e-9) or np.any(drafted > 1 + 1e-9) or np.any(accepted < 0):
            raise ValueError("per-position shares must satisfy 0 <= accepted <= drafted <= 1")

    @classmethod
    def from_counts(cls, *, steps: int, drafted_per_position: Sequence[int],
                    accepted_per_position: Sequence[int]) -> "StepModel":
        """From a point's summed counts (results.request_row): drafted_per_position[k] = steps that drafted
        at least k + 1 tokens, accepted_per_position[k] = steps that accepted at least k + 1."""
        if steps <= 0:
            raise ValueError(f"the model needs at least one step (got {steps})")
        gamma = max(len(drafted_per_position), len(accepted_per_position))
        drafted = np.zeros(gamma)
        drafted[: len(drafted_per_position)] = drafted_per_position
        accepted = np.zeros(gamma)
        accepted[: len(accepted_per_position)] = accepted_per_position
        return cls(tuple(float(d) / steps for d in drafted), tuple(float(a) / steps for a in accepted))

    @classmethod
    def geometric(cls, *, alpha: float, gamma: int) -> "StepModel":
        """Leviathan et al.'s model: gamma tokens drafted every step, each accepted with probability alpha
        given the earlier ones were."""
        return cls((1.0,) * gamma, tuple(alpha ** (k + 1) for k in range(gamma)))

    @property
    def gamma(self) -> int:
        return len(self.drafted_at_least)

    def at_gamma(self, gamma: int, *, greedy: bool = False) -> "StepModel":
        """The same draft at a speculation length gamma <= the measured one, G.

        Sampled: acceptance is a coin per drafted token wherever a step starts, so each step is cut at gamma (it
        drafts min(drafted, gamma) and keeps the same accepted prefix; exact for Leviathan's i.i.d. acceptance).

        Greedy: the output is the same at every gamma and a greedy draft's guesses depend only on the prefix, so a
        measured step that accepted a < G tokens covers a + 1 output positions from which the draft would accept a,
        a - 1, ..., 0 tokens; at gamma that span takes ceil((a + 1) / (gamma + 1)) steps, the first ones accepting
        gamma each and the last the rest. A step that accepted all G covers G + 1 positions and continues into the
        next span when the draft would also have guessed the target's own token after them — not recorded, so with
        the chance a drafted token is accepted after an accepted one (pooled over positions 2..G). Cutting each
        step at gamma instead loses the rest of its span: on two recorded 2-core runs of the embedded model
        (n-gram and int8 self-draft, gamma 1-8 predicted from 8 and 1-4 from 4) it read n-gram's tokens per step up
        to 10 % low, this within 2 %. Drafted: every step of a span drafts gamma tokens, except a step that
        accepted nothing at G: it drafted what such steps did (n-gram lookup: often nothing)."""
        if not 1 <= gamma <= self.gamma:
            raise ValueError(f"gamma {gamma} is outside the measured 1..{self.gamma}")
        if gamma == self.gamma:
            return self
        if not greedy:
            return StepModel(self.drafted_at_least[:gamma], self.accepted_through[:gamma])
        return self._recut(gamma)

    def _recut(self, gamma: int) -> "StepModel":
        top = self.gamma
        through = np.asarray([1.0, *self.accepted_through, 0.0])
        exactly = np.maximum(through[:-1] - through[1:], 0.0)  # [G + 1]: P(a step accepted exactly a)
        after = through[1:-1]  # P(accepted through position k), k = 0..G-1
        pooled = after[1:].sum() / after[:-1].sum() if top > 1 and after[:-1].sum() > 0 else after[0]
        carry = exactly[top] * pooled  # a full span that runs on into the next
        if carry > 1.0 - 1e-6:  # every measured step accepted everything: so would every step at gamma
            return StepModel((1.0,) * gamma, (1.0,) * gamma)
        ending = exactly.copy()
        ending[top] *= 1.0 - pooled  # the last span of a run: [G + 1], sums to 1 - carry
        first = self.drafted_at_least[0]
        nothing = (max(first - self.accepted_through[0], 0.0) * np.asarray(self.drafted_at_least[:gamma]) / first
                   if first > 0 else np.zeros(gamma))  # what a step that accepts nothing drafts
        drafted, accepted, steps = np.zeros(gamma), np.zeros(gamma), 0.0
        length = np.arange(top + 1) + 1  # positions a span of a accepted covers
        for merged in range(100_000):  # runs of `merged` full spans and one ending span, P = (1 - carry) carry^merged
            weight = carry**merged
            if weight < 1e-9:
                break
            positions = (top + 1) * merged + length
            spans = -(-positions // (gamma + 1))
            rest = positions - 1 - (spans - 1) * (gamma + 1)  # what the last step of the run accepts
            shares = weight * ending
            steps += float((shares * spans).sum())
            accepted += float((shares * (spans - 1)).sum())  # a run's steps but its last accept gamma
            for kept, share in zip(rest, shares):
                accepted[:kept] += share
            # every step drafts gamma, but a step that accepted nothing at G drafts what those did
            drafted += float((shares * spans).sum())
            if merged == 0 and exactly[0] > 0:
                drafted += shares[0] * (nothing / exactly[0] - 1.0)
        return StepModel(tuple(np.minimum(drafted / steps, 1.0)), tuple(np.minimum(accepted / steps, 1.0)))

    def drafted_share(self) -> tuple[float, ...]:
        """[gamma + 1]: P(a step drafts exactly k tokens), k = 0..gamma."""
        at_least = [1.0, *self.drafted_at_least, 0.0]
        return tuple(max(at_least[k] - at_least[k + 1], 0.0) for k in range(self.gamma + 1))

    def acceptance_given_drafted(self) -> tuple[float, ...]:
        """[gamma]: P(drafted tokens 0..k all accepted | the step drafted at least k + 1); 0 where no
        step drafted that far."""
        return tuple(a / d if d > 0 else 0.0 for a, d in zip(self.accepted_through, self.drafted_at_least))

    def tokens_per_step(self) -> float:
        """E[tokens emitted per step] = 1 (the target's own token) + E[accepted drafted tokens]."""
        return 1.0 + sum(self.accepted_through)

    def drafted_per_step(self) -> float:
        """E[drafted tokens per step]."""
        return sum(self.drafted_at_least)

    def verify_ms(self, verify_ms_by_tokens: Sequence[float]) -> float:
        """E[time of one verification] from the time of a forward pass of k tokens (index k - 1,
        k = 1..gamma + 1): a step that drafted k tokens verifies k + 1."""
        if len(verify_ms_by_tokens) < self.gamma + 1:
            raise ValueError(f"need verify times for 1..{self.gamma + 1} tokens (got {len(verify_ms_by_tokens)})")
        return float(sum(p * verify_ms_by_tokens[k] for k, p in enumerate(self.drafted_share())))


@dataclass(frozen=True)
class Prediction:
    """The analytic speedup (Leviathan et al. 2023, with measured drafting and costs).

    Per step: E[tokens per step] over the step's expected cost relative to one autoregressive target step,
    step_ms = draft_ms_per_token * E[drafted tokens per step] + verify_ms_per_step (the expected time of
    verifying a step's drafted tokens plus one). Per request, when its prefill is given: a request is its
    prefill (TTFT: target and draft prefill and the first token) and then `decode_tokens` tokens at that
    rate, against the baseline's prefill and one token per target step."""

    model: StepModel
    draft_ms_per_token: float
    verify_ms_per_step: float
    target_ms_per_token: float  # the baseline's time per step (one token)
    decode_tokens: float = 0.0  # per request: output tokens after the prefill's first one
    ttft_ms: float = 0.0  # per request
    baseline_ttft_ms: float = 0.0  # per request

    @property
    def tokens_per_step(self) -> float:
        return self.model.tokens_per_step()

    @property
    def step_ms(self) -> float:
        return self.draft_ms_per_token * self.model.drafted_per_step() + self.verify_ms_per_step

    @property
    def decode_speedup(self) -> float:
        """E[tokens per step] / (step_ms / target_ms_per_token): the speedup of the decode steps alone."""
        return self.tokens_per_step / (self.step_ms / self.target_ms_per_token)

    @property
    def speedup(self) -> float:
        """(baseline TTFT + n * target ms) / (TTFT + n * step ms / E[tokens per step]) for n decode tokens;
        the decode speedup when no prefill is given."""
        n = self.decode_tokens
        if n <= 0 or (self.ttft_ms == 0 and self.baseline_ttft_ms == 0):
            return self.decode_speedup
        return (self.baseline_ttft_ms + n * self.target_ms_per_token) / (
            self.ttft_ms + n * self.step_ms / self.tokens_per_step)


def expected_tokens_per_step(alpha: float, gamma: float) -> float:
    """E[tokens emitted per target step] = (1 - alpha^(gamma+1)) / (1 - alpha) (Leviathan et al. 2023):
    gamma tokens drafted every step, each accepted with probability alpha."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(
    *, alpha: float, gamma: int, draft_s_per_token: float, verify_s: float, target_s_per_token: float
) -> float:
    """Leviathan et al.'s closed form: gamma tokens drafted every step, per-token acceptance alpha, the
    verify term the measured time of verifying gamma + 1 tokens (any one time unit throughout). It
    overshoots for drafts that draft fewer tokens than gamma (n-grams): `Prediction` uses what was drafted."""
    return Prediction(StepModel.geometric(alpha=alpha, gamma=gamma), draft_ms_per_token=draft_s_per_token,
                      verify_ms_per_step=verify_s, target_ms_per_token=target_s_per_token).speedup


# --- Pareto front -----------------------------------------------------------------------------------


def pareto_mask(maximize: Sequence[float], minimize: Sequence[float]) -> np.ndarray:
    """[N] bool: True where no other point is at least as good on both (maximize higher, minimize lower)
    and strictly better on one. Identical points are all on the front; a point with a NaN is never on it
    and beats nothing."""
    high = np.asarray(maximize, dtype=float)  # [N]
    low = np.asarray(minimize, dtype=float)  # [N]
    if high.shape != low.shape or high.ndim != 1:
        raise ValueError(f"pareto_mask needs two 1-d arrays of one length (got {high.shape} and {low.shape})")
    valid = ~(np.isnan(high) | np.isnan(low))
    high, low = np.where(valid, high, -np.inf), np.where(valid, low, np.inf)
    # beats[j, i]: point j dominates point i
    at_least = (high[:, None] >= high[None, :]) & (low[:, None] <= low[None, :])
    strictly = (high[:, None] > high[None, :]) | (low[:, None] < low[None, :])
    beats = at_least & strictly & valid[:, None]
    return valid & ~beats.any(axis=0)

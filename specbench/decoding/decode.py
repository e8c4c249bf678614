"""The native decoder: speculative decoding of one request, every step measured."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from specbench.decoding.devices import Clock, PeakMemory
from specbench.decoding import kv
from specbench.decoding.proposers import BaselineProposer, Proposer
from specbench.decoding.sampling import Sampler, conditional_rates, top2_gap, verify_greedy, verify_imposed, verify_sampling
from specbench.core.trace import StepRecord, Trace


@dataclass(frozen=True)
class StepState:
    """Handed to `on_step` after every step (for tests and debugging)."""

    sequence_length: int  # prompt + output tokens
    target_cache_length: int  # cached positions: every token but the newest, which the next step feeds


def generate(
    target: torch.nn.Module | kv.CachedModel,
    proposer: Proposer,
    prompt_ids: list[int],
    *,
    gamma: int,
    temperature: float,
    top_p: float = 1.0,
    max_new_tokens: int,
    seed: int = 0,
    eos_token_ids: Collection[int] = (),
    on_step: Callable[[StepState], None] | None = None,
    imposed_acceptance: tuple[float, ...] | None = None,
) -> Trace:
    """Generate up to max_new_tokens after prompt_ids; the output is distributed exactly as the target's
    (token-for-token identical to autoregressive decoding at temperature 0). A plain module decodes on a
    DynamicCache; a `static.StaticModel` on its static cache with compiled steps. With `imposed_acceptance`
    (per-position unconditional rates, one per position up to gamma) a step keeps its drafted tokens per those
    rates instead of verifying them (an acceptance what-if: the passes are real and timed, the output is not the
    target's)."""
    if gamma < 1 or max_new_tokens < 1 or not prompt_ids:
        raise ValueError("need gamma >= 1, max_new_tokens >= 1 and a non-empty prompt")
    if imposed_acceptance is not None and len(imposed_acceptance) < gamma:
        raise ValueError(f"imposed acceptance gives {len(imposed_acceptance)} positions, gamma {gamma} needs {gamma}")
    conditional = conditional_rates(tuple(imposed_acceptance)) if imposed_acceptance is not None else None
    target = kv.as_cached(target)
    device = next(target.model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    sampler = Sampler(temperature=temperature, top_p=top_p, generator=generator)
    stop = set(eos_token_ids)
    max_length = len(prompt_ids) + max_new_tokens

    with torch.inference_mode():
        memory = PeakMemory(device)
        memory.start()
        clock = Clock(device)
        # the baseline never rolls its cache back
        target.begin(max_length, rolls_back=not isinstance(proposer, BaselineProposer))
        proposer.prefill(prompt_ids, max_length=max_length)
        logits = target.prefill(torch.tensor([prompt_ids], device=device))  # [V]
        _check_logits(logits, "prefill")
        first = int(logits.argmax() if sampler.greedy else sampler.sample(sampler.probs(logits)))
        gaps = [top2_gap(logits).view(1)] if sampler.greedy else []  # on the device until the request ends
        shared = proposer.shared_target_ids() if hasattr(proposer, "shared_target_ids") else None
        masses: list[torch.Tensor] = []  # the target's mass on the shared vocabulary, per step (on the device)
        sequence = [*prompt_ids, first]
        times = [clock.now()]
        steps: list[StepRecord] = []

        while len(sequence) - len(prompt_ids) < max_new_tokens and sequence[-1] not in stop:
            room = max_new_tokens - (len(sequence) - len(prompt_ids)) - 1  # leave room for the bonus token
            started = clock.now()
            proposal = proposer.propose(sequence, min(gamma, room), sampler) if room > 0 else None
            drafted = proposal.tokens if proposal is not None else torch.empty(0, dtype=torch.long, device=device)
            drafted_at = clock.now()

            step_input = torch.cat([torch.tensor([sequence[-1]], device=device), drafted]).view(1, -1)
            logits = target.forward(step_input)  # [k+1, V]
            _check_logits(logits, f"step {len(steps) + 1}")
            if conditional is not None:
                accepted, token = verify_imposed(logits if sampler.greedy else sampler.probs(logits), drafted,
                                                 conditional, greedy=sampler.greedy, generator=generator)
            elif sampler.greedy:
                accepted, token = verify_greedy(logits, drafted)
            else:
                draft_probs = proposal.probs if proposal is not None else None
                accepted, token = verify_sampling(sampler.probs(logits), drafted, draft_probs, generator=generator)
            new_tokens = [*drafted[:accepted].tolist(), token]
            target.crop(len(sequence) + accepted)  # the new token is fed next step
            proposer.rollback(len(sequence) + accepted)

            new_tokens, accepted = _stop_at_eos(new_tokens, accepted, stop)
            # an accepted EOS ends the step without a bonus; the drafts after it lie past the output's end,
            # were never judged, and do not count as drafted
            drafted_count = accepted if len(new_tokens) == accepted else len(drafted)
            if sampler.greedy:
                gaps.append(top2_gap(logits)[: len(new_tokens)])  # row i chose new token i
            sequence.extend(new_tokens)
            verified_at = clock.now()
            if shared is not None:  # after the step's clock: what it costs is not the step's
                rows = logits[: len(new_tokens)].float()
                masses.append((rows.softmax(-1) if sampler.greedy else sampler.probs(rows))[:, shared].sum(-1).mean())
            times.extend([verified_at] * len(new_tokens))
            steps.append(StepRecord(
                drafted=drafted_count, accepted=accepted, emitted=len(new_tokens),
                draft_s=drafted_at - started, verify_s=verified_at - drafted_at,
            ))
            if on_step is not None:
                on_step(StepState(len(sequence), target.length))

    return Trace(
        prompt_tokens=len(prompt_ids),
        output_ids=tuple(sequence[len(prompt_ids):]),
        ttft_s=times[0],
        token_times_s=tuple(times),
        steps=tuple(steps),
        gamma=gamma,
        peak_memory_growth_bytes=memory.growth_bytes(),
        top2_gap=tuple(torch.cat(gaps).tolist()) if gaps else (),
        shared_mass=tuple(torch.stack(masses).tolist()) if masses else (),
    )


def _check_logits(logits: torch.Tensor, where: str) -> None:
    # max propagates NaN: one vectorised reduction to a scalar, not an isnan mask over all [T, V] logits
    if logits.amax().isnan():
        raise FloatingPointError(f"the target produced NaN logits at the {where} (try dtype = \"float32\")")


def _stop_at_eos(new_tokens: list[int], accepted: int, stop: set[int]) -> tuple[list[int], int]:
    """Cut the step's tokens after the first end-of-sequence token; an accepted drafted EOS ends the
    step without a bonus token."""
    for i, token in enumerate(new_tokens):
        if token in stop:
            return new_tokens[: i + 1], min(accepted, i + 1)
    return new_tokens, accepted

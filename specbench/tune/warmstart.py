"""The analytic warm start: one calibration point per draft at the largest gamma measures how many tokens
each step drafted and accepted at each draft position and what drafting and verifying cost; from these
the speedup of every smaller gamma is predicted (`stats.StepModel`), and the best predictions are tried
first.

At a smaller gamma' a step drafts min(drafted, gamma') tokens and keeps the same accepted prefix, so
E[tokens per step] = 1 + sum_{k<gamma'} P(drafted tokens 0..k accepted), which is Leviathan et al.'s
(1 - a^(g+1)) / (1 - a) when every step drafts gamma tokens and acceptance is geometric. The step's cost
is the draft time of the tokens drafted plus the time of verifying them and the bonus token, relative to
the baseline's time per token; a request adds its prefill (TTFT: the target's and the draft's, the same
at every gamma) to its decode steps. The verify time of k tokens is the baseline's one-token step times
the ratio a timing of the target's forward pass at k = 1..g_max + 1 measured (specbench.decoding.costs: not
linear in k on a CPU), weighted by how many tokens the draft proposed per step (n-grams often propose
fewer than gamma, or none). Without that timing (a replay) it is interpolated linearly in gamma between
the baseline's one-token step and the calibration's measured step.

Some backends measure neither (`unavailable_with`): a server's rows hold no verify time and no steps, and
its forward pass cannot be timed from outside; transformers' generate() does not report what it drafted.
There is no warm start then, rather than a prediction from numbers that were never measured.
"""

from __future__ import annotations

from specbench.extrapolate import Calibration, calibrate, predict, predicted_speedup, verify_ms

__all__ = ["Calibration", "UNAVAILABLE", "calibrate", "predict", "predicted_speedup", "unavailable_with", "verify_ms"]


UNAVAILABLE = {  # backend -> why its measurements give no warm start
    "server": "not available with the server backend (a server's forward pass cannot be timed from outside)",
    "hf": "not available with the hf backend (transformers' generate() does not report what it drafted per step)",
}


def unavailable_with(backend: str) -> str | None:
    """Why the analytic warm start cannot be computed from `backend`'s measurements, or None when it can."""
    return UNAVAILABLE.get(backend)

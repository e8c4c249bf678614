"""The analytic warm start: one calibration point per draft at the largest gamma measures how many tokens
each step drafted and accepted at each draft position and what drafting and verifying cost; from these
the speedup of every smaller gamma is predicted (`stats.StepModel`), and the best predictions are tried
first.

How a smaller gamma is predicted from the calibration (steps, acceptance per position, draft and verify costs):
specbench.core.predictions, which `specbench run` also uses for each point's max_gamma_predicted_speedup.

Some backends measure neither (`unavailable_with`): a server's rows hold no verify time and no steps, and
its forward pass cannot be timed from outside; transformers' generate() does not report what it drafted.
There is no warm start then, rather than a prediction from numbers that were never measured.
"""

from __future__ import annotations

from specbench.core.predictions import Calibration, calibrate, predict, predicted_speedup, verify_ms

__all__ = ["Calibration", "UNAVAILABLE", "calibrate", "predict", "predicted_speedup", "unavailable_with", "verify_ms"]


UNAVAILABLE = {  # backend -> why its measurements give no warm start
    "server": "not available with the server backend (a server's forward pass cannot be timed from outside)",
    "hf": "not available with the hf backend (transformers' generate() does not report what it drafted per step)",
}


def unavailable_with(backend: str) -> str | None:
    """Why the analytic warm start cannot be computed from `backend`'s measurements, or None when it can."""
    return UNAVAILABLE.get(backend)

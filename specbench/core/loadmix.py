"""Load levels and the load mix: a profile's closed-loop concurrency levels and open-loop request rates, and the
share of each in the traffic ("1:0.5,4:0.3,r0.5:0.2"), which `specbench tune` weighs the levels by."""

from __future__ import annotations

import re
from collections.abc import Sequence

Level = tuple[int | None, float | None]  # (concurrency, None) or (None, request rate)


def levels_of(concurrency: Sequence[int], request_rate: Sequence[float]) -> list[Level]:
    """The closed-loop concurrency levels, then the open-loop rates."""
    return [(c, None) for c in concurrency] + [(None, r) for r in request_rate]


def parse_load_mix(text: str, levels: list[Level]) -> dict[Level, float]:
    """{level: weight} of "LEVEL:WEIGHT,..." (concurrency as 4 or c4, a request rate as r0.5); ValueError with a
    one-line message that names the part in the wrong."""
    known = ", ".join(f"r{r:g}" if r is not None else str(c) for c, r in levels)
    weights: dict[Level, float] = {}
    for part in text.split(","):
        name = part.strip().partition(":")[0]
        match = re.fullmatch(r"\s*(?:c?(\d+)|r(\d+(?:\.\d*)?|\.\d+))\s*:\s*(\d+(?:\.\d*)?|\.\d+)\s*", part)
        if match is None:
            raise ValueError(f"{part.strip()!r} is not LEVEL:WEIGHT (concurrency as 4, a request rate as r0.5; "
                             "e.g. \"1:0.5,4:0.3,r0.5:0.2\")")
        level = (int(match[1]), None) if match[1] is not None else (None, float(match[2]))
        if level not in levels:
            raise ValueError(f"{name} is not a load level of the profile (its levels: {known})")
        if level in weights:
            raise ValueError(f"{name} is named twice")
        if float(match[3]) <= 0:
            raise ValueError(f"the weight of {name} must be > 0 (leave a level out to give it none)")
        weights[level] = float(match[3])
    return weights

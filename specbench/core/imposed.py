"""Imposed acceptance, the currency of acceptance what-ifs: per-position *unconditional* rates, r_i = P(drafted
positions 0..i all accepted), non-increasing, one per position up to gamma — the same definition as a measured
point's accepted_per_position / target_steps, and as vLLM's `synthetic_acceptance_rates`. A profile gives either
such a list or a mean accepted length (tokens per target pass, bonus included), which becomes geometric rates
alpha, alpha^2, ... at each gamma (alpha solving 1 + alpha + ... + alpha^gamma = length)."""

from __future__ import annotations

from collections.abc import Sequence

from specbench.core.stats import expected_tokens_per_step

Entry = tuple[float, ...] | float | str  # a list of rates, a mean accepted length, or MEASURED
MEASURED = "measured"  # an entry that runs the draft with its own acceptance, verified as always, beside the what-ifs


def check_entry(value) -> Entry:
    """One entry of a draft's `acceptance` as given; ValueError (one line) says what is wrong."""
    if isinstance(value, (list, tuple)):
        rates = tuple(value)
        if not rates or not all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in rates):
            raise ValueError(f"a list of rates must hold numbers, one per position (got {list(value)})")
        if any(not 0.0 <= r <= 1.0 for r in rates):
            raise ValueError(f"rates must lie in [0, 1] (got {list(rates)})")
        if any(b > a for a, b in zip(rates, rates[1:])):
            raise ValueError(f"rates must not increase with position: each is P(positions 0..i all accepted), "
                             f"which can only fall (got {list(rates)})")
        return tuple(float(r) for r in rates)
    if value == MEASURED:
        return MEASURED
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 1.0:
            raise ValueError(f"a mean accepted length counts the bonus token, so it is >= 1 (got {value})")
        return float(value)
    raise ValueError(f"each entry is a list of per-position rates ([0.8, 0.6, 0.4]), a mean accepted length (2.2), "
                     f'or "{MEASURED}" (the draft\'s own acceptance, verified) (got {value!r})')


def check_entries(values: Sequence) -> tuple[Entry, ...]:
    if not values:
        raise ValueError("give at least one acceptance (a list of per-position rates, or a mean accepted length)")
    entries = []
    for index, value in enumerate(values):
        try:
            entries.append(check_entry(value))
        except ValueError as error:
            raise ValueError(f"entry {index}: {error}") from None
    if len(set(entries)) != len(entries):
        raise ValueError("the same acceptance is given twice (give each once)")
    return tuple(entries)


def entry_problem(entry: Entry, gamma: int, *, largest: int) -> str | None:
    """Why `entry` cannot be imposed at `gamma` of a draft swept up to gamma `largest` (None: it can)."""
    if entry == MEASURED:
        return None
    if isinstance(entry, tuple):
        if len(entry) != largest:
            return (f"gives {len(entry)} per-position rates, the draft's largest gamma {largest} drafts {largest} "
                    f"positions (give one rate per position up to it; smaller gammas take the first ones)")
        return None
    if entry > gamma + 1:
        return f"mean accepted length {entry:g} is more than gamma {gamma} can reach ({gamma + 1}: every token and the bonus)"
    return None


def rates_at(entry: Entry, gamma: int) -> tuple[float, ...]:
    """The unconditional rates imposed at `gamma`: a list's first gamma rates (a smaller gamma keeps the same
    prefix, as a real draft does), or a length's geometric rates."""
    if isinstance(entry, tuple):
        return entry[:gamma]
    alpha = geometric_alpha(entry, gamma)
    return tuple(round(alpha ** (i + 1), 6) for i in range(gamma))


def geometric_alpha(length: float, gamma: int) -> float:
    """The per-token acceptance alpha at which a draft that always drafts gamma tokens and accepts each with
    probability alpha (until the first rejection) averages `length` tokens per target pass: solves
    1 + alpha + ... + alpha^gamma = length (bisection; the left side increases in alpha)."""
    target = min(max(length, 1.0), gamma + 1.0)
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if expected_tokens_per_step(mid, gamma) < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def as_text(rates: Sequence[float]) -> str:
    """How a point stores its imposed rates: "0.8,0.6,0.4"."""
    return ",".join(f"{r:.6g}" for r in rates)


def imposed_entries(entries: Sequence[Entry]) -> list[tuple[int | None, Entry | None]]:
    """(k, entry) per point a draft's `acceptance` runs at each gamma: k counts the imposed entries from 1 (the
    point id's -syn<k>); MEASURED is the draft's own point (None, None)."""
    found, k = [], 0
    for entry in entries:
        if entry == MEASURED:
            found.append((None, None))
        else:
            k += 1
            found.append((k, entry))
    return found


def kept_mismatch(rates: Sequence[float], accepted: Sequence[int], drafted: Sequence[int], *,
                  sds: float = 4.0) -> str | None:
    """Whether a point kept what was imposed: per position, the steps that kept positions 0..i over those that drafted
    position i, against the imposed rate (binomial noise: `sds` standard deviations, and 0.02 for the steps an
    end-of-sequence cut short). None where it did, or nothing was drafted; else what the engine kept instead."""
    wrong = []
    for position, (rate, kept, steps) in enumerate(zip(rates, accepted, drafted), start=1):
        if not steps:
            continue
        share = kept / steps
        if abs(share - rate) > sds * (rate * (1 - rate) / steps) ** 0.5 + 0.02:
            wrong.append(f"{share:.2f} at position {position} where {rate:g} was imposed ({steps} steps)")
    return ("kept " + ", ".join(wrong) + ": the engine did not impose the acceptance asked") if wrong else None

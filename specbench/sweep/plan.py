"""Which points a profile sweeps, and in which order."""

from __future__ import annotations

from collections.abc import Callable, Hashable

from specbench.core import imposed
from specbench.engines import schedule_text
from specbench.core.loadmix import levels_of
from specbench.profile import Profile
from specbench.core.results import PointSpec, point_id


def temperature_groups(profile: Profile) -> list[tuple[float, float]]:
    """(temperature, top_p) pairs, top_p outer; greedy ignores top_p, so temperature 0 appears once, with top_p 1."""
    groups = [(t, 1.0 if t == 0 else p) for p in profile.sweep.top_p for t in profile.sweep.temperature]
    return list(dict.fromkeys(groups))


def load_levels(profile: Profile) -> list[tuple[int | None, float | None]]:
    """(concurrency, request_rate) per load level: the closed-loop concurrency levels, then the open-loop rates."""
    return levels_of(profile.sweep.concurrency, profile.sweep.request_rate)


def plan_points(profile: Profile, *, launch_key: Callable[[PointSpec], Hashable] | None = None) -> list[PointSpec]:
    """Per (temperature, top_p) and load level: the baseline first, then every draft x its gammas (its own `gamma`, else
    the sweep's; a draft with a gamma per batch size once, at its largest gamma), and a draft with imposed acceptances
    ([[drafts]] acceptance: a what-if) once per acceptance at each gamma. With a backend's `launch_key`,
    points that need the same launch are moved together (stable, in order of first appearance), so that each
    launch happens once."""
    points: list[PointSpec] = []
    for temperature, top_p in temperature_groups(profile):
        for concurrency, request_rate in load_levels(profile):
            points.append(PointSpec.baseline(temperature, top_p, concurrency=concurrency, request_rate=request_rate))
            for draft in profile.drafts:
                schedule = schedule_text(draft.gamma_schedule) if draft.gamma_schedule else None
                for gamma in profile.gammas(draft):
                    entries = imposed.imposed_entries(draft.acceptance) if draft.acceptance else [(None, None)]
                    for index, entry in entries:
                        points.append(PointSpec(
                            point_id=point_id(draft.name, gamma, temperature, top_p, concurrency=concurrency,
                                              request_rate=request_rate, scheduled=schedule is not None,
                                              synthetic=index),
                            method=draft.method, draft=draft.name, gamma=gamma, temperature=temperature, top_p=top_p,
                            draft_model=draft.model, draft_quantize=draft.quantize,
                            ngram_min=draft.ngram_min if draft.method == "ngram" else None,
                            ngram_max=draft.ngram_max if draft.method == "ngram" else None,
                            concurrency=concurrency, request_rate=request_rate, gamma_schedule=schedule,
                            imposed_acceptance=None if entry is None else imposed.as_text(imposed.rates_at(entry, gamma)),
                        ))
    return points if launch_key is None else order_by_launch(points, launch_key)


def order_by_launch(points: list[PointSpec], launch_key: Callable[[PointSpec], Hashable]) -> list[PointSpec]:
    first_seen: dict[Hashable, int] = {}
    for point in points:
        first_seen.setdefault(launch_key(point), len(first_seen))
    return sorted(points, key=lambda point: first_seen[launch_key(point)])  # sorted() is stable

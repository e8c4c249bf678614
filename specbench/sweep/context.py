"""A run's context: the profile, the backend session that runs its points, and the keys that tell whether
recorded measurements can be reused."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from specbench.backends import Backend, Observer, Session, get_backend
from specbench.profile import Profile
from specbench.core.results import PointSpec, baseline_point_id, stable_hash
from specbench.workloads.prompts import workload_fingerprint


@dataclass
class RunContext:
    profile: Profile
    backend: Backend
    session: Session
    run_key: str  # the target, workload and run settings: a folder holds measurements of one run key
    _verify_ms_by_tokens: tuple[float, ...] | None = field(default=None, init=False, repr=False)

    def verify_ms_by_tokens(self) -> tuple[float, ...]:
        """The target's forward pass timed at k = 1..the largest gamma + 1 tokens, once per run (a few seconds, before
        the first point): the verify costs with which each point's draft at its largest gamma predicts the point's
        speedup. Empty where the backend cannot time it (hf, server) or nothing is drafted."""
        if self._verify_ms_by_tokens is None:
            needed = self._verify_tokens_needed()
            self._verify_ms_by_tokens = tuple(self.session.verify_costs(needed)) if needed else ()
        return self._verify_ms_by_tokens

    def reuse_verify_ms_by_tokens(self, recorded: list[float] | None) -> None:
        """Take the timing an earlier run of this folder recorded (a resumed run's predictions stay as they were),
        where it covers this run's largest gamma."""
        needed = self._verify_tokens_needed()
        if needed and recorded and len(recorded) >= needed:
            self._verify_ms_by_tokens = tuple(float(v) for v in recorded[:needed])

    def _verify_tokens_needed(self) -> int:
        gammas = self.profile.all_gammas()
        return max(gammas) + 1 if gammas and self.profile.backend == "native" else 0

    def slo_limits(self, requests: pd.DataFrame | None) -> dict[str, float]:
        """The [slo] limits in milliseconds: a relative one ("2x serial") resolved against the baseline's requests one
        at a time (its point at concurrency 1 at the sweep's first temperature and top_p) among `requests` — the
        files' rows. {} while that point is not measured: no request is judged against half an SLO."""
        slo = self.profile.slo
        if not slo.relative():
            return slo.limits()
        return slo.resolved(self.serial_baseline(requests)) or {}

    def serial_baseline(self, requests: pd.DataFrame | None) -> pd.DataFrame | None:
        """The answered requests of the point relative SLO limits are resolved against, among `requests`."""
        if requests is None or not len(requests) or "point_id" not in requests:
            return None
        sweep = self.profile.sweep
        point_id = baseline_point_id(sweep.temperature[0], sweep.top_p[0], concurrency=1)
        rows = requests[requests["point_id"] == point_id]
        if "error" in rows:
            rows = rows[rows["error"].isna()]
        return rows if len(rows) else None

    def point_key(self, spec: PointSpec) -> str:
        """What makes a point's measurements reusable: the run's configuration, the point, its draft's identity; at
        a request rate, the shape of its arrivals and how they are drawn (per level since draws version 2); in a
        steady state, its lead-in and window (as the session sends them: a capacity probe's are its search's)."""
        # a server session's profile is what it sends: during a capacity probe, the search's lead-in and window
        load = (self.session.profile if self.profile.backend == "server" else self.profile).load
        sent = {"burstiness": load.burstiness, "draws": 2} if spec.open_loop else {}
        if load.steady:
            sent |= {"lead_in_s": load.lead_in_s, "window_s": load.window_s}
        return stable_hash({"run": self.run_key, "point": spec.identity(),
                            "draft_identity": self.session.draft_identity(spec), **sent})

    def point_context(self, spec: PointSpec) -> dict[str, Any]:
        """The point's constant columns in points.parquet."""
        return {**self.session.point_context(spec), "point_key": self.point_key(spec)}


def open_run(profile: Profile, *, observer: Observer, out_dir: Path | None = None) -> RunContext:
    """Open the profile's backend session (load the models, or launch what it needs) and key the run. run.compile is
    keyed through the session's identity, as what it resolved to (a compiled native session says so there)."""
    from specbench.heads.reference import with_mtp_target  # torch: only where a run opens

    profile = with_mtp_target(profile, say=observer.message)  # target.mtp: the MTP model made of the target
    backend = get_backend(profile.backend)
    session = backend.open(profile, observer=observer, out_dir=out_dir)
    run_key = stable_hash({
        **session.identity, "workload": workload_fingerprint(session.prompts),
        "max_new_tokens": profile.workload.max_new_tokens, "run": profile.run.model_dump(exclude={"compile"}), **_sent(session, profile),
    })
    return RunContext(profile, backend, session, run_key)


def _sent(session: Session, profile: Profile) -> dict[str, Any]:
    """What the workload sends beyond its prompts, where it differs from a fixed budget that stops at EOS (keys of
    runs from before dataset workloads hold)."""
    sent: dict[str, Any] = {}
    if profile.workload.max_new_tokens == "dataset":
        sent["budgets"] = list(session.workload.max_new_tokens)
    if profile.workload.ignore_eos:
        sent["ignore_eos"] = True
    return sent

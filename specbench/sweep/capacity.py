"""The capacity search of `specbench run` (a profile's [capacity] table): per launch configuration and
(temperature, top_p), while the configuration's engine is up, the probes `specbench.capacity.search.next_probe` asks
for — each one a recorded point at a request rate (or a concurrency), reused where the files already hold it with
as many requests — until the bracket closes. Each decision goes to the terminal (observer.message) and the
manifest; the capacities (fitted from every request of every probe, with their intervals: capacity.estimate),
brackets, gains over the baseline and costs to capacity.json."""

from __future__ import annotations

import time
from dataclasses import replace
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from specbench.capacity.document import CapacityDocument, write_capacity
from specbench.capacity.estimate import (ESTIMATED, ProbeRequests, between_repeats, estimate_capacity, half_width,
                                         run_dispersion, widened)
from specbench.capacity.outcome import (Pooled, capacity_document, capacity_text, merged_history,
                                        met_in_arrival_order, search_outcome)
from specbench.capacity.search import (Done, Next, Probe, SearchSettings, bracket, decide, fewest_to_confirm,
                                       growing_queue, late_sends, narrowing_probe, next_probe, probe_of)
from specbench.core import results, summary
from specbench.core.manifest import read_manifest, write_manifest
from specbench.core.results import PointSpec
from specbench.sweep.context import RunContext
from specbench.sweep.files import RunFiles
from specbench.sweep.probe import probe_seconds, sending, serial_misses, span_s

if TYPE_CHECKING:
    from specbench.sweep.point import PointRun, SweepObserver


def by_launch(planned: list[PointSpec], launch_key: Callable[[PointSpec], Hashable]) -> list[list[PointSpec]]:
    """The planned points in runs that share one launch (the plan orders them so)."""
    groups: list[list[PointSpec]] = []
    for spec in planned:
        if groups and launch_key(groups[-1][0]) == launch_key(spec):
            groups[-1].append(spec)
        else:
            groups.append([spec])
    return groups


def configuration_label(spec: PointSpec) -> str:
    """"baseline", or "<draft> γ<gamma>" (with "imposed <rates>" for an acceptance what-if: its own configuration)."""
    if spec.method == "baseline":
        return "baseline"
    return f"{spec.draft} γ{spec.gamma}" + (f" imposed {spec.imposed_acceptance}" if spec.synthetic else "")


class CapacitySearch:
    """The searches of one run, configuration by configuration; `finish` writes capacity.json."""

    def __init__(self, ctx: RunContext, files: RunFiles, observer: SweepObserver, *, order: list[PointSpec],
                 evaluate: Callable[..., PointRun]):
        self.ctx, self.files, self.observer, self.order, self.evaluate = ctx, files, observer, order, evaluate
        self.spec = ctx.profile.capacity
        slo = ctx.profile.slo
        self.slo: dict[str, float] = {} if slo.relative() else slo.limits()  # relative: resolved before each search
        self.probe_points: list[str] = []  # the probes' points that the sweep does not plan
        self._several_temperatures = len({(s.temperature, s.top_p) for s in order}) > 1
        self._request_s: float | None = None  # one request alone, as the last serial point measured it
        self._pooled: dict[tuple[PointSpec, str], Pooled] = {}  # per configuration and axis, in the order searched

    @property
    def entries(self) -> list[dict[str, Any]]:
        """capacity.json's entries so far: each configuration and axis with every repeat searched."""
        return [pooled.entry for pooled in self._pooled.values() if pooled.entry is not None]

    def search(self, launch: list[PointSpec], *, repeat: int = 0) -> None:
        """Every (temperature, top_p) of one launch configuration, on each axis asked for; `repeat` of
        [capacity] repeats (0: the first), pooled with the repeats before it."""
        for spec in dict.fromkeys(s.at_load(concurrency=1) for s in launch):
            # the concurrency first where both are asked: the rate search starts from its throughput (`_placed`)
            for axis in [axis for axis, asked in (("concurrency", self.spec.concurrency), ("request_rate", self.spec.rate))
                         if asked]:
                self._pooled[(spec, axis)].entry = self.search_configuration(spec, axis, repeat=repeat)
            self._write_manifest()

    def finish(self) -> CapacityDocument:
        """capacity.json: every interval allowing for the run's dispersion (`restate`), gains over the baseline and
        costs filled in, written atomically; returned."""
        self.restate()
        document = capacity_document(self.entries, slo=self.slo, spec=self.spec, profile=self.ctx.profile)
        write_capacity(document, self.files.out_dir)
        self._write_manifest()
        return document

    # --- one search ------------------------------------------------------------------------

    def search_configuration(self, serial: PointSpec, axis: str, *, repeat: int = 0) -> dict[str, Any]:
        """One configuration's search on one axis ("request_rate" or "concurrency"), from its point at concurrency 1:
        its capacity.json entry (before the gain over the baseline is known), with every repeat's probes so far.
        A later repeat starts where the repeats before it put the capacity."""
        pooled = self._pooled.setdefault((serial, axis), Pooled())
        name = self._name(serial) + (f" (repeat {repeat + 1} of {self.spec.repeats})" if self.spec.repeats > 1 else "")
        entry = {"configuration": configuration_label(serial), "method": serial.method, "draft": serial.draft,
                 "gamma": serial.gamma, "temperature": serial.temperature, "top_p": serial.top_p, "axis": axis,
                 "probes": pooled.probes}
        if (unresolved := self._resolve_slo()) is not None:
            self.observer.message(f"{name}: failed: {unresolved}")
            return pooled.stopped(entry, repeat, f"failed: {unresolved}")
        try:
            settings, entry["start_from"] = self._settings(serial, axis, start=pooled.capacity)
            entry["start"] = settings.start
        except ProbeFailed as failure:
            self.observer.message(f"{name}: failed: {failure}")
            return pooled.stopped(entry, repeat, f"failed: {failure}")
        except NoLoadCanPass as reason:
            self.observer.message(f"{name}: {reason}: no rate can hold the SLO, the search stops")
            return pooled.stopped(entry, repeat, f"not bracketed: {reason}")
        self._say_probe_time(name, settings, axis)
        fewest = fewest_to_confirm(settings.target, confidence=settings.confidence)
        if fewest is None or fewest > settings.requests:
            self.observer.message(
                f"{name}: {settings.requests} requests per probe cannot confirm attainment {settings.target:g} even "
                f"when every one meets the SLO (at {settings.confidence:g} confidence it takes "
                + (f"{fewest}" if fewest else "more than 100000") + "): each probe is confirmed only with more "
                f"requests, up to {settings.max_requests} (raise [capacity] requests to spend fewer probes)")
        history: list[Probe] = []
        requests: dict[str, ProbeRequests] = {}  # per point: the requests the files hold (every draw of a load)
        step = self._next(history, settings, requests)
        while not isinstance(step, Done):
            # a load probed again (to decide it, with more requests) is a new draw and a point of its own: the fit
            # keeps the requests of every draw
            draw = sum(probe.load == step.load for probe in history)
            spec = (serial.at_load(request_rate=step.load) if axis == "request_rate" else
                    serial.at_load(concurrency=int(step.load))).in_repeat(repeat).in_draw(draw)
            # one request at a time has no queue to fill or drain: the concurrency-1 probe is the serial point, as
            # the sweep and the rate search's start send it (one key for one point)
            rows, duration_s, reused, error = self._measure(spec, step.n_requests, open_loop=axis == "request_rate",
                                                            steady=axis == "request_rate" or step.load > 1)
            # a probe whose point failed (pushed past the engine's limit on purpose, it died or timed out) met nothing;
            # one whose client sent late measured the client: void
            void = late_sends(rows, self.slo, share=self.spec.max_lateness, request_ms=(self._request_s or 0) * 1e3) \
                if error is None and axis == "request_rate" else None
            probe = probe_of(rows, load=step.load, slo=self.slo, duration_s=duration_s,
                             open_loop=axis == "request_rate", void=void) if error is None else \
                Probe(load=step.load, n_requests=step.n_requests, met=0, duration_s=duration_s)
            if void is None and error is None and axis == "request_rate" and \
                    decide(probe, settings).leaning == "pass":  # a pass counts only where the engine kept up
                load_seen = self.probe_summary(spec.point_id)
                probe = replace(probe, unsustained=growing_queue(load_seen.get("requests_waiting_growth"),
                                                                 running_peak=load_seen.get("requests_running_peak")))
            if spec not in self.order and spec.point_id not in self.probe_points:
                self.probe_points.append(spec.point_id)
            requests[spec.point_id] = ProbeRequests(step.load, met_in_arrival_order(rows, self.slo)
                                                    if error is None else np.zeros(step.n_requests, bool))
            if void is not None or probe.unsustained is not None:  # the fit has nothing to learn from its window
                del requests[spec.point_id]
            history.append(probe)
            step = self._next(history, settings, requests)
            entry["probes"].append(self._record(spec, probe, settings, axis=axis, name=name, rows=rows, reused=reused,
                                                error=error, after=step) | {"repeat": repeat})
        outcome = self._outcome(history, settings, entry["probes"], axis, requests=list(requests.values()),
                                repeat=repeat)
        pooled.add(repeat, history, requests, outcome, settings)
        if self.spec.repeats == 1:
            return {**entry, **outcome}
        merged = self._merged(pooled, entry["probes"], axis)
        self.observer.message(f"{name}: this repeat {capacity_text(outcome)}; every repeat so far pooled "
                              f"{capacity_text(merged)}")
        return {**entry, **merged, "repeats": list(pooled.repeats)}

    def _outcome(self, history: list[Probe], settings: SearchSettings, probes: list[dict], axis: str, *,
                 requests: list[ProbeRequests], repeat: int, run_dispersion: float | None = None) -> dict[str, Any]:
        """One repeat's outcome: its capacity fitted to its own requests, with its interval (allowing for the run's
        dispersion on this axis where given), bracket and cost."""
        own = estimate_capacity(requests, target=settings.target, confidence=settings.confidence,
                                integer=settings.integer, seed=self.ctx.profile.run.seed, run_dispersion=run_dispersion)
        mine = [p for p in probes if p["repeat"] == repeat]
        outcome = search_outcome(history, settings, mine, axis, estimate=own,
                                 usd_per_hour=self.ctx.profile.usd_per_replica_hour)
        errors = [p["error"] for p in mine]
        if errors and all(errors):  # nothing was measured at any load: the search says why rather than a capacity
            outcome["status"] = f"failed: {errors[-1]}"
        return outcome

    def _merged(self, pooled: Pooled, probes: list[dict], axis: str, *,
                run_dispersion: float | None = None) -> dict[str, Any]:
        """Every repeat so far as one search: the capacity fitted to all their requests, its interval widened by
        the spread between the repeats' own estimates (`estimate.between_repeats`), judged without the per-search
        limits (each repeat had its own)."""
        settings = pooled.settings
        together = estimate_capacity(pooled.requests, target=settings.target, confidence=settings.confidence,
                                     integer=settings.integer, seed=self.ctx.profile.run.seed,
                                     run_dispersion=run_dispersion)
        unlimited = replace(settings, max_probes=len(probes) + 1, max_time_s=None)
        merged = search_outcome(merged_history(pooled.histories), unlimited, probes, axis, estimate=together,
                                usd_per_hour=self.ctx.profile.usd_per_replica_hour)
        if all(r["status"].startswith("failed") for r in pooled.repeats):
            merged["status"] = pooled.repeats[-1]["status"]
        tau = between_repeats([(r["capacity"], r["capacity_low"], r["capacity_high"]) for r in pooled.repeats],
                              confidence=settings.confidence)
        merged["between_repeats"] = tau
        if tau and merged["capacity"] is not None:
            merged["capacity_low"], merged["capacity_high"] = widened(
                merged["capacity"], merged["capacity_low"], merged["capacity_high"], tau=tau,
                repeats=sum(r["capacity"] is not None for r in pooled.repeats), confidence=settings.confidence)
            width = half_width(merged["capacity"], merged["capacity_low"], merged["capacity_high"])
            if width is not None:  # the fit's own conditioning said its width before this
                said = (f"the repeats lie further apart than their intervals allow (τ {tau:.2g}): widened to "
                        f"±{width * 100:.0f} %")
                merged["note"] = "; ".join(n for n in (merged["note"], said) if n)
        return merged

    def restate(self) -> None:
        """Every search's interval again, now that the run has searched every configuration: allowing for the
        dispersion of all its probes on that axis (`estimate.run_dispersion`; one search's few probes say little of
        how much more than independent requests its draws scatter, the run's say more). Said once per axis."""
        for axis in ("concurrency", "request_rate"):
            searched = [p for (_, a), p in self._pooled.items() if a == axis and p.entry is not None and p.settings
                        and not str(p.entry.get("status")).startswith("failed")]
            spread = run_dispersion([p.requests for p in searched]) if len(searched) > 1 else None
            inflated = spread is not None and spread > 1  # at or below 1 it changes no interval
            for pooled in searched:
                entry = pooled.entry
                if inflated and self.spec.repeats == 1:
                    entry.update(self._outcome(pooled.histories[-1], pooled.settings, entry["probes"], axis,
                                               requests=pooled.requests, repeat=0, run_dispersion=spread))
                elif inflated:
                    entry.update(self._merged(pooled, entry["probes"], axis, run_dispersion=spread))
                entry["run_dispersion"] = spread
            if inflated:
                self.observer.message(
                    f"{_axis_name(axis)}: the probes of every configuration scatter about their fits {spread:.2g}x as "
                    f"much as independent requests would (pooled over {len(searched)} searches): each interval allows "
                    f"for it where its own search's probes showed less")

    def _next(self, history: list[Probe], settings: SearchSettings,
              requests: dict[str, ProbeRequests]) -> Next | Done:
        """The search's next probe; once its bracket is resolved, a new draw where the capacity's interval from the
        requests so far reaches past an end of the bracket (`search.narrowing_probe`)."""
        step = next_probe(history, settings)
        if not (isinstance(step, Done) and step.reason == "found"):
            return step
        estimate = estimate_capacity(list(requests.values()), target=settings.target, confidence=settings.confidence,
                                     integer=settings.integer, seed=self.ctx.profile.run.seed)
        passing, failing = bracket(history, settings)
        if estimate is None or estimate.status != ESTIMATED or passing is None or failing is None:
            return step
        above = estimate.ci_high is None or estimate.ci_high > failing.load * (1 + 1e-9)
        below = estimate.ci_low is None or estimate.ci_low < passing.load * (1 - 1e-9)
        return narrowing_probe(history, settings, reaches_above=above, reaches_below=below) or step

    def _record(self, spec: PointSpec, probe: Probe, settings: SearchSettings, *, axis: str, name: str,
                rows: pd.DataFrame | None, reused: bool, error: str | None, after: Next | Done) -> dict[str, Any]:
        """A probe as capacity.json lists it, its decision and what comes next (`after`); told to the observer."""
        decision = decide(probe, settings)
        following = (f"next {_load_text(after.load, axis)}" + (f" with {after.n_requests} requests"
                     if after.n_requests != settings.requests else "")) if not isinstance(after, Done) \
            else f"done ({after.reason})"
        following += f" ({after.reason})" if isinstance(after, Next) and after.narrowing else ""
        more = decision.verdict is None and isinstance(after, Next) and after.load == probe.load
        label = (f"void: {probe.void}" if probe.void else "undecided: add requests" if more else decision.label) + (
            f" (the point failed: {error})" if error else "")
        measured = self._summary(spec, rows) if rows is not None else {}
        relation = "(void)" if probe.void else ">=" if decision.verdict == "pass" else "<" if decision.verdict == "fail" \
            else "straddles"
        self.observer.message(
            f"{name}: {_load_text(probe.load, axis)}: attainment {decision.attainment:.2f} [{decision.ci_low:.2f}, "
            f"{decision.ci_high:.2f}] of {probe.n_requests} {relation} {settings.target:g}: {label}; {following}"
            + (" (recorded point reused)" if reused else ""))
        return {"load": probe.load, "point_id": spec.point_id, "n_requests": probe.n_requests, "met": probe.met,
                "attainment": decision.attainment, "ci_low": decision.ci_low, "ci_high": decision.ci_high,
                "decision": label, "next": following, "reused": reused, "duration_s": round(probe.duration_s, 2),
                "goodput": measured.get("goodput"), "tokens_per_s": measured.get("tokens_per_s"),
                "usd_per_mtok": measured.get("usd_per_mtok"), "completed_per_s": probe.completed_per_s,
                "output_tokens": measured.get("output_tokens"), "request_throughput": measured.get("request_throughput"),
                "error": error, "void": probe.void}

    def _resolve_slo(self) -> str | None:
        """Relative [slo] limits ("2x serial") in milliseconds, from the baseline's serial point as the files hold it
        (the sweep measured it before any search: the baseline's launch comes first); said once. Why they cannot be,
        or None."""
        slo = self.ctx.profile.slo
        if not slo.relative():
            return None
        requests = results.read_parquet(self.files.out_dir / results.REQUESTS_FILE)
        limits = slo.resolved(self.ctx.serial_baseline(requests))
        if limits is None:
            return ("the [slo] limits relative to the baseline's serial figures have nothing to be resolved against: "
                    "its point at concurrency 1 measured no request")
        if limits != self.slo:
            self.observer.message("SLO " + ", ".join(
                f"{name} {limit:.4g}" + (f" ({slo.given()[name]}: {slo.relative()[name]:g} x the baseline's "
                                         f"serial median)" if name in slo.relative() else "")
                for name, limit in limits.items()))
        self.slo = limits
        return None

    def _say_probe_time(self, name: str, settings: SearchSettings, axis: str) -> None:
        """How each probe is sent, and about how long the first one takes, before the search starts."""
        spec = self.spec
        if not (spec.lead_in_s or spec.window_s):
            return
        seconds = probe_seconds(spec, load=settings.start, n_requests=settings.requests, request_s=self._request_s,
                                open_loop=axis == "request_rate")
        self.observer.message(
            f"{name}: each probe is a {spec.lead_in_s:g} s lead-in at its load (not measured), then at least "
            f"{settings.requests} requests sent over at least {spec.window_s:g} s measured, the load held until they "
            f"finish" + (f": about {seconds:.0f} s at {settings.start:.3g} requests/s" if seconds else "")
            + f"; at most {settings.max_probes} probes")
        if self._request_s and spec.window_s < 2 * self._request_s:  # known once the serial point ran
            self.observer.message(
                f"{name}: the {spec.window_s:g} s window is shorter than two requests' lifetimes "
                f"({self._request_s:.1f} s each one at a time): a window that short holds the engine's response to a "
                f"few arrivals rather than a steady state; raise [capacity] window_s to several times "
                f"{self._request_s:.1f} s")

    def _name(self, spec: PointSpec) -> str:
        """The configuration in the terminal's decision lines (with its temperature where the run has several)."""
        where = f" (temperature {spec.temperature:g}, top_p {spec.top_p:g})" if self._several_temperatures else ""
        return configuration_label(spec) + where

    def probe_summary(self, point_id: str) -> dict[str, Any]:
        """A probe's row of points.parquet as plain values ({} when the files do not hold it)."""
        points, _ = self.files.read()
        row = points[points["point_id"] == point_id] if points is not None else []
        return {k: results.plain(v) for k, v in row.iloc[0].to_dict().items()} if len(row) else {}

    def _settings(self, serial: PointSpec, axis: str, *, start: float | None = None) -> tuple[SearchSettings, str]:
        """The search's settings, and where its first load came from (capacity.json's `start_from`); `start`, where an
        earlier repeat put the capacity, its first load."""
        spec = self.spec
        common = dict(target=spec.attainment, confidence=spec.confidence, requests=spec.requests,
                      max_requests=spec.requests_at_most, max_probes=spec.max_probes, max_time_s=spec.max_time_s,
                      growth=spec.growth)
        if axis == "concurrency":
            first = max(1, int(start)) if start is not None else 1
            return SearchSettings(**common, resolution=spec.resolution or 0.1, relative=True, start=first, lowest=1,
                                  highest=spec.max_concurrency, integer=True), "repeats" if start else "serial"
        serial_rps, start_from = spec.start_rps, "start_rps" if start is None else "repeats"
        if serial_rps is None:  # the rate the engine serves one request at a time: 1 / mean e2e at concurrency 1
            rows, _, _, error = self._measure(serial, 1, open_loop=False, steady=False)
            if error is not None:
                raise ProbeFailed(error)
            serial_rps = 1e3 / float(rows["e2e_ms"].mean())
            self._request_s = float(rows["e2e_ms"].mean()) / 1e3
            if (missed := serial_misses(rows, self.slo, target=spec.attainment)) is not None:
                raise NoLoadCanPass(missed)
            placed = self._placed(serial) if start is None else None
            if start is None and placed is None:
                start_from = "serial"
                self.observer.message(f"{self._name(serial)}: one request at a time takes {self._request_s:.2f} s: "
                                      f"the search starts at {serial_rps:.3g} requests/s")
            elif placed is not None:
                (start, concurrency), start_from = placed, f"concurrency {placed[1]}"
                common.update(growth=min(spec.growth, PLACED_GROWTH), accelerating=True)
                self.observer.message(
                    f"{self._name(serial)}: the search starts at {start:.3g} requests/s, what concurrency {concurrency} "
                    f"(the highest that held the SLO) completed, in steps of {common['growth']:g}x, then "
                    f"{common['growth'] ** 2:.3g}x, ...")
        lowest = spec.lowest_rps or serial_rps / 4
        first = serial_rps if start is None else min(max(start, lowest), spec.highest_rps or start)
        return SearchSettings(**common, resolution=spec.resolution_value, relative=spec.relative, start=first,
                              lowest=lowest, highest=spec.highest_rps), start_from

    def _placed(self, serial: PointSpec) -> tuple[float, int] | None:
        """Where the rate search starts when the concurrency search ran first: the requests/s its highest passing
        load completed (every draw there, weighted by requests), with that concurrency; None without one. A closed
        loop has no arrival bursts, so the open-loop capacity lies below it (0.56-0.74 of it on vLLM CPU,
        docs/measurements.md): a few probes bracket it where steps of 2 from the serial rate overshoot."""
        entry = (pooled := self._pooled.get((serial, "concurrency"))) and pooled.entry
        top = entry and entry.get("bracket_low")
        drawn = [p for p in entry["probes"] if p["load"] == top and p.get("request_throughput")
                 and not p.get("error") and not p.get("void")] if top else []
        if not drawn:
            return None
        requests = sum(p["n_requests"] for p in drawn)
        return sum(p["request_throughput"] * p["n_requests"] for p in drawn) / requests, int(top)

    def _measure(self, spec: PointSpec, n_requests: int, *, open_loop: bool,
                 steady: bool = True) -> tuple[pd.DataFrame | None, float, bool, str | None]:
        """The point's request rows (at least `n_requests` of them): recorded, or measured now and recorded; how
        long it took, whether it was reused, and why it failed (no rows then). A probe is sent in the search's steady
        state; the serial point the search starts from (`steady=False`) as the sweep sends it."""
        with sending(self.ctx, n_requests, open_loop=open_loop, steady=steady) as sent:
            with self.files.lock():  # the point's key is what the session sends: inside `sending`
                recorded = self.files.recorded(spec, self.ctx)
            if recorded is not None and len(recorded) >= n_requests:
                return recorded, span_s(recorded), True, None
            self.observer.point_started(spec, sent)
            started = time.monotonic()
            run = self.evaluate(spec, self.ctx, observer=self.observer)
            duration_s = time.monotonic() - started
            self.files.record(spec, self.ctx, run, order=self.order)
        if run.error is not None or not run.rows:
            return None, duration_s, False, f"{spec.point_id}: {run.error or 'no request was measured'}"
        return pd.DataFrame(run.rows), duration_s, False, None

    def _summary(self, spec: PointSpec, rows: pd.DataFrame) -> dict[str, Any]:
        """The probe's own goodput, tokens/s and cost, by the same summary points.parquet holds."""
        table = summary.summarize([spec], rows, failures={}, context={}, slo=self.slo,
                                  usd_per_hour=self.ctx.profile.usd_per_replica_hour)
        return {k: results.plain(v) for k, v in table.iloc[0].to_dict().items()} if len(table) else {}

    def _write_manifest(self) -> None:
        with self.files.lock():
            data = read_manifest(self.files.manifest_path)
            data.capacity = [{key: entry.get(key) for key in (
                "configuration", "temperature", "top_p", "axis", "status", "capacity", "bracket_low", "bracket_high")}
                | {"decisions": [f"{p['load']:g}: {p['n_requests']} requests, {p['met']} met: {p['decision']}; "
                                 f"{p['next']}" for p in entry["probes"]]} for entry in self.entries]
            write_manifest(data, self.files.manifest_path)


# the first step of a rate search placed from the concurrency capacity (then its square, its cube, ...): the open-loop
# capacity lies below it (arrival bursts fill the batch a closed loop keeps level; 0.56-0.74 of it on vLLM CPU),
# where a first step of 2 would overshoot by half
PLACED_GROWTH = 1.25


class ProbeFailed(RuntimeError):
    """A probe's point failed (the engine did not start, died, or answered nothing)."""


class NoLoadCanPass(RuntimeError):
    """The configuration's requests one at a time already miss the SLO: no load can hold it."""


def _axis_name(axis: str) -> str:
    return "request rate" if axis == "request_rate" else "concurrency"


def _load_text(load: float, axis: str) -> str:
    return f"{load:g} requests/s" if axis == "request_rate" else f"concurrency {int(load)}"

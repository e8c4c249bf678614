"""`specbench tune --objective capacity`: a trial is one capacity search of its configuration (the search of
`specbench run`'s [capacity] table, its probes recorded in the tune's run files like every point, the launch reused
across them), and its value is the capacity in requests/s — 0 where the configuration misses the SLO even at its
lowest rate, the lower bound where it meets it at the highest rate probed. The baseline's search runs once per
study; speculation is recommended when the chosen configuration's capacity is measurably higher: the whole interval
of its gain over the baseline's lies above zero (`capacity.document.measurable`, as `run` and `report` say it)."""

from __future__ import annotations

from typing import Any

import optuna

from specbench.capacity.document import compared, entry_from_dict
from specbench.sweep.capacity import CapacitySearch
from specbench.sweep.loop import SilentObserver, evaluate_point
from specbench.tune.evaluate import Evaluator, Live
from specbench.tune.objectives import TuneError
from specbench.tune.shared import host_key

BASELINE_ATTR = "capacity_baseline"


def capacity_search(evaluator: Evaluator, observer) -> CapacitySearch:
    if not isinstance(evaluator, Live):
        raise TuneError("--objective capacity: capacity searches run on the engine; --replay cannot answer them")
    return CapacitySearch(evaluator.ctx, evaluator.files, _Decisions(observer), order=[], evaluate=evaluate_point)


class _Decisions(SilentObserver):
    """The search's decisions on the tune's terminal; no per-request progress."""

    def __init__(self, observer) -> None:
        self.observer = observer

    def message(self, text: str) -> None:
        self.observer.message(text)


def search_baseline(study: optuna.Study, spec, search: CapacitySearch, *, host: str) -> dict[str, Any]:
    """The baseline's capacity at the study's temperature, searched once per host (every gain is against its own
    box's baseline) and kept with the study."""
    key = host_key(BASELINE_ATTR, host)
    if key not in study.user_attrs:
        study.set_user_attr(key, _plain(search.search_configuration(spec, "request_rate")))
    return study.user_attrs[key]


def run_capacity_trial(trial: optuna.Trial, spec, *, search: CapacitySearch,
                       constraints) -> tuple[list[float] | None, dict[str, Any]]:
    """One configuration's capacity search as a trial: its value the capacity (None where the search failed), its
    figures those of its highest passing probe, the whole search in the trial's `capacity` attr."""
    entry = _plain(search.search_configuration(spec, "request_rate"))
    trial.set_user_attr("capacity", entry)
    trial.set_user_attr("evaluated", any(not p["reused"] for p in entry["probes"]))
    if entry["status"].startswith("failed"):
        trial.set_user_attr("error", entry["status"])
        return None, {"number": trial.number, "point_id": spec.point_id, "state": "FAIL", "error": entry["status"]}
    value = float(entry["capacity"] or 0.0)
    passing = next((p for p in reversed(entry["probes"]) if p["load"] == entry["bracket_low"]), None)
    metrics = {**(search.probe_summary(passing["point_id"]) if passing else {}), "point_id": spec.point_id,
               "capacity_rps": value}
    trial.set_user_attr("metrics", metrics)
    trial.set_user_attr("repeat_values", [value])
    # capacities closer than half the interval are near-ties (the smaller gamma is then recommended)
    low, high = entry.get("capacity_low"), entry.get("capacity_high")
    trial.set_user_attr("noise", float(high - low) / 2 if entry["status"] == "found" and None not in (low, high)
                        else 0.0)
    trial.set_user_attr("constraints", constraints.violations(metrics))
    return [value], {"number": trial.number, "point_id": spec.point_id, "state": "COMPLETE", "value": value,
                     "evaluated": True}


def capacity_recommendation(chosen: dict[str, Any] | None, baseline: dict[str, Any] | None, *,
                            usd_per_hour: float | None, traffic_rps: float | None) -> dict[str, Any] | None:
    """For recommendation.json: the chosen configuration's capacity and cost beside the baseline's, each with its
    interval, and whether its capacity is measurably higher (the whole interval of the gain above zero)."""
    search = (chosen or {}).get("capacity")
    if search is None:
        return None
    base = baseline or {}
    # the chosen entry against the baseline's, by capacity.json's rules (gain, cost change, replicas, brackets)
    *before, mine = compared(([entry_from_dict(base)] if base else []) + [entry_from_dict(search)],
                             traffic_rps=traffic_rps)
    theirs = before[0] if before else None
    verdict = mine.verdict
    return {
        "capacity_rps": mine.capacity, "interval": [mine.capacity_low, mine.capacity_high],
        "bracket": [mine.bracket_low, mine.bracket_high], "status": mine.status,
        "baseline_capacity_rps": base.get("capacity"),
        "baseline_interval": [base.get("capacity_low"), base.get("capacity_high")],
        "baseline_bracket": [base.get("bracket_low"), base.get("bracket_high")],
        "baseline_status": base.get("status"), "gain_vs_baseline": mine.gain_vs_baseline,
        "gain_interval": [mine.gain_low, mine.gain_high],
        "usd_per_hour": usd_per_hour, "usd_per_mtok_at_capacity": mine.usd_per_mtok_at_capacity,
        "baseline_usd_per_mtok_at_capacity": base.get("usd_per_mtok_at_capacity"),
        "usd_per_mtok_change_vs_baseline": mine.usd_per_mtok_change_vs_baseline,
        "replicas_for_traffic": mine.replicas_for_traffic,
        "replicas_range": list(mine.replicas_range) if mine.replicas_range else None,
        "baseline_replicas_for_traffic": theirs.replicas_for_traffic if theirs is not None else None,
        "baseline_replicas_range": list(theirs.replicas_range) if theirs is not None and theirs.replicas_range
        else None,
        "traffic_rps": traffic_rps,
        "verdict": verdict,  # higher, lower or within: the gain's interval against zero (None: no gain)
        "measurably_higher": verdict == "higher",
    }


def _plain(entry: dict[str, Any]) -> dict[str, Any]:
    """JSON-ready, as Optuna stores user attrs."""
    import json

    return json.loads(json.dumps(entry, default=str))

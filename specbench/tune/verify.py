"""Verifying a tune under load: `specbench run` on recommendation.toml, in the tune folder's `verify/`. It launches
the engine with exactly the exported settings (the gamma schedule as vLLM's `num_speculative_tokens_per_batch_size`
included) and measures it at every load level beside the single setting best over the load mix and the baseline,
side by side in one run; recommendation.json then records those measurements per level, with the schedule's
throughput over the single setting's and its paired 95 % CI (a bootstrap over prompts, as every speedup here)."""

from __future__ import annotations

import tomllib
from typing import Any

import pandas as pd

from specbench.tune.document import write_recommendation
from specbench.core import results, stats
from specbench.profile import ProfileError, profile_from_dict
from specbench.sweep import ResumeError, run_sweep
from specbench.sweep.loop import SilentObserver, SweepObserver
from specbench.tune.plan import RECOMMENDATION_TOML, Plan, TuneResult

VERIFY_DIR = "verify"


def skip_reason(plan: Plan) -> str | None:
    """Why this tune's recommendation is not verified, or None."""
    if len(plan.levels) < 2:
        return "one load level: the trials measured it"
    if not plan.settings.verify:
        return "--no-verify"
    if plan.replay is not None:
        return "a replay: nothing to launch"
    server = plan.profile.server
    if plan.profile.backend != "server" or server is None or server.url is not None:
        return "the engine is not launched by specbench (attached, or an in-process backend)"
    return None


class VerifyProgress(SilentObserver):
    """The verification run's points, told through the tune's observer."""

    def __init__(self, observer):
        self.observer = observer

    def message(self, text: str) -> None:
        self.observer.message(f"verify: {text}")

    def point_finished(self, spec, row: dict[str, Any]) -> None:
        speedup = row.get("speedup")
        figure = f"{row.get('tokens_per_s') or 0:.1f} tok/s" + (f", speedup {speedup:.2f}x" if speedup == speedup and
                                                                speedup is not None else "")
        self.observer.message(f"verify: {spec.point_id}: {row.get('status')}, {figure}")


def verify(plan: Plan, result: TuneResult, *, observer: SweepObserver | None = None,
           elsewhere: str | None = None) -> TuneResult:
    """Run recommendation.toml into `verify/` and record what it measured in recommendation.json (and its summary
    in the TOML's header). `elsewhere`: the worker that verifies for the whole shared tune, when it is not this one."""
    reason = skip_reason(plan)
    if reason is None and elsewhere is not None:
        reason = f"verified once for the shared study, by worker {elsewhere}: see its output folder's {VERIFY_DIR}/"
    if reason is not None and len(plan.levels) < 2:
        return result
    choices = result.recommendation.temperatures
    if reason is None and not any((c.get("load") or {}).get("profile_drafts") for c in choices):
        reason = "speculation pays at no level over the load mix: nothing but the baseline to launch"
    points = requests = None
    if reason is None:
        try:
            profile = profile_from_dict(tomllib.loads(result.profile_toml), source=plan.out_dir / RECOMMENDATION_TOML)
            out_dir = plan.out_dir / VERIFY_DIR
            try:
                run = run_sweep(profile, out_dir=out_dir, observer=observer)
            except ResumeError:  # an earlier verification of another recommendation
                run = run_sweep(profile, out_dir=out_dir, fresh=True, observer=observer)
            points, requests = run.points, run.requests
        except (ProfileError, OSError, RuntimeError, ValueError) as error:
            reason = f"the verification run failed: {' '.join(str(error).split())[:300]}"
            status = "failed"
        else:
            status = "measured"
    else:
        status = "skipped"
    for choice in choices:
        load = choice.get("load")
        if load is None:
            continue
        if status != "measured":
            load["verification"] = {"status": status, "reason": reason, "folder": VERIFY_DIR, "levels": [],
                                    "schedule_no_worse": None}
            continue
        load["verification"] = measured(load, points, requests, objective=result.recommendation.objective,
                                        temperature=choice["temperature"], top_p=choice["top_p"])
        fall_back(choice)
    write_recommendation(result.recommendation, plan.out_dir)
    result.profile_toml = _with_verification(result.profile_toml, choices)
    (plan.out_dir / RECOMMENDATION_TOML).write_text(result.profile_toml)
    return result


def fall_back(choice: dict[str, Any]) -> None:
    """A schedule measured worse than the single setting at some level (beyond the CI of their ratio) is not
    recommended: vLLM gets the single setting, the schedule stays on record (`vllm_schedule`) with the reason."""
    load, settings = choice["load"], choice["engine_settings"]
    verification = load["verification"]
    if verification.get("schedule_no_worse") is not False or "vllm_single" not in settings:
        return
    worse = [level["load"] for level in verification["levels"] if (level["schedule_vs_single"] or {}).get("worse")]
    settings["vllm_schedule"], settings["vllm"] = settings["vllm"], settings.pop("vllm_single")
    reason = (f"the verification measured the gamma schedule worse than the single setting at {', '.join(worse)} "
              "(beyond the CI of their ratio): vLLM gets the single setting")
    load["schedule"]["recommended"] = False
    verification["fallback"] = reason
    settings["notes"].append(reason)


def measured(load: dict[str, Any], points: pd.DataFrame, requests: pd.DataFrame, *, objective: dict[str, Any],
             temperature: float, top_p: float) -> dict[str, Any]:
    """Per load level: the baseline, the single setting and the schedule as the verification run measured them."""
    names = load.get("profile_drafts") or {}
    column, direction = objective["columns"][0], objective["directions"][0]
    here = points[(points["temperature"] == temperature) & (points["top_p"] == top_p)]
    levels, no_worse = [], True
    for level in load["levels"]:
        at = here[results.at_load(here, concurrency=level["concurrency"], request_rate=level["request_rate"])]
        entry: dict[str, Any] = {"load": level["load"], "concurrency": level["concurrency"],
                                 "request_rate": level["request_rate"]}
        rows = {role: _row(at, draft) for role, draft in (("baseline", "baseline"), ("single", names.get("single")),
                                                           ("schedule", names.get("schedule")))}
        for role, row in rows.items():
            entry[role] = None if row is None else _figures(row, column)
        entry["schedule_vs_single"] = None
        if rows["schedule"] is not None and rows["single"] is not None:
            entry["schedule_vs_single"] = _versus(requests, rows["schedule"], rows["single"])
            no_worse = no_worse and not entry["schedule_vs_single"]["worse"]
        levels.append(entry)
    has_schedule = any(level["schedule_vs_single"] is not None for level in levels)
    return {"status": "measured", "reason": None, "folder": VERIFY_DIR, "objective": column, "direction": direction,
            "levels": levels, "schedule_no_worse": no_worse if has_schedule else None}


def _row(points: pd.DataFrame, draft: str | None) -> dict[str, Any] | None:
    if draft is None:
        return None
    match = points[(points["draft"] == draft) & (points["status"] == "ok")]
    return match.iloc[0].to_dict() if len(match) else None


def _figures(row: dict[str, Any], column: str) -> dict[str, Any]:
    keys = ("point_id", "tokens_per_s", "speedup", "goodput", "acceptance_rate", "mean_accepted_length",
            "ttft_ms_p99", "tpot_ms_p99")
    out = {key: results.plain(row.get(key)) for key in keys}
    out["speedup_ci"] = [results.plain(row.get("speedup_ci_low")), results.plain(row.get("speedup_ci_high"))]
    out["value"] = results.plain(row.get(column))
    out["unstable"] = results.plain(row.get("unstable"))
    return out


def _versus(requests: pd.DataFrame, schedule: dict[str, Any], single: dict[str, Any]) -> dict[str, Any]:
    """The schedule's throughput over the single setting's on the same prompts, with a paired bootstrap CI; worse
    when the whole CI lies below 1."""
    mine = requests[requests["point_key"] == schedule["point_key"]].groupby("prompt_id")[["output_tokens", "e2e_ms"]].sum()
    theirs = requests[requests["point_key"] == single["point_key"]].groupby("prompt_id")[["output_tokens", "e2e_ms"]].sum()
    shared = mine.index.intersection(theirs.index)
    if len(shared) < 2:
        return {"ratio": None, "ci": [None, None], "worse": False}
    mine, theirs = mine.loc[shared], theirs.loc[shared]
    ratio, low, high = stats.paired_bootstrap_speedup(
        mine["output_tokens"].to_numpy(float), mine["e2e_ms"].to_numpy(float),
        theirs["output_tokens"].to_numpy(float), theirs["e2e_ms"].to_numpy(float))
    return {"ratio": ratio, "ci": [low, high], "worse": bool(high < 1.0)}


def _with_verification(text: str, choices: list[dict[str, Any]]) -> str:
    """recommendation.toml with the verification's figures in its header (replacing earlier ones)."""
    lines = [line for line in text.splitlines() if not line.startswith("#   verified")]
    head = [i for i, line in enumerate(lines) if line.startswith("#")]
    notes = []
    for choice in choices:
        verification = (choice.get("load") or {}).get("verification")
        if verification is None:
            continue
        if verification["status"] != "measured":
            notes.append(f"#   verified at temperature {choice['temperature']:g}: {verification['status']} "
                         f"({verification['reason']})")
            continue
        for level in verification["levels"]:
            parts = [f"{role} {_speedup(level[role])}" for role in ("single", "schedule") if level[role] is not None]
            versus = level["schedule_vs_single"]
            if versus is not None and versus["ratio"] is not None:
                parts.append(f"schedule/single {versus['ratio']:.2f}x [{versus['ci'][0]:.2f}, {versus['ci'][1]:.2f}]")
            notes.append(f"#   verified at temperature {choice['temperature']:g}, {level['load']}: {'; '.join(parts)}")
        if verification.get("fallback"):
            notes.append(f"#   verified at temperature {choice['temperature']:g}: {verification['fallback']}")
    at = (head[-1] + 1) if head else 0
    return "\n".join(lines[:at] + notes + lines[at:]) + "\n"


def _speedup(figures: dict[str, Any]) -> str:
    low, high = figures["speedup_ci"]
    ci = f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""
    return f"{figures['speedup']:.2f}x{ci}" if figures.get("speedup") is not None else "-"

"""The report on a tune under load (a profile with several concurrency levels or request rates): per study,
the best configuration at each load level, where speculation stops paying (the crossover), the gamma
schedule per batch size with the `--speculative-config` to paste into vLLM, and the run that verified it.

The input is the "load" entry of a study's recommendation.json (`StudyReport.load`); outputs are the
DataFrames of strings and the lines every text format shows. A study tuned at one load level has no
"load" entry and none of this is shown."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pandas as pd

from specbench.report.tables import fmt, fmt_ci
from specbench.report.trials import StudyReport

OFF = "off (no drafting)"  # gamma 0 at a level: the server runs the target alone there
LEVEL_COLUMNS = ("load", "weight", "baseline", "best point", "speedup [95% CI]", "speculate", "single [95% CI]",
                 "single loses")
SCHEDULE_COLUMNS = ("load", "gamma")
VERIFICATION_COLUMNS = ("load", "baseline tok/s", "single [95% CI]", "schedule [95% CI]", "schedule/single [95% CI]",
                        "worse")


def levels_title(study: StudyReport) -> str:
    return f"Best configuration per load level: {study.title}"


def schedule_title(study: StudyReport) -> str:
    return f"Tuned schedule: {study.title}"


def verification_title(study: StudyReport) -> str:
    return f"Verification of the schedule: {study.title}"


def speedup_cell(speedup: object, ci: list | None) -> str:
    """`1.37x [1.20-1.50]`; the speedup alone without a CI, `-` without a speedup."""
    shown, bounds = fmt(speedup, ".2f", "x"), fmt_ci(*(ci or (None, None)))
    return shown if shown == "-" or bounds == "-" else f"{shown} [{bounds}]"


def _yes(flag: object) -> str:
    return "-" if flag is None else "yes" if flag else "no"


# --- best configuration per level ----------------------------------------------------------------


def display_levels(load: dict[str, Any]) -> pd.DataFrame:
    """LEVEL_COLUMNS, one row per load level in load order; the baseline column is named by the objective."""
    rows = []
    for level in load["levels"]:
        best, single = level.get("best") or {}, level.get("single") or {}
        rows.append((
            level["load"], fmt(level.get("weight"), ".3g"), fmt(level.get("baseline_value"), ".4g"),
            best.get("point_id", "-"), speedup_cell(best.get("speedup"), best.get("speedup_ci")),
            _yes(level.get("speculate")), speedup_cell(single.get("speedup"), single.get("speedup_ci")),
            _yes(single.get("loses")),
        ))
    frame = pd.DataFrame(rows, columns=LEVEL_COLUMNS)
    return frame.rename(columns={"baseline": f"baseline {load.get('objective') or 'value'}"})


def crossover_line(load: dict[str, Any]) -> str | None:
    note = (load.get("crossover") or {}).get("note")
    return f"crossover: {note}" if note else None


def single_line(load: dict[str, Any]) -> str:
    """The one setting that serves the whole mix best, and where it loses."""
    single = load.get("single")
    if single is None:
        return "single setting for the whole mix: none recorded"
    loses = ", ".join(single.get("loses_at") or []) or "no level"
    return (f"single setting for the whole mix: {single['point_id']} ({load.get('objective') or 'value'} "
            f"{fmt(single.get('mix_value'), '.4g')} weighted over the mix); loses at {loses}")


# --- the schedule --------------------------------------------------------------------------------


def display_schedule(load: dict[str, Any]) -> pd.DataFrame | None:
    """SCHEDULE_COLUMNS, one row per concurrency level of the schedule; None without a schedule."""
    schedule = load.get("schedule")
    if schedule is None:
        return None
    rows = [(entry["load"], _gamma(entry["gamma"])) for entry in schedule["gammas"]]
    return pd.DataFrame(rows, columns=SCHEDULE_COLUMNS)


def _gamma(gamma: int) -> str:
    return OFF if gamma == 0 else str(gamma)


def schedule_lines(load: dict[str, Any]) -> list[str]:
    """What the schedule drafts with and its vLLM batch-size ranges, or why there is no schedule."""
    schedule = load.get("schedule")
    if schedule is None:
        has_concurrency = any(level.get("concurrency") is not None for level in load["levels"])
        why = "speculation pays at no concurrency level" if has_concurrency else "no concurrency levels in the profile"
        return [f"no gamma schedule: {why}"]
    ngram = f", ngram_max {schedule['ngram_max']}" if schedule.get("ngram_max") is not None else ""
    ranges = "; ".join(f"{_batch_sizes(low, high)}: gamma {_gamma(gamma)}"
                       for low, high, gamma in schedule["batch_size_ranges"])
    return [f"draft {schedule['draft']} (method {schedule['method']}{ngram}), gamma by concurrency level",
            f"vLLM batch-size ranges: {ranges}"]


def _batch_sizes(low: int, high: int) -> str:
    return f"batch size {low}" if low == high else f"batch sizes {low}-{high}"


def speculative_config_arg(load: dict[str, Any]) -> str | None:
    """`--speculative-config '{...}'`: the schedule's vLLM option, compact JSON quoted for a shell."""
    schedule = load.get("schedule")
    if schedule is None or schedule.get("speculative_config") is None:
        return None
    config = json.dumps(schedule["speculative_config"], separators=(",", ":"))
    return f"--speculative-config {shlex.quote(config)}"


# --- verification --------------------------------------------------------------------------------


def display_verification(load: dict[str, Any]) -> pd.DataFrame | None:
    """VERIFICATION_COLUMNS, one row per level the verification ran; None unless it was measured. A level
    where the schedule is the single setting shows `same as single`; every level shows `-` without a schedule."""
    verification = load.get("verification") or {}
    if verification.get("status") != "measured":
        return None
    same = "-" if load.get("schedule") is None else "same as single"
    rows = []
    for level in verification.get("levels") or []:
        baseline, single = level.get("baseline") or {}, level.get("single") or {}
        schedule, versus = level.get("schedule"), level.get("schedule_vs_single")
        rows.append((
            level["load"], fmt(baseline.get("tokens_per_s"), ".1f"),
            speedup_cell(single.get("speedup"), single.get("speedup_ci")),
            same if schedule is None else speedup_cell(schedule.get("speedup"), schedule.get("speedup_ci")),
            "-" if versus is None else speedup_cell(versus.get("ratio"), versus.get("ci")),
            "-" if versus is None else "WORSE" if versus.get("worse") else "no",
        ))
    return pd.DataFrame(rows, columns=VERIFICATION_COLUMNS)


def worse_rows(verification: pd.DataFrame) -> list[bool]:
    """Rows where the schedule measured worse than the single setting (styled as warnings)."""
    return [cell == "WORSE" for cell in verification["worse"]]


def verification_line(load: dict[str, Any]) -> str | None:
    """The verdict of the verification run, or why it did not run; None for a tune that records none."""
    verification = load.get("verification")
    if verification is None:
        return None
    status = verification.get("status")
    if status != "measured":
        return f"verification {status}: {verification.get('reason') or 'no reason recorded'}"
    where = f" (points in {verification['folder']}/points.parquet)" if verification.get("folder") else ""
    verdict = verification.get("schedule_no_worse")
    if verdict is None:
        return f"verification measured{where}: no schedule to compare; the single setting against the baseline"
    if verdict:
        return f"verification measured{where}: the schedule is no worse than the single setting at any level"
    worse = [level["load"] for level in verification.get("levels") or []
             if (level.get("schedule_vs_single") or {}).get("worse")]
    return (f"verification measured{where}: the schedule is worse than the single setting at "
            f"{', '.join(worse) or 'some level'}")

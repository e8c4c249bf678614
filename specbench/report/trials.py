"""The report on `specbench tune` output: per study (one per temperature and top_p), the trials in the
order they ran with the best value so far, the recommendation, and the parameter importances Optuna
computes from the completed trials, on a study rebuilt in memory from trials.parquet so the report
needs no access to the tune's storage.

Importances use Optuna's fANOVA evaluator (a seeded random forest), not its default PED-ANOVA: on the
10-40 trials a tune runs, PED-ANOVA looks only at the top 10 % (one to four trials) and named gamma the
driver of an objective that depended on the draft alone, where fANOVA named the draft (see the tests).
fANOVA leaves out a parameter that some completed trials lack (ngram_max, when other drafts are in
the study)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from specbench.report.folders import Tune
from specbench.report.tables import Filter, apply_filters, fmt

# roles of trials that ran nothing (the claim rule gave their point to another trial, or the budget was spent)
NOT_RUN = ("duplicate", "surplus", "stale", "interrupted")
TRIAL_COLUMNS = ("number", "role", "state", "point_id", "value", "best_so_far", "speedup", "warm_start_prediction",
                 "prompts_measured", "trial_error")
DISPLAY_COLUMNS = ("trial", "role", "state", "point", "objective", "best so far", "speedup", "warm-start pred.",
                   "prompts")
MIN_TRIALS_FOR_IMPORTANCE = 4


@dataclass(frozen=True)
class StudyReport:
    study: str
    temperature: float
    top_p: float
    objective: str | None  # the deciding column (the first in Pareto mode); None without recommendation.json
    direction: str | None  # maximize | minimize
    trials: pd.DataFrame  # TRIAL_COLUMNS: the trials that ran, by number
    not_run: int  # trials that ran nothing (duplicates, surplus)
    importances: dict[str, float] = field(default_factory=dict)  # parameter -> importance (sums to 1)
    importance_note: str | None = None  # why there are no importances
    recommendation: dict[str, Any] | None = None  # the study's entry of recommendation.json

    @property
    def failed(self) -> list[str]:
        """One line per trial that failed while running its point."""
        failed = self.trials[self.trials["state"] == "FAIL"]
        return [f"trial {row['number']} ({row['point_id']}): {row['trial_error'] or 'no error recorded'}"
                for row in failed.to_dict("records")]

    @property
    def not_run_line(self) -> str:
        trials = "1 trial" if self.not_run == 1 else f"{self.not_run} trials"
        return f"{trials} ran nothing (a duplicate of a claimed point, or past the budget); not listed."

    @property
    def load(self) -> dict[str, Any] | None:
        """The recommendation's entry for a tune under load (schedule.py shows it); None at one load level."""
        return (self.recommendation or {}).get("load")

    @property
    def title(self) -> str:
        top_p = f", top_p {self.top_p:g}" if self.top_p < 1 else ""
        return f"temperature {self.temperature:g}{top_p} (study {self.study})"


def study_reports(tune: Tune, filters: list[Filter]) -> list[StudyReport]:
    """One per study, in temperature order. Filters apply to trials as to points (trials carry the
    point columns), so `--filter temperature=0` keeps that study alone."""
    trials = apply_filters(tune.trials, filters) if filters else tune.trials
    objective = tune.recommendation.objective if tune.recommendation else {}
    columns, directions = objective.get("columns") or [None], objective.get("directions") or [None]
    entries = {entry.get("study"): entry for entry in (tune.recommendation.temperatures if tune.recommendation else [])}
    reports = []
    for study, group in sorted(trials.groupby("study", sort=False),
                               key=lambda item: (item[1]["temperature"].iloc[0], item[1]["top_p"].iloc[0])):
        ran = group[~group["role"].isin(NOT_RUN)].sort_values("number")
        importances, note = parameter_importances(ran, direction=directions[0],
                                                  space=tune.recommendation.search_space if tune.recommendation else None)
        reports.append(StudyReport(
            study=str(study), temperature=float(group["temperature"].iloc[0]), top_p=float(group["top_p"].iloc[0]),
            objective=columns[0], direction=directions[0], trials=_with_best_so_far(ran, directions[0]),
            not_run=int(len(group) - len(ran)), importances=importances, importance_note=note,
            recommendation=entries.get(study),
        ))
    return reports


def _with_best_so_far(trials: pd.DataFrame, direction: str | None) -> pd.DataFrame:
    """The best completed value up to each trial (pruned and failed trials do not count)."""
    frame = trials.copy()
    completed = frame["value"].where(frame["state"] == "COMPLETE").astype("float64")
    if direction == "minimize":
        frame["best_so_far"] = completed.cummin().ffill()
    elif direction == "maximize":
        frame["best_so_far"] = completed.cummax().ffill()
    else:
        frame["best_so_far"] = float("nan")  # unknown direction: recommendation.json is missing
    for column in TRIAL_COLUMNS:
        if column not in frame.columns:
            frame[column] = None
    return frame[list(TRIAL_COLUMNS)].reset_index(drop=True)


def parameter_importances(trials: pd.DataFrame, *, direction: str | None,
                          space: dict[str, Any] | None) -> tuple[dict[str, float], str | None]:
    """Optuna's importances of draft, gamma (and ngram_max where tuned) for the objective, or why not."""
    completed = trials[(trials["state"] == "COMPLETE") & trials["value"].notna()]
    if direction is None:
        return {}, "no recommendation.json: the objective's direction is unknown"
    if len(completed) < MIN_TRIALS_FOR_IMPORTANCE:
        return {}, f"{len(completed)} completed trials; importances need at least {MIN_TRIALS_FOR_IMPORTANCE}"
    import optuna  # fANOVA on the trials: loaded only when a tune is reported

    distributions = _distributions(completed, space)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created" line
    try:
        study = optuna.create_study(direction=direction, storage=optuna.storages.InMemoryStorage())
    finally:
        optuna.logging.set_verbosity(verbosity)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental-API and few-trial warnings; the caption says it
        try:
            for row in completed.to_dict("records"):
                params = {"draft": row["draft"], "gamma": int(row["gamma"])}
                if "ngram_max" in distributions and not pd.isna(row["ngram_max"]) and _tuned_ngram(row["draft"], space):
                    params["ngram_max"] = int(row["ngram_max"])
                study.add_trial(optuna.trial.create_trial(
                    params=params, distributions={k: distributions[k] for k in params}, value=float(row["value"])))
            importances = optuna.importance.get_param_importances(
                study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0))
        except (RuntimeError, ValueError) as error:  # e.g. a draft the recorded search space does not list
            return {}, f"Optuna could not compute importances: {str(error).splitlines()[0]}"
    if not importances:
        return {}, "no parameter varied across the completed trials"
    return {name: float(value) for name, value in importances.items()}, None


def _distributions(completed: pd.DataFrame, space: dict[str, Any] | None) -> dict[str, Any]:
    """The search space's distributions, from recommendation.json, else from the values seen."""
    import optuna

    drafts = [d["name"] for d in (space or {}).get("drafts", [])] or sorted(completed["draft"].astype(str).unique())
    low, high = (space or {}).get("gamma") or (int(completed["gamma"].min()), int(completed["gamma"].max()))
    distributions: dict[str, Any] = {"draft": optuna.distributions.CategoricalDistribution(drafts),
                                     "gamma": optuna.distributions.IntDistribution(int(low), int(high))}
    ranges = [(d["ngram_max_low"], d["ngram_max_high"]) for d in (space or {}).get("drafts", [])
              if d.get("method") == "ngram" and d.get("ngram_max_low") != d.get("ngram_max_high")]
    if ranges:
        distributions["ngram_max"] = optuna.distributions.IntDistribution(min(r[0] for r in ranges),
                                                                          max(r[1] for r in ranges))
    return distributions


def _tuned_ngram(draft: str, space: dict[str, Any] | None) -> bool:
    return any(d["name"] == draft and d.get("method") == "ngram" and d.get("ngram_max_low") != d.get("ngram_max_high")
               for d in (space or {}).get("drafts", []))


# --- display ---------------------------------------------------------------------------------------


def display_trials(report: StudyReport) -> pd.DataFrame:
    """DISPLAY_COLUMNS as strings."""
    rows = [(
        str(row["number"]), str(row["role"]), str(row["state"]).lower(), str(row["point_id"]),
        fmt(row["value"], ".4g"), fmt(row["best_so_far"], ".4g"), fmt(row["speedup"], ".2f", "x"),
        fmt(row["warm_start_prediction"], ".2f", "x"), fmt(row["prompts_measured"], "d"),
    ) for row in report.trials.to_dict("records")]
    return pd.DataFrame(rows, columns=DISPLAY_COLUMNS)


def recommendation_line(report: StudyReport) -> str:
    """One sentence: what to deploy at this temperature, and how sure."""
    entry = report.recommendation
    if entry is None:
        return "no recommendation recorded for this study"
    if "point_id" not in entry:
        return f"no recommendation: {entry.get('reason', 'no completed trial')}"
    if not entry.get("speculate"):
        return f"do not speculate: {entry.get('reason')}"
    ci = entry.get("speedup_ci") or [None, None]
    return (f"deploy {entry['point_id']}: speedup {fmt(entry.get('speedup'), '.2f', 'x')} "
            f"(95% CI {fmt(ci[0], '.2f')}-{fmt(ci[1], '.2f')}), {report.objective} "
            f"{fmt(entry.get('objective_value'), '.4g')} (median over repeats), chosen by trial {entry.get('trial')} "
            f"after {entry.get('evaluations')} evaluations")


def importance_line(report: StudyReport) -> str:
    if not report.importances:
        return f"parameter importances: not computed ({report.importance_note})"
    return "parameter importances (Optuna, fANOVA): " + ", ".join(
        f"{name} {value:.2f}" for name, value in report.importances.items())

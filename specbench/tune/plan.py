"""What a tune is: its settings (validated where they enter), the studies it runs (one per temperature and
top_p) and the plan every worker receives; the tune's result."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from specbench.tune.document import RECOMMENDATION_FILE, Recommendation
from specbench.core.manifest import MANIFEST_FILE
from specbench.core import results
from specbench.profile import Profile
from specbench.sweep.plan import temperature_groups
from specbench.scaleout.storage import (
    DEFAULT_STORAGE_FILE, check_study, close_storage, delete_study, open_storage, storage_url,
)
from specbench.tune.evaluate import Replay
from specbench.tune.load import LoadLevel, plan_levels
from specbench.tune.objectives import Constraints, Objective, TuneError
from specbench.tune.space import SearchSpace, space_from_profile
from specbench.tune.warmstart import unavailable_with

TRIALS_FILE = "trials.parquet"
RECOMMENDATION_TOML = "recommendation.toml"


def study_name(base: str, temperature: float, top_p: float) -> str:
    return f"{base}-t{temperature:g}-p{top_p:g}"


@dataclass(frozen=True)
class TuneSettings:
    objective: Objective
    constraints: Constraints = field(default_factory=Constraints)
    trials: int = 20
    seed: int = 0
    warm_start: int = 3  # predicted-best configurations tried right after the calibration trials
    tolerance: float = 0.01  # near-ties: within max(noise, tolerance x best) of the best
    prune: bool = True
    storage: str | None = None
    study: str | None = None
    workers: int = 1
    fresh: bool = False
    load_mix: str | None = None  # --load-mix: the weight of each load level (default: the profile's [load] mix)
    verify: bool = True  # launch what is recommended (a server backend) and measure it beside the alternatives

    def __post_init__(self) -> None:
        for name in ("trials", "workers"):
            if getattr(self, name) < 1:
                raise TuneError(f"--{name}: must be an integer >= 1 (got {getattr(self, name)})")
        if self.warm_start < 0:
            raise TuneError(f"--warm-start: must be an integer >= 0 (got {self.warm_start})")
        if self.tolerance < 0:
            raise TuneError(f"--tolerance: must be >= 0 (got {self.tolerance:g})")


@dataclass(frozen=True)
class Group:
    temperature: float
    top_p: float
    study: str


@dataclass(frozen=True)
class Plan:
    """Everything a worker needs; picklable, so local worker processes receive it."""

    profile: Profile
    space: SearchSpace
    settings: TuneSettings
    out_dir: Path
    storage_url: str
    groups: tuple[Group, ...]
    replay: Path | None
    levels: tuple[LoadLevel, ...] = (LoadLevel(1, None, 1.0),)  # the load levels every trial is measured at

    @property
    def warm_start_unavailable(self) -> str | None:
        """Why the analytic warm start cannot be computed from this profile's backend, or None."""
        return unavailable_with(self.profile.backend)

    def attrs(self, group: Group) -> dict[str, Any]:
        """Stored with each study; a study is resumed only with the same ones."""
        attrs = {"search_space": self.space.describe(), "objective": self.settings.objective.name,
                 "constraints": [self.settings.constraints.max_peak_memory_mb,
                                 self.settings.constraints.min_acceptance_rate],
                 "temperature": group.temperature, "top_p": group.top_p}
        if len(self.levels) > 1:  # a trial's value is the objective over these levels, weighted so
            attrs["load_levels"] = [[level.concurrency, level.request_rate, level.weight] for level in self.levels]
        return attrs


@dataclass
class TuneResult:
    out_dir: Path
    trials: pd.DataFrame
    recommendation: Recommendation
    profile_toml: str


def make_plan(profile: Profile | None, *, out_dir: Path, settings: TuneSettings, replay: Path | None) -> Plan:
    if replay is not None:
        if profile is not None:
            raise TuneError("--replay uses the profile recorded in the run folder; give no PROFILE with it")
        profile = Replay(replay).profile
    assert profile is not None
    where = str(profile.source) if profile.source else "profile"
    imposing = [index for index, draft in enumerate(profile.drafts) if draft.acceptance]
    if imposing:
        raise TuneError(f"{where}: drafts[{imposing[0]}].acceptance: tune searches real drafts; an imposed acceptance "
                        "is a what-if for `specbench run` (remove acceptance to tune this draft)")
    space = space_from_profile(profile, tune_ngram=replay is None)
    base = settings.study or f"{profile.name}-{settings.objective.name}"
    groups = tuple(Group(t, p, study_name(base, t, p)) for t, p in temperature_groups(profile))
    levels = plan_levels(profile, settings.load_mix or profile.load.mix,
                         key="--load-mix" if settings.load_mix else f"{where}: load.mix")
    if relative := profile.slo.relative():
        raise TuneError(f"{where}: slo.{next(iter(relative))}: a tune judges every trial against the same limits: give "
                        "them in milliseconds (limits relative to the baseline's serial figures, \"Nx serial\", are "
                        "for specbench run)")
    if settings.objective.name == "goodput" and not profile.slo.given():
        raise TuneError(f"--objective goodput: {where} has no [slo] table: goodput counts the requests that meet "
                        "every SLO (add e.g. [slo] ttft_ms = 2000, tpot_ms = 150)")
    if settings.objective.name == "capacity":  # a trial searches its own load levels
        levels = (LoadLevel(1, None, 1.0),)
    if settings.objective.name == "capacity" and (profile.capacity is None or replay is not None):
        raise TuneError(f"--objective capacity: {where} has no [capacity] table: a trial is one capacity search (add "
                        "[capacity], with an [slo])" if replay is None else
                        "--objective capacity: capacity searches run on the engine; --replay cannot answer them")
    if settings.objective.name == "capacity" and not profile.capacity.rate:
        raise TuneError(f"--objective capacity: a trial searches the highest request rate, which {where} turns off "
                        "([capacity] rate = false): remove it")
    if len(levels) > 1 and settings.objective.is_pareto:
        raise TuneError("--objective pareto: with several load levels, tune one objective over the load mix "
                        "(tokens_per_s, speedup, goodput or a latency percentile)")
    plan = Plan(profile, space, settings, out_dir, storage_url(settings.storage, out_dir), groups, replay, levels)
    if settings.storage is not None or (out_dir / DEFAULT_STORAGE_FILE).exists():
        storage = open_storage(plan.storage_url)
        if not settings.fresh:
            for group in groups:
                check_study(storage, group.study, plan.attrs(group))
    return plan


def clear(plan: Plan) -> None:
    """--fresh: drop this tune's studies and files (the run's own files too, unless replaying); refused while a trial of
    another worker runs in them (a late box must not delete the study the others work in)."""
    if plan.settings.storage is not None or (plan.out_dir / DEFAULT_STORAGE_FILE).exists():
        storage = open_storage(plan.storage_url)
        names = [group.study for group in plan.groups] + [f"{plan.groups[0].study}-verification"]
        for name in names:
            running = running_elsewhere(storage, name)
            if running:
                raise TuneError(f"--fresh: study {name!r} has {len(running)} trial(s) running (worker "
                                f"{running[0].user_attrs.get('worker', '?')}); let the tune finish or stop its workers "
                                "first, or use --study NAME for a new study")
        if plan.settings.storage is None:
            close_storage(plan.storage_url)
            (plan.out_dir / DEFAULT_STORAGE_FILE).unlink(missing_ok=True)
        else:
            for name in names:
                delete_study(storage, name)
    names = [TRIALS_FILE, RECOMMENDATION_FILE, RECOMMENDATION_TOML]
    if plan.replay is None:
        names += [results.REQUESTS_FILE, results.POINTS_FILE, MANIFEST_FILE]
    for name in names:
        (plan.out_dir / name).unlink(missing_ok=True)
    if plan.replay is None:
        shutil.rmtree(plan.out_dir / "verify", ignore_errors=True)  # the verification of an earlier recommendation


def running_elsewhere(storage, name: str) -> list:
    """The trials of study `name` still running once those whose heartbeats stopped are failed."""
    import optuna

    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return []
    optuna.storages.fail_stale_trials(study)
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))



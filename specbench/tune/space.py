"""What `specbench tune` searches: the search space read from a profile (drafts, gammas, n-gram sizes), as Optuna
distributions. What it optimises is specbench.tune.objectives."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from specbench.engines import ENGINES, EngineError, Speculation
from specbench.profile import Profile
from specbench.core.results import PointSpec, point_id
from specbench.tune.objectives import TuneError


@dataclass(frozen=True)
class DraftChoice:
    name: str
    method: str  # draft | ngram
    model: str | None
    quantize: str | None
    ngram_min: int | None
    ngram_max_low: int | None  # the range tuned for ngram_max (one value when not tuned)
    ngram_max_high: int | None


@dataclass(frozen=True)
class Config:
    """One point of the search space at a fixed temperature."""

    draft: str
    gamma: int
    ngram_max: int | None = None


@dataclass(frozen=True)
class SearchSpace:
    """drafts (categorical) x gamma (integer range) x, for n-gram drafts, the longest n-gram matched
    (integer range ngram_min..ngram_max of the profile); with a serving engine, less the combinations its
    flag mapping refuses (llama.cpp: an n-gram longer than gamma drafts nothing)."""

    drafts: tuple[DraftChoice, ...]
    gamma_low: int
    gamma_high: int
    engine: str | None = None  # the serving engine of a server-backend profile (specbench.engines)

    def describe(self) -> dict[str, Any]:
        """Plain data stored with the study: a study is only resumed with the same space."""
        described = {"drafts": [asdict(d) for d in self.drafts], "gamma": [self.gamma_low, self.gamma_high]}
        return described if self.engine is None else {**described, "engine": self.engine}

    def draft(self, name: str) -> DraftChoice:
        return next(d for d in self.drafts if d.name == name)

    def configs(self) -> list[Config]:
        """Every point of the space the engine runs, in profile order."""
        return [config for config in self.grid() if self.refusal(config) is None]

    def grid(self) -> list[Config]:
        """Every combination of the ranges, whether or not the engine runs it."""
        out = []
        for draft in self.drafts:
            ngrams = range(draft.ngram_max_low, draft.ngram_max_high + 1) if draft.method == "ngram" else [None]
            for ngram_max, gamma in itertools.product(ngrams, range(self.gamma_low, self.gamma_high + 1)):
                out.append(Config(draft.name, gamma, ngram_max))
        return out

    def refusal(self, config: Config) -> str | None:
        """Why the serving engine refuses `config` (its flag mapping's error), or None."""
        if self.engine is None:
            return None
        draft = self.draft(config.draft)
        try:
            ENGINES[self.engine].speculation_args(Speculation(draft.method, config.gamma, draft.model, draft.ngram_min,
                                                              config.ngram_max))
        except EngineError as error:
            return str(error)
        return None

    def sample(self, pick: Callable[[str, BaseDistribution], Any]) -> Config:
        """Define-by-run: `pick` chooses each parameter from its distribution; ngram_max only for n-gram drafts
        with a range to tune."""
        name = pick("draft", CategoricalDistribution([d.name for d in self.drafts]))
        gamma = pick("gamma", IntDistribution(self.gamma_low, self.gamma_high))
        draft = self.draft(name)
        if draft.method != "ngram":
            return Config(name, gamma)
        if draft.ngram_max_low == draft.ngram_max_high:
            return Config(name, gamma, draft.ngram_max_high)
        return Config(name, gamma, pick("ngram_max", IntDistribution(draft.ngram_max_low, draft.ngram_max_high)))

    def suggest(self, trial: optuna.Trial) -> Config:
        """The trial's configuration, suggested parameter by parameter (the sampler has fixed it)."""
        def pick(name: str, distribution: BaseDistribution) -> Any:
            if isinstance(distribution, CategoricalDistribution):
                return trial.suggest_categorical(name, list(distribution.choices))
            return trial.suggest_int(name, distribution.low, distribution.high)

        return self.sample(pick)

    def params(self, config: Config) -> dict[str, Any]:
        """The trial parameters of `config`."""
        params: dict[str, Any] = {"draft": config.draft, "gamma": config.gamma}
        draft = self.draft(config.draft)
        if draft.method == "ngram" and draft.ngram_max_low != draft.ngram_max_high:
            params["ngram_max"] = config.ngram_max
        return params

    def config(self, params: dict[str, Any]) -> Config:
        """The configuration of trial parameters (the inverse of `params`)."""
        draft = self.draft(params["draft"])
        ngram_max = params.get("ngram_max", draft.ngram_max_high) if draft.method == "ngram" else None
        return Config(draft.name, params["gamma"], ngram_max)

    def nearest(self, config: Config, *, among: list[Config]) -> Config | None:
        """The configuration of `among` nearest to `config`: the same draft first, then the fewest steps of gamma
        and ngram_max; ties go to the earlier in profile order (the smaller gamma)."""
        def distance(other: Config) -> tuple[bool, int]:
            return (other.draft != config.draft,
                    abs(other.gamma - config.gamma) + abs((other.ngram_max or 0) - (config.ngram_max or 0)))

        return min(among, key=distance, default=None)

    def calibration_configs(self) -> list[Config]:
        """One per draft at the largest gamma (and the longest n-gram) the engine runs: the warm start's
        measurements."""
        configs = self.configs()
        return [max((c for c in configs if c.draft == d.name), key=lambda c: (c.gamma, c.ngram_max or 0))
                for d in self.drafts]

    def point(self, config: Config, *, temperature: float, top_p: float, concurrency: int | None = 1,
              request_rate: float | None = None) -> PointSpec:
        draft = self.draft(config.draft)
        tuned = draft.method == "ngram" and draft.ngram_max_low != draft.ngram_max_high
        concurrency = None if request_rate is not None else concurrency
        return PointSpec(
            point_id=point_id(draft.name, config.gamma, temperature, top_p, ngram_max=config.ngram_max if tuned else None,
                              concurrency=concurrency, request_rate=request_rate),
            method=draft.method,
            draft=draft.name, gamma=config.gamma, temperature=temperature, top_p=top_p,
            draft_model=draft.model, draft_quantize=draft.quantize,
            ngram_min=draft.ngram_min, ngram_max=config.ngram_max, concurrency=concurrency, request_rate=request_rate,
        )


def space_from_profile(profile: Profile, *, tune_ngram: bool = True) -> SearchSpace:
    """gamma spans the profile's smallest to largest gamma; without `tune_ngram` (a replay of a
    recorded grid) an n-gram draft keeps its ngram_max."""
    where = str(profile.source) if profile.source else "profile"
    if not profile.drafts:
        raise TuneError(f"{where}: drafts: empty search space (add at least one [[drafts]] table)")
    engine = _engine(profile)
    tune_ngram = tune_ngram and not getattr(ENGINES.get(engine), "no_ngram_window", None)  # SGLang has no n-gram length
    drafts = tuple(
        DraftChoice(
            name=d.name, method=d.method, model=d.model, quantize=d.quantize,
            ngram_min=d.ngram_min if d.method == "ngram" else None,
            ngram_max_low=(d.ngram_min if tune_ngram else d.ngram_max) if d.method == "ngram" else None,
            ngram_max_high=d.ngram_max if d.method == "ngram" else None,
        )
        for d in profile.drafts
    )
    gammas = profile.all_gammas() or profile.sweep.gamma
    space = SearchSpace(drafts, min(gammas), max(gammas), engine=engine)
    for index, draft in enumerate(drafts):
        configs = [c for c in space.grid() if c.draft == draft.name]
        if not any(space.refusal(c) is None for c in configs):
            raise TuneError(f"{where}: drafts[{index}] ({draft.name}): {space.engine} runs none of its configurations: "
                            f"{space.refusal(configs[-1])}")
    if len(space.configs()) < 2:
        raise TuneError(f"{where}: empty search space: one draft at one gamma leaves nothing to tune "
                        "(list more drafts or gammas, or use specbench run)")
    return space


def _engine(profile: Profile) -> str | None:
    """The serving engine whose flag mapping bounds the space: a server-backend profile that launches one."""
    server = profile.server
    if profile.backend != "server" or server is None or server.url is not None or server.engine not in ENGINES:
        return None
    return server.engine

"""recommendation.json, typed: what `specbench tune` recommends per temperature and how it searched, written and read
here only (recommendation.toml is the same choice as a runnable profile).

Each entry of `temperatures` is one study's choice: the configuration to deploy (or the baseline, and why), its
figures and their intervals, the engine flags, and under load the best configuration per level, the gamma schedule
and what verifying it measured. The file carries a `version`; files written before it had none and read as
version 1. Importable without Optuna (the report reads it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specbench.core.documents import check_version, checked_object, known, read_object, write_document
from specbench.core.errors import OneLineError

RECOMMENDATION_FILE = "recommendation.json"
VERSION = 1


class RecommendationError(OneLineError, ValueError):
    """A recommendation.json that cannot be read; the message names the file and the key."""


@dataclass
class Recommendation:
    objective: dict[str, Any]  # name, columns, directions
    temperatures: list[dict[str, Any]]  # one choice per study (temperature, top_p)
    space_size: int | None = None  # configurations in the search space
    constraints: dict[str, Any] = field(default_factory=dict)  # max_peak_memory_mb, min_acceptance_rate
    tolerance: float | None = None  # near-ties within max(noise, tolerance x best) prefer the smaller gamma
    seed: int | None = None
    storage: str | None = None  # the Optuna storage, its password masked
    warm_start: dict[str, Any] = field(default_factory=dict)  # configurations, available, reason
    replay: str | None = None  # the recorded run that answered the points, if any
    profile: str | None = None  # the tuned profile's name
    target: str | None = None
    search_space: dict[str, Any] = field(default_factory=dict)
    load_levels: list[dict[str, Any]] | None = None  # several load levels: each level and its share of the mix
    version: int = VERSION

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {key: value for key, value in data.items() if not (key == "load_levels" and value is None)}


def recommendation_from_dict(data: Any, *, source: str = RECOMMENDATION_FILE) -> Recommendation:
    """The recommendation, or a RecommendationError naming the file and the key that makes it unusable."""
    data = checked_object(data, source=source, error=RecommendationError)
    check_version(data, version=VERSION, source=source, error=RecommendationError,
                  again="tune again with this version's `specbench tune`")
    values = known(Recommendation, data)
    if missing := [key for key in ("objective", "temperatures") if values.get(key) is None]:
        raise RecommendationError(f"{source} lacks {', '.join(missing)}")
    if not isinstance(values["temperatures"], list) or not all(isinstance(c, dict) for c in values["temperatures"]):
        raise RecommendationError(f"{source}: `temperatures` is not a list of objects")
    if not isinstance(values["objective"], dict):
        raise RecommendationError(f"{source}: `objective` is not an object")
    return Recommendation(**values)


def write_recommendation(recommendation: Recommendation, folder: Path) -> Path:
    """recommendation.json in `folder`."""
    return write_document(recommendation.to_dict(), folder / RECOMMENDATION_FILE)


def read_recommendation(path: Path) -> Recommendation:
    return recommendation_from_dict(read_object(path, RecommendationError), source=path.name)

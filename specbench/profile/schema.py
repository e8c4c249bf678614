"""The whole profile: its top-level keys, its tables, and the rules that span tables (a backend and its drafts,
an engine and its flags, a capacity search and its SLO, ...)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, StrictStr, ValidationError, field_validator, model_validator

from specbench.core import imposed
from specbench.engines import ENGINES
from specbench.engines.base import SERVER_ONLY_METHODS, EngineError, Speculation
from specbench.core.loadmix import levels_of, parse_load_mix
from specbench.profile.capacity import CapacitySpec, capacity_problem
from specbench.profile.cost import CostSpec
from specbench.profile.drafts import NATIVE_METHODS, DraftSpec
from specbench.profile.fields import FolderName, ProfileError, Table
from specbench.profile.load import LoadSpec
from specbench.profile.mtp import mtp_problem
from specbench.profile.run import RunSpec
from specbench.profile.server import ServerSpec
from specbench.profile.slo import SloSpec
from specbench.profile.sweep import SweepSpec
from specbench.profile.target import TargetSpec
from specbench.profile.validation import describe, rule, show
from specbench.profile.workload import WorkloadSpec

BACKEND_NAMES = ("native", "hf", "server")  # how a point runs: specbench.backends has a module for each


class Profile(Table):
    name: FolderName
    backend: Literal[BACKEND_NAMES] = "native"  # type: ignore[valid-type]
    server: ServerSpec | None = None
    device: StrictStr = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    target: TargetSpec
    drafts: tuple[DraftSpec, ...] = ()
    sweep: SweepSpec
    workload: WorkloadSpec
    run: RunSpec = Field(default_factory=RunSpec)
    load: LoadSpec = Field(default_factory=LoadSpec)
    slo: SloSpec = Field(default_factory=SloSpec)
    capacity: CapacitySpec | None = None  # a capacity search per launch configuration (server backend, [slo])
    cost: CostSpec = Field(default_factory=CostSpec)
    _source: Path | None = PrivateAttr(default=None)

    @property
    def source(self) -> Path | None:
        """The file this profile was loaded from; not part of the profile's content."""
        return self._source

    @property
    def gpus_per_replica(self) -> int:
        """The GPUs one replica of what is measured uses: a launch's server.tensor_parallel; one in-process."""
        return self.server.tensor_parallel if self.server is not None else 1

    @property
    def usd_per_replica_hour(self) -> float | None:
        """[cost]'s price of a replica-hour, or its price of a GPU-hour times the GPUs a replica uses."""
        return self.cost.replica_usd_per_hour(self.gpus_per_replica)

    def gammas(self, draft: DraftSpec) -> tuple[int, ...]:
        """The gammas a draft is swept at: its gamma_schedule's largest, its own gamma, else sweep.gamma."""
        if draft.gamma_schedule is not None:
            return (max(g for _, _, g in draft.gamma_schedule),)
        return draft.gamma or self.sweep.gamma

    def all_gammas(self) -> tuple[int, ...]:
        """Every gamma some draft is swept at, in increasing order (none without drafts)."""
        return tuple(sorted({g for draft in self.drafts for g in self.gammas(draft)}))

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str) -> str:
        if re.fullmatch(r"auto|cpu|cuda(:\d+)?", device) is None:
            raise rule(f'must be "auto", "cpu", "cuda" or "cuda:N" (got {show(device)})')
        return device

    @model_validator(mode="after")
    def _fits_backend(self) -> "Profile":
        if self.backend == "server" and self.server is None:
            raise rule('backend "server" needs a [server] table (engine = "vllm", "llama.cpp", ... or url = ...)',
                        at=("server",))
        if self.backend == "server" and self.server.engine in ENGINES:
            self._fits_engine(ENGINES[self.server.engine])
        if self.backend != "server":
            if self.server is not None:
                raise rule(f'used only by backend = "server" (the profile runs backend "{self.backend}")',
                            at=("server",))
            for index, draft in enumerate(self.drafts):
                has = "draft, ngram, eagle3, medusa and mtp" if self.backend == "native" else "draft and ngram"
                if draft.method in NATIVE_METHODS and draft.method in SERVER_ONLY_METHODS and self.backend != "native":
                    raise rule(f'"{draft.method}" runs on backend "native" or "server" (backend "{self.backend}" '
                                f'has {has})', at=("drafts", index, "method"))
                if draft.method in SERVER_ONLY_METHODS and draft.method not in NATIVE_METHODS:
                    raise rule(f'"{draft.method}" runs only in serving engines: set backend = "server" '
                                f'(backend "{self.backend}" has {has})', at=("drafts", index, "method"))
                if draft.gamma_schedule is not None:
                    raise rule(f'a gamma per batch size is vLLM\'s setting: use backend = "server" with engine "vllm" '
                                f'(backend "{self.backend}" runs one gamma per point)',
                                at=("drafts", index, "gamma_schedule"))
            if self.sweep.concurrency != (1,):
                raise rule(f'backend "{self.backend}" runs one request at a time: use concurrency = [1], or '
                            'backend = "server"', at=("sweep", "concurrency"))
            if self.sweep.request_rate:
                raise rule(f'backend "{self.backend}" runs one request at a time and cannot honour an arrival rate: '
                            'remove request_rate, or use backend = "server"', at=("sweep", "request_rate"))
        return self

    def _fits_engine(self, engine) -> None:
        """Every draft x gamma the sweep launches maps onto the engine's flags (some combinations an engine
        accepts but ignores: refused here rather than measured as a silent baseline)."""
        for index, draft in enumerate(self.drafts):
            if draft.method not in engine.methods or draft.url is not None:
                continue  # named by the server backend, with the methods the engine has; an attached one runs already
            no_window = getattr(engine, "no_ngram_window", None)  # SGLang's n-gram takes no ngram_min / ngram_max
            for key in ("ngram_min", "ngram_max") if no_window and draft.method == "ngram" else ():
                if key in draft.model_fields_set:
                    raise rule(no_window, at=("drafts", index, key))
            if draft.gamma_schedule is not None:
                try:
                    engine.speculation_args(Speculation(draft.method, max(g for _, _, g in draft.gamma_schedule),
                                                        draft.model, draft.ngram_min, draft.ngram_max,
                                                        draft.gamma_schedule, vocabulary=draft.vocabulary))
                except EngineError as error:
                    raise rule(str(error), at=("drafts", index, "gamma_schedule")) from None
                continue
            for gamma in self.gammas(draft):
                try:
                    engine.speculation_args(Speculation(draft.method, gamma, draft.model, draft.ngram_min,
                                                        draft.ngram_max, vocabulary=draft.vocabulary))
                except EngineError as error:
                    key = ("drafts", index, error.field) if error.field else \
                        ("drafts", index, "gamma") if draft.gamma else ("sweep", "gamma")
                    raise rule(str(error), at=key) from None

    @model_validator(mode="after")
    def _mtp_has_layers(self) -> "Profile":
        if problem := mtp_problem(self):
            raise rule(problem[0], at=problem[1])
        return self

    @model_validator(mode="after")
    def _imposed_acceptance_runs(self) -> "Profile":
        """An acceptance what-if needs a backend that imposes it (native; vLLM's synthetic sampler), one gamma per
        launch, and an entry that fits every gamma the draft is swept at."""
        for index, draft in enumerate(self.drafts):
            if not draft.acceptance:
                continue
            at = ("drafts", index, "acceptance")
            engine = ENGINES.get(self.server.engine) if self.server is not None else None
            if self.backend == "hf":
                raise rule('backend "hf" verifies inside transformers\' generate and cannot impose an acceptance: use '
                           'backend = "native", or "server" with engine "vllm"', at=at)
            if self.backend == "server" and not getattr(engine, "imposes_acceptance", False):
                name = self.server.engine or "an attached server"
                raise rule(f"{name} has no synthetic acceptance to impose it with (vLLM 0.32 and later have: "
                           'rejection_sample_method = "synthetic"): use engine = "vllm", or backend = "native"', at=at)
            if draft.gamma_schedule is not None:
                raise rule("an imposed acceptance gives rates per position at one gamma: use gamma = [...] instead "
                           "of gamma_schedule", at=at)
            for gamma in self.gammas(draft):
                for number, entry in enumerate(draft.acceptance):
                    if problem := imposed.entry_problem(entry, gamma, largest=max(self.gammas(draft))):
                        raise rule(f"entry {number}: {problem}", at=at)
        return self

    @model_validator(mode="after")
    def _compile_on_native(self) -> "Profile":
        if self.run.compile and self.backend != "native":
            raise rule(f'compiles the native backend\'s steps; backend "{self.backend}" runs its own (remove it or '
                        'use --no-compile)', at=("run", "compile"))
        return self

    @model_validator(mode="after")
    def _capacity_runs(self) -> "Profile":
        if problem := capacity_problem(backend=self.backend, slo_limits=self.slo.given(), capacity=self.capacity):
            raise problem
        return self

    @model_validator(mode="after")
    def _relative_slo_has_its_reference(self) -> "Profile":
        relative = self.slo.relative()
        if relative and 1 not in self.sweep.concurrency:
            name = next(iter(relative))
            raise rule(f"{show(self.slo.given()[name])} is relative to the baseline's serial figures, its point at "
                       "concurrency 1: add 1 to [sweep] concurrency, or give the limit in milliseconds",
                       at=("slo", name))
        return self

    @model_validator(mode="after")
    def _known_mix(self) -> "Profile":
        try:
            self.load.mix and parse_load_mix(self.load.mix, levels_of(self.sweep.concurrency, self.sweep.request_rate))
        except ValueError as error:
            raise rule(str(error), at=("load", "mix")) from None
        return self

    @model_validator(mode="after")
    def _distinct_draft_names(self) -> "Profile":
        seen: set[str] = set()
        for index, draft in enumerate(self.drafts):
            if draft.name == "baseline":
                raise rule(
                    '"baseline" is reserved for the target-only run (choose another name)',
                    at=("drafts", index, "name"),
                )
            if draft.name in seen:
                raise rule(
                    f'duplicate draft name "{draft.name}" (give each draft its own name)',
                    at=("drafts", index, "name"),
                )
            seen.add(draft.name)
        return self

    @model_validator(mode="after")
    def _attached_deployments(self) -> "Profile":
        """With server.url (the baseline's deployment) every draft names the deployment that runs it; without, none."""
        attached = self.server is not None and self.server.url is not None
        for index, draft in enumerate(self.drafts):
            if draft.url is not None and not attached:
                raise rule("used with server.url, the baseline's running deployment: set server.url, or remove url to "
                           "let specbench launch this draft", at=("drafts", index, "url"))
            if draft.url is None and attached:
                raise rule("required with server.url: the url of the running deployment that serves this draft "
                           "(nothing is launched)", at=("drafts", index, "url"))
            if draft.url is not None and len(self.gammas(draft)) != 1:
                raise rule("a running deployment drafts at one gamma: set gamma = [N] to the one it runs",
                           at=("drafts", index, "gamma"))
            if draft.url is not None and draft.url.rstrip("/") == self.server.url.rstrip("/"):
                raise rule("is server.url, the baseline's deployment: give the deployment that runs this draft",
                           at=("drafts", index, "url"))
        return self

    def __eq__(self, other: object) -> bool:
        """Same content, wherever each was loaded from."""
        if not isinstance(other, Profile):
            return NotImplemented
        return self.model_dump() == other.model_dump()

    def __hash__(self) -> int:
        return hash(json.dumps(self.model_dump(mode="json"), sort_keys=True))




def profile_from_dict(data: dict, *, source: Path | None = None) -> Profile:
    """Validate TOML-shaped data; relative paths resolve against `source`'s folder (or cwd)."""
    where = str(source) if source is not None else "profile"
    base_dir = source.parent if source is not None else Path.cwd()
    try:
        profile = Profile.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as error:
        raise ProfileError(f"{where}: {describe(error.errors()[0], root=Profile)}") from None
    profile._source = source
    return profile

"""Profiles: the TOML file that says what to benchmark, validated once where it enters.

A profile names a target model, the drafts to try against it, the sweep of gamma /
temperature / top_p points, the workload (prompts) and how often to repeat each point.
Every problem is reported as a `ProfileError` whose message is one line naming the file,
the key and what to do, e.g. `profiles/x.toml: sweep.gamma[1]: must be an integer >= 1 (got 0)`.
"""

import json
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import tomli_w
from pydantic import (
    AfterValidator,
    BaseModel,
    StrictBool,
    ConfigDict,
    Field,
    PrivateAttr,
    Strict,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from specbench.backends import BACKENDS
from specbench.profile.capacity import CapacitySpec, CostSpec, capacity_problem
from specbench.profile.server import ServerSpec
from specbench.engines import ENGINES
from specbench.engines.base import SERVER_ONLY_METHODS, EngineError, Speculation, check_schedule
from specbench.core.loadmix import levels_of, parse_load_mix
from specbench.profile.validation import check as _check
from specbench.profile.validation import converted as _converted
from specbench.profile.validation import describe
from specbench.profile.validation import distinct_values as _distinct_values
from specbench.profile.validation import rule as _rule
from specbench.profile.validation import show as _show
from specbench.profile.references import ModelReference, PromptsReference, is_trained_head

DEFAULT_PROFILE = "profiles/quickstart.toml"
"""Used when no profile is given; relative to the current directory (the project root)."""

class ProfileError(ValueError):
    """A profile that cannot be used; the message is always a single line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.splitlines()))


PositiveInt = Annotated[StrictInt, _check(lambda v: v >= 1, "an integer >= 1")]
PositiveFloat = Annotated[float, Strict(), _check(lambda v: v > 0, "a number > 0")]
NonNegativeInt = Annotated[StrictInt, _check(lambda v: v >= 0, "an integer >= 0")]
Temperature = Annotated[float, Strict(), _check(lambda v: v >= 0, "a number >= 0")]
TopP = Annotated[float, Strict(), _check(lambda v: 0 < v <= 1, "a number in (0, 1]")]
FolderName = Annotated[
    StrictStr,
    _check(
        lambda v: re.fullmatch(r"(?!\.+$)[A-Za-z0-9._-]+", v) is not None,
        "usable as a folder name: letters, digits, '.', '_' or '-'",
    ),
]

Axis = AfterValidator(_distinct_values)
OutputBudget = Annotated[Any, _check(lambda v: v == "dataset" or (type(v) is int and v >= 1),
                                     'an integer >= 1 or "dataset"')]
Quantize = Literal["int8"]


# --- the schema --------------------------------------------------------------------------


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TargetSpec(_Spec):
    model: ModelReference
    quantize: Quantize | None = None

    @model_validator(mode="after")
    def _not_a_head(self) -> "TargetSpec":
        if is_trained_head(self.model):
            raise _rule("trained:... names an EAGLE-3 head for a draft, not a target (set a model)", at=("model",))
        return self


DRAFT_MODEL_METHODS = ("draft", "eagle", "eagle3", "medusa")  # need a model: the draft, or the target's heads
NATIVE_METHODS = ("draft", "ngram", "eagle3")  # what the native backend drafts with (hf: draft and ngram)


class DraftSpec(_Spec):
    name: FolderName
    method: Literal["draft", "ngram", "eagle", "eagle3", "mtp", "medusa"]
    model: ModelReference | None = None
    quantize: Quantize | None = None
    ngram_min: PositiveInt = 1
    ngram_max: PositiveInt = 3
    # a gamma per batch size, [[first, last, gamma], ...] from batch size 1 (gamma 0: no drafting there), instead of
    # the sweep's gammas: vLLM's num_speculative_tokens_per_batch_size, as `specbench tune` recommends it under load
    gamma_schedule: Annotated[tuple[tuple[StrictInt, ...], ...], _converted(check_schedule, EngineError)] | None = None
    # this draft's gammas instead of sweep.gamma (e.g. an n-gram lookup that needs gamma >= its n-gram size on
    # llama.cpp, beside a head swept from 1)
    gamma: Annotated[tuple[PositiveInt, ...], Axis] | None = None

    @model_validator(mode="after")
    def _fits_method(self) -> "DraftSpec":
        if self.gamma is not None and self.gamma_schedule is not None:
            raise _rule("gamma_schedule already sets this draft's gammas (remove gamma)", at=("gamma",))
        if self.model is not None and is_trained_head(self.model) and self.method != "eagle3":
            raise _rule(f'trained:... is an EAGLE-3 head: set method = "eagle3", or a draft model for '
                        f'method "{self.method}"', at=("model",))
        if self.method != "ngram":
            if self.model is None and self.method in DRAFT_MODEL_METHODS:
                raise _rule(
                    f'required for method "{self.method}" (set model = "builtin:..." or a hub id/path)',
                    at=("model",),
                )
            for key in ("ngram_min", "ngram_max"):
                if key in self.model_fields_set:
                    raise _rule(f'not used by method "{self.method}" (remove it)', at=(key,))
        else:
            for key in ("model", "quantize"):
                if getattr(self, key) is not None:
                    raise _rule(
                        'not used by method "ngram" (remove it, or set method = "draft")',
                        at=(key,),
                    )
            if self.ngram_min > self.ngram_max:
                raise _rule(
                    f"must be <= ngram_max = {self.ngram_max} (got {self.ngram_min})",
                    at=("ngram_min",),
                )
        return self


class SweepSpec(_Spec):
    gamma: Annotated[tuple[PositiveInt, ...], Axis]
    temperature: Annotated[tuple[Temperature, ...], Axis]
    top_p: Annotated[tuple[TopP, ...], Axis] = (1.0,)
    concurrency: Annotated[tuple[PositiveInt, ...], Axis] = (1,)  # requests in flight; > 1 on the server backend
    # open-loop load levels besides the closed-loop concurrency ones: requests/s arriving as a (seeded) Poisson
    # process, whatever the server's state; the server backend only
    request_rate: Annotated[tuple[PositiveFloat, ...], Axis] = ()


class LoadSpec(_Spec):
    """How a request-rate level sends: how many requests, and how bursty their arrivals are."""

    requests: PositiveInt | None = None  # per request-rate level; default: every prompt x repeat once
    # the gaps between arrivals are gamma-distributed with this shape (as vLLM's benchmark client draws them):
    # 1 is a Poisson process, below 1 burstier, above 1 more regular
    burstiness: PositiveFloat = 1.0
    # the share of each load level in the traffic, "1:0.5,4:0.3,r0.5:0.2" (concurrency levels by number, request
    # rates as rN): `specbench tune` weighs the levels so (default: equally); checked against the sweep's levels
    mix: StrictStr | None = None


class SloSpec(_Spec):
    """Service-level objectives: a request meets them when each one given holds (goodput counts those)."""

    ttft_ms: PositiveFloat | None = None
    tpot_ms: PositiveFloat | None = None
    e2e_ms: PositiveFloat | None = None

    def limits(self) -> dict[str, float]:
        """{request column: limit} of the objectives given."""
        return {name: value for name, value in self.model_dump().items() if value is not None}


class WorkloadSpec(_Spec):
    prompts: PromptsReference
    max_prompts: PositiveInt | None = None  # ShareGPT: the conversations sampled (vllm bench serve's --num-prompts)
    # output tokens per request: a number, or "dataset" for each request's reference reply length (ShareGPT,
    # HumanEval, a file's "max_new_tokens"), then at most max_new_tokens_cap
    max_new_tokens: OutputBudget = 128
    max_new_tokens_cap: PositiveInt | None = None
    # generate the whole budget whatever the model emits: no request stops at an end-of-sequence token
    ignore_eos: StrictBool = False
    turns: PositiveInt = 1  # ShareGPT: up to this many requests per conversation, each with the turns before it
    # every request gets one of `shared_prefixes` system prompts of `shared_prefix_tokens` tokens (prefix caching)
    shared_prefixes: NonNegativeInt = 0
    shared_prefix_tokens: PositiveInt | None = None
    categories: Annotated[tuple[StrictStr, ...], Axis] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "WorkloadSpec":
        sharegpt = self.prompts == "builtin:sharegpt" or self.prompts.endswith(".json")
        if self.max_new_tokens_cap is not None and self.max_new_tokens != "dataset":
            raise _rule('caps the dataset\'s lengths: set max_new_tokens = "dataset", or remove it',
                        at=("max_new_tokens_cap",))
        if self.turns > 1 and not sharegpt:
            raise _rule('unrolls ShareGPT conversations: use prompts = "builtin:sharegpt" (or a ShareGPT .json), '
                        'or remove it (a .jsonl line may carry a whole conversation in "messages")', at=("turns",))
        if sharegpt and self.max_prompts is None:
            raise _rule("required with a ShareGPT workload: how many conversations to sample (vllm bench serve's "
                        "--num-prompts), e.g. max_prompts = 100", at=("max_prompts",))
        if bool(self.shared_prefixes) != (self.shared_prefix_tokens is not None):
            raise _rule("shared_prefixes and shared_prefix_tokens go together (e.g. shared_prefixes = 4, "
                        "shared_prefix_tokens = 512)",
                        at=("shared_prefix_tokens" if self.shared_prefixes else "shared_prefixes",))
        return self


class RunSpec(_Spec):
    repeats: PositiveInt = 1
    warmup: NonNegativeInt = 1
    seed: StrictInt = 0
    # native backend: static KV caches and compiled steps (CUDA graphs on a GPU); unset: on a GPU, off on a CPU
    compile: StrictBool | None = None


class Profile(_Spec):
    name: FolderName
    backend: Literal[tuple(BACKENDS)] = "native"  # type: ignore[valid-type] - the names of specbench.backends
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
            raise _rule(f'must be "auto", "cpu", "cuda" or "cuda:N" (got {_show(device)})')
        return device

    @model_validator(mode="after")
    def _fits_backend(self) -> "Profile":
        if self.backend == "server" and self.server is None:
            raise _rule('backend "server" needs a [server] table (engine = "vllm", "llama.cpp", ... or url = ...)',
                        at=("server",))
        if self.backend == "server" and self.server.engine in ENGINES:
            self._fits_engine(ENGINES[self.server.engine])
        if self.backend != "server":
            if self.server is not None:
                raise _rule(f'used only by backend = "server" (the profile runs backend "{self.backend}")',
                            at=("server",))
            for index, draft in enumerate(self.drafts):
                has = "draft, ngram and eagle3" if self.backend == "native" else "draft and ngram"
                if draft.method in NATIVE_METHODS and draft.method in SERVER_ONLY_METHODS and self.backend != "native":
                    raise _rule(f'"{draft.method}" runs on backend "native" or "server" (backend "{self.backend}" '
                                f'has {has})', at=("drafts", index, "method"))
                if draft.method in SERVER_ONLY_METHODS and draft.method not in NATIVE_METHODS:
                    raise _rule(f'"{draft.method}" runs only in serving engines: set backend = "server" '
                                f'(backend "{self.backend}" has {has})', at=("drafts", index, "method"))
                if draft.gamma_schedule is not None:
                    raise _rule(f'a gamma per batch size is vLLM\'s setting: use backend = "server" with engine "vllm" '
                                f'(backend "{self.backend}" runs one gamma per point)',
                                at=("drafts", index, "gamma_schedule"))
            if self.sweep.concurrency != (1,):
                raise _rule(f'backend "{self.backend}" runs one request at a time: use concurrency = [1], or '
                            'backend = "server"', at=("sweep", "concurrency"))
            if self.sweep.request_rate:
                raise _rule(f'backend "{self.backend}" runs one request at a time and cannot honour an arrival rate: '
                            'remove request_rate, or use backend = "server"', at=("sweep", "request_rate"))
        return self

    def _fits_engine(self, engine) -> None:
        """Every draft x gamma the sweep launches maps onto the engine's flags (some combinations an engine
        accepts but ignores: refused here rather than measured as a silent baseline)."""
        for index, draft in enumerate(self.drafts):
            if draft.method not in engine.methods:
                continue  # named by the server backend, with the methods the engine has
            if draft.gamma_schedule is not None:
                try:
                    engine.speculation_args(Speculation(draft.method, max(g for _, _, g in draft.gamma_schedule),
                                                        draft.model, draft.ngram_min, draft.ngram_max,
                                                        draft.gamma_schedule))
                except EngineError as error:
                    raise _rule(str(error), at=("drafts", index, "gamma_schedule")) from None
                continue
            for gamma in self.gammas(draft):
                try:
                    engine.speculation_args(Speculation(draft.method, gamma, draft.model, draft.ngram_min,
                                                        draft.ngram_max))
                except EngineError as error:
                    raise _rule(str(error), at=("drafts", index, "gamma") if draft.gamma else ("sweep", "gamma")) \
                        from None

    @model_validator(mode="after")
    def _compile_on_native(self) -> "Profile":
        if self.run.compile and self.backend != "native":
            raise _rule(f'compiles the native backend\'s steps; backend "{self.backend}" runs its own (remove it or '
                        'use --no-compile)', at=("run", "compile"))
        return self

    @model_validator(mode="after")
    def _capacity_runs(self) -> "Profile":
        if problem := capacity_problem(backend=self.backend, slo_limits=self.slo.limits(), capacity=self.capacity):
            raise problem
        return self

    @model_validator(mode="after")
    def _known_mix(self) -> "Profile":
        try:
            self.load.mix and parse_load_mix(self.load.mix, levels_of(self.sweep.concurrency, self.sweep.request_rate))
        except ValueError as error:
            raise _rule(str(error), at=("load", "mix")) from None
        return self

    @model_validator(mode="after")
    def _distinct_draft_names(self) -> "Profile":
        seen: set[str] = set()
        for index, draft in enumerate(self.drafts):
            if draft.name == "baseline":
                raise _rule(
                    '"baseline" is reserved for the target-only run (choose another name)',
                    at=("drafts", index, "name"),
                )
            if draft.name in seen:
                raise _rule(
                    f'duplicate draft name "{draft.name}" (give each draft its own name)',
                    at=("drafts", index, "name"),
                )
            seen.add(draft.name)
        return self

    def __eq__(self, other: object) -> bool:
        """Same content, wherever each was loaded from."""
        if not isinstance(other, Profile):
            return NotImplemented
        return self.model_dump() == other.model_dump()

    def __hash__(self) -> int:
        return hash(json.dumps(self.model_dump(mode="json"), sort_keys=True))


# --- public API --------------------------------------------------------------------------


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


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    if path.is_dir():
        raise ProfileError(f"{path}: is a folder (give the path of a .toml profile)")
    if not path.is_file():
        raise ProfileError(f"{path}: not found")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ProfileError(f"{path}: invalid TOML: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as error:
        raise ProfileError(f"{path}: {_toml_problem(str(error))}") from None
    return profile_from_dict(data, source=path)


def _toml_problem(message: str) -> str:
    """'Invalid value (at line 2, column 11)' -> 'invalid TOML at line 2: Invalid value'."""
    if match := re.fullmatch(r"(.*) \(at line (\d+), column \d+\)", message):
        return f"invalid TOML at line {match[2]}: {match[1]}"
    if match := re.fullmatch(r"(.*) \(at end of document\)", message):
        return f"invalid TOML at end of document: {match[1]}"
    return f"invalid TOML: {message}"


def _as_data(profile: Profile) -> dict:
    """The profile as TOML-shaped data: no None values, no keys its method ignores."""
    data = profile.model_dump(mode="json", exclude_none=True)
    for draft in data["drafts"]:
        if draft["method"] != "ngram":
            del draft["ngram_min"], draft["ngram_max"]
    if data["sweep"]["concurrency"] == [1]:
        del data["sweep"]["concurrency"]  # the default: profiles written before the axis existed stay as they were
    for key, default in (("request_rate", []),):
        if data["sweep"][key] == default:
            del data["sweep"][key]
    for table, default in (("load", LoadSpec()), ("slo", SloSpec()), ("cost", CostSpec())):
        if data[table] == default.model_dump(mode="json", exclude_none=True):
            del data[table]
    for key, default in (("ignore_eos", False), ("turns", 1), ("shared_prefixes", 0)):
        if data["workload"][key] == default:
            del data["workload"][key]  # keys added with dataset workloads: profiles written before stay as they were
    if "server" in data and not data["server"]["env"]:
        del data["server"]["env"]
    return data


def dump_profile(profile: Profile) -> str:
    """TOML text that `load_profile` reads back to an equal profile."""
    return tomli_w.dumps(_as_data(profile))


def with_overrides(
    profile: Profile,
    *,
    backend: str | None = None,
    device: str | None = None,
    max_prompts: int | None = None,
    usd_per_hour: float | None = None,
    traffic_rps: float | None = None,
    compile: bool | None = None,
) -> Profile:
    """The profile with CLI flags applied, validated like the file itself."""
    data = _as_data(profile)
    if compile is not None:
        data.setdefault("run", {})["compile"] = compile
    for key, value in (("usd_per_hour", usd_per_hour), ("traffic_rps", traffic_rps)):
        if value is not None:
            data.setdefault("cost", {})[key] = value
    if backend is not None:
        data["backend"] = backend
    if device is not None:
        data["device"] = device
    if max_prompts is not None:
        data["workload"]["max_prompts"] = max_prompts
    return profile_from_dict(data, source=profile.source)

"""Profile files: read a TOML file into a validated `Profile`, write one back, apply command-line overrides."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import tomli_w

from specbench.profile.cost import CostSpec
from specbench.profile.fields import ProfileError
from specbench.profile.load import LoadSpec
from specbench.profile.schema import Profile, profile_from_dict
from specbench.profile.slo import SloSpec

DEFAULT_PROFILE = "profiles/quickstart.toml"
"""Used when no profile is given; relative to the current directory (the project root)."""


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
    """The profile as TOML-shaped data: no None values, no keys its method ignores, no n-gram lengths it left to their
    defaults (an engine without them refuses them once given)."""
    data = profile.model_dump(mode="json", exclude_none=True)
    for draft, spec in zip(data["drafts"], profile.drafts):
        for key in ("ngram_min", "ngram_max"):
            if draft["method"] != "ngram" or key not in spec.model_fields_set:
                del draft[key]
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
    max_new_tokens: int | None = None,
    usd_per_hour: float | None = None,
    traffic_rps: float | None = None,
    compile: bool | None = None,
    server_gpus: tuple[int, ...] | None = None,
) -> Profile:
    """The profile with CLI flags applied (and `server_gpus`, a worker's own GPUs), validated like the file itself."""
    data = _as_data(profile)
    if server_gpus is not None:
        data["server"]["gpus"] = list(server_gpus)
    if compile is not None:
        data.setdefault("run", {})["compile"] = compile
    for key, value in (("usd_per_hour", usd_per_hour), ("traffic_rps", traffic_rps)):
        if value is not None:
            data.setdefault("cost", {})[key] = value
    if usd_per_hour is not None:  # the flag's price of a replica-hour replaces the profile's, whichever it gave
        data["cost"].pop("usd_per_gpu_hour", None)
    if backend is not None:
        data["backend"] = backend
    if device is not None:
        data["device"] = device
    if max_prompts is not None:
        data["workload"]["max_prompts"] = max_prompts
    if max_new_tokens is not None:
        data["workload"]["max_new_tokens"] = max_new_tokens
    return profile_from_dict(data, source=profile.source)

"""Profiles: the shipped ones load, dumps round-trip, paths resolve, and every bad input gets
its exact one-line error."""

import copy
import tomllib
from pathlib import Path

import pytest
import tomli_w

from specbench.models.registry import BUILTIN_MODELS
from specbench.profile import (
    DEFAULT_PROFILE,
    DraftSpec,
    Profile,
    ProfileError,
    dump_profile,
    load_profile,
    profile_from_dict,
    with_overrides,
)
from specbench.workloads.prompts import BUILTIN_SETS

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((PROJECT_ROOT / "profiles").glob("*.toml"))

MINIMAL = {
    "name": "t",
    "target": {"model": "builtin:smollm2-135m-instruct"},
    "drafts": [
        {"name": "ngram", "method": "ngram"},
        {"name": "self", "method": "draft", "model": "builtin:smollm2-135m-instruct"},
    ],
    "sweep": {"gamma": [2, 4], "temperature": [0.0]},
    "workload": {"prompts": "builtin:mixed"},
}


def write_profile(folder: Path, data: dict) -> Path:
    path = folder / "x.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def load_error(path: Path) -> str:
    with pytest.raises(ProfileError) as caught:
        load_profile(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


def edited(key: tuple, value) -> dict:
    """MINIMAL with the value at `key` (e.g. ("drafts", 0, "model")) set, or removed if None."""
    data = copy.deepcopy(MINIMAL)
    *parents, last = key
    node = data
    for part in parents:
        node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return data


# --- the shipped profiles ----------------------------------------------------------------


def test_the_shipped_profiles_and_the_default_is_one_of_them():
    assert [path.name for path in SHIPPED] == [
        "cross-tokenizer-cpu.toml",
        "cross-tokenizer-vllm-cpu.toml",
        "llama-server-cpu.toml",
        "llama-server-eagle3.toml",
        "quickstart.toml",
        "qwen-coder-cpu.toml",
        "qwen2.5-gpu.toml",
        "sglang-gpu-eagle3.toml",
        "sglang-gpu-mtp.toml",
        "sharegpt-cpu.toml",
        "vllm-cpu-capacity.toml",
        "vllm-cpu-eagle3.toml",
        "vllm-cpu-load.toml",
        "vllm-cpu-sharegpt.toml",
        "vllm-cpu.toml",
        "vllm-gpu-eagle3.toml",
        "vllm-gpu-mtp.toml",
        "whatif-cpu.toml",
    ]
    assert (PROJECT_ROOT / DEFAULT_PROFILE).is_file()


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.stem)
def test_shipped_profile_loads(path):
    profile = load_profile(path)
    assert profile.name == path.stem
    assert profile.source == path


def test_quickstart_contents():
    profile = load_profile(PROJECT_ROOT / DEFAULT_PROFILE)
    assert profile.target.model == "builtin:smollm2-135m-instruct"
    assert profile.drafts == (
        DraftSpec(name="ngram", method="ngram", ngram_min=1, ngram_max=3),
        DraftSpec(
            name="self-int8",
            method="draft",
            model="builtin:smollm2-135m-instruct",
            quantize="int8",
        ),
    )
    assert profile.sweep.gamma == (2, 4)
    assert profile.sweep.temperature == (0.0, 0.8)
    assert profile.sweep.top_p == (1.0,)
    assert profile.workload.prompts == "builtin:mixed"
    assert (profile.backend, profile.device, profile.dtype) == ("native", "cpu", "auto")


def test_defaults_fill_what_a_profile_leaves_out():
    profile = profile_from_dict(MINIMAL)
    assert (profile.backend, profile.device, profile.dtype) == ("native", "auto", "auto")
    assert profile.sweep.top_p == (1.0,)
    assert profile.workload.max_prompts is None
    assert profile.workload.max_new_tokens == 128
    assert (profile.run.repeats, profile.run.warmup, profile.run.seed) == (1, 1, 0)
    assert (profile.drafts[0].ngram_min, profile.drafts[0].ngram_max) == (1, 3)
    assert profile.source is None


def test_drafts_may_be_empty():
    assert profile_from_dict(edited(("drafts",), [])).drafts == ()


# --- round trip --------------------------------------------------------------------------


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.stem)
def test_dump_then_load_gives_an_equal_profile(path, tmp_path):
    profile = load_profile(path)
    text = dump_profile(profile)
    copy_path = tmp_path / "copy.toml"
    copy_path.write_text(text)

    reloaded = load_profile(copy_path)

    assert reloaded == profile
    assert reloaded.model_dump() == profile.model_dump()
    assert reloaded.source == copy_path
    assert "source" not in tomllib.loads(text)


def test_dump_omits_none_and_the_ngram_keys_of_model_drafts():
    data = tomllib.loads(dump_profile(profile_from_dict(MINIMAL)))
    assert "quantize" not in data["target"]
    assert "max_prompts" not in data["workload"]
    assert data["drafts"][1] == {
        "name": "self",
        "method": "draft",
        "model": "builtin:smollm2-135m-instruct",
    }


# --- paths -------------------------------------------------------------------------------


def test_relative_paths_resolve_against_the_profile_folder(tmp_path, monkeypatch):
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    (tmp_path / "model").mkdir()
    (tmp_path / "draft").mkdir()
    data = edited(("workload", "prompts"), "prompts.jsonl")
    data["target"]["model"] = "./model"
    data["drafts"][1]["model"] = "draft"  # an existing folder, even without ./
    data["drafts"].append({"name": "hub", "method": "draft", "model": "Qwen/Qwen2.5-0.5B-Instruct"})
    path = write_profile(tmp_path, data)
    monkeypatch.chdir(PROJECT_ROOT)

    profile = load_profile(path)

    assert profile.workload.prompts == str((tmp_path / "prompts.jsonl").resolve())
    assert profile.target.model == str((tmp_path / "model").resolve())
    assert profile.drafts[1].model == str((tmp_path / "draft").resolve())
    assert profile.drafts[2].model == "Qwen/Qwen2.5-0.5B-Instruct"


# --- overrides ---------------------------------------------------------------------------


def test_with_overrides_applies_flags_and_keeps_the_rest():
    profile = load_profile(PROJECT_ROOT / DEFAULT_PROFILE)
    changed = with_overrides(profile, backend="hf", device="cuda:1", max_prompts=2)
    assert (changed.backend, changed.device, changed.workload.max_prompts) == ("hf", "cuda:1", 2)
    assert changed.source == profile.source
    assert changed.workload.model_copy(update={"max_prompts": 4}) == profile.workload
    assert changed.model_copy(
        update={"backend": "native", "device": "cpu", "workload": profile.workload}
    ) == profile
    assert with_overrides(profile) == profile


def test_with_overrides_validates_like_a_file():
    profile = profile_from_dict(MINIMAL)
    with pytest.raises(ProfileError) as caught:
        with_overrides(profile, max_prompts=0)
    assert str(caught.value) == "profile: workload.max_prompts: must be an integer >= 1 (got 0)"


def test_profiles_are_frozen():
    profile = profile_from_dict(MINIMAL)
    with pytest.raises(Exception):
        profile.name = "other"
    assert isinstance(profile, Profile)


# --- errors: one line, naming the file, the key and the fix ------------------------------

MODELS = ", ".join(BUILTIN_MODELS)
SETS = ", ".join(BUILTIN_SETS)
PROFILE_KEYS = "name, backend, server, device, dtype, target, drafts, sweep, workload, run, load, slo, capacity, cost"
DRAFT_KEYS = "name, method, model, quantize, ngram_min, ngram_max, gamma_schedule, gamma, url, acceptance, vocabulary"

BAD_VALUES = [
    # (key, value or None to remove it, message after "<file>: ")
    (("profile",), 1, f"unknown key 'profile' (known: {PROFILE_KEYS})"),
    (("source",), "x.toml", f"unknown key 'source' (known: {PROFILE_KEYS})"),
    (("sweep", "gama"), [2], "unknown key 'sweep.gama' (known: gamma, temperature, top_p, concurrency, request_rate)"),
    (("drafts", 0, "ngram"), 2, f"unknown key 'drafts[0].ngram' (known: {DRAFT_KEYS})"),
    (("sweep", "gamma"), "4", 'sweep.gamma: must be a list (got "4")'),
    (("sweep", "gamma"), [2, "4"], 'sweep.gamma[1]: must be an integer (got "4")'),
    (("sweep", "gamma"), [2, 0], "sweep.gamma[1]: must be an integer >= 1 (got 0)"),
    (("sweep", "gamma"), [], "sweep.gamma: must list at least one value (got [])"),
    (("sweep", "gamma"), [2, 4, 2], "sweep.gamma: must not repeat a value (got [2, 4, 2])"),
    (("sweep", "temperature"), [0.0, -0.5], "sweep.temperature[1]: must be a number >= 0 (got -0.5)"),
    (("sweep", "top_p"), [0.0], "sweep.top_p[0]: must be a number in (0, 1] (got 0.0)"),
    (("sweep", "top_p"), [1.5], "sweep.top_p[0]: must be a number in (0, 1] (got 1.5)"),
    (("sweep",), None, "sweep: missing (add a [sweep] table)"),
    (("sweep", "gamma"), None, "sweep.gamma: missing (add gamma = ...)"),
    (("target",), "gpt2", 'target: must be a table (got "gpt2")'),
    (("target", "model"), "builtin:nope", f'target.model: unknown builtin model "nope" (known: {MODELS})'),
    (("target", "model"), "", 'target.model: must not be empty (set model = "builtin:..." or a hub id/path)'),
    (("target", "quantize"), "int4", "target.quantize: must be 'int8' (got \"int4\")"),
    (("workload", "prompts"), "builtin:nope", f'workload.prompts: unknown builtin prompt set "nope" (known: {SETS})'),
    (("workload", "prompts"), "prompts.txt", 'workload.prompts: must be "builtin:SET", a .jsonl/.csv file or a ShareGPT .json file (got "prompts.txt")'),
    (("workload", "max_new_tokens"), 0, 'workload.max_new_tokens: must be an integer >= 1 or "dataset" (got 0)'),
    (("workload", "max_new_tokens"), "64", 'workload.max_new_tokens: must be an integer >= 1 or "dataset" (got "64")'),
    (("workload", "max_prompts"), 0, "workload.max_prompts: must be an integer >= 1 (got 0)"),
    (("run", "repeats"), 0, "run.repeats: must be an integer >= 1 (got 0)"),
    (("run", "warmup"), -1, "run.warmup: must be an integer >= 0 (got -1)"),
    (("drafts", 1), {"name": "d", "method": "draft"}, 'drafts[1].model: required for method "draft" (set model = "builtin:..." or a hub id/path)'),
    (("drafts", 1, "ngram_max"), 4, 'drafts[1].ngram_max: not used by method "draft" (remove it)'),
    (("drafts", 0, "model"), "builtin:smollm2-135m-instruct", 'drafts[0].model: not used by method "ngram" (remove it, or set method = "draft")'),
    (("drafts", 0, "quantize"), "int8", 'drafts[0].quantize: not used by method "ngram" (remove it, or set method = "draft")'),
    (("drafts", 0, "ngram_min"), 4, "drafts[0].ngram_min: must be <= ngram_max = 3 (got 4)"),
    (("drafts", 0, "ngram_min"), 0, "drafts[0].ngram_min: must be an integer >= 1 (got 0)"),
    (("drafts", 0, "method"), "eagle", 'drafts[0].model: required for method "eagle" (set model = "builtin:..." or a hub id/path)'),
    (("drafts", 0, "method"), "spec", "drafts[0].method: must be 'draft', 'ngram', 'eagle', 'eagle3', 'mtp' or 'medusa' (got \"spec\")"),
    (("sweep", "concurrency"), [1, 4], 'sweep.concurrency: backend "native" runs one request at a time: use concurrency = [1], or backend = "server"'),
    (("server",), {"engine": "vllm"}, 'server: used only by backend = "server" (the profile runs backend "native")'),
    (("drafts", 1, "name"), "ngram", 'drafts[1].name: duplicate draft name "ngram" (give each draft its own name)'),
    (("drafts", 0, "name"), "baseline", 'drafts[0].name: "baseline" is reserved for the target-only run (choose another name)'),
    (("name",), "my run", "name: must be usable as a folder name: letters, digits, '.', '_' or '-' (got \"my run\")"),
    (("name",), "..", "name: must be usable as a folder name: letters, digits, '.', '_' or '-' (got \"..\")"),
    (("backend",), "vllm", "backend: must be 'native', 'hf' or 'server' (got \"vllm\")"),
    (("backend",), "server", 'server: backend "server" needs a [server] table (engine = "vllm", "llama.cpp", ... or url = ...)'),
    (("device",), "gpu", 'device: must be "auto", "cpu", "cuda" or "cuda:N" (got "gpu")'),
    (("target", "model"), "trained:default", "target.model: trained:... names an EAGLE-3 head for a draft, not a "
                                             "target (set a model)"),
    (("drafts", 1, "model"), "trained:quick", 'drafts[1].model: trained:... is an EAGLE-3 head: set method = '
                                              '"eagle3", or a draft model for method "draft"'),
    (("drafts", 1, "model"), "trained:big", 'drafts[1].model: unknown trained head "big" (known: default, quick: the '
                                            'settings of `specbench heads train` and of its --quick)'),
    (("drafts", 0, "gamma"), [0], "drafts[0].gamma[0]: must be an integer >= 1 (got 0)"),
    (("drafts", 0, "gamma"), [3, 3], "drafts[0].gamma: must not repeat a value (got [3, 3])"),
    (("dtype",), "fp16", "dtype: must be 'auto', 'float32', 'bfloat16' or 'float16' (got \"fp16\")"),
]


@pytest.mark.parametrize(("key", "value", "expected"), BAD_VALUES)
def test_bad_value_gets_its_exact_one_line_error(tmp_path, key, value, expected):
    path = write_profile(tmp_path, edited(key, value))
    assert load_error(path) == f"{path}: {expected}"


def test_the_first_of_several_errors_is_reported(tmp_path):
    data = edited(("sweep", "gamma"), [0])
    data["sweep"]["temperature"] = [-1.0]
    path = write_profile(tmp_path, data)
    assert load_error(path) == f"{path}: sweep.gamma[0]: must be an integer >= 1 (got 0)"


def test_missing_prompts_file(tmp_path):
    path = write_profile(tmp_path, edited(("workload", "prompts"), "data/prompts.jsonl"))
    missing = (tmp_path / "data" / "prompts.jsonl").resolve()
    assert load_error(path) == (
        f"{path}: workload.prompts: file not found: {missing}"
        " (paths are relative to the profile's folder)"
    )


def test_missing_model_folder(tmp_path):
    path = write_profile(tmp_path, edited(("target", "model"), "./weights"))
    missing = (tmp_path / "weights").resolve()
    assert load_error(path) == (
        f"{path}: target.model: not found: {missing} (paths are relative to the profile's folder)"
    )


def test_toml_syntax_error(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text('name = "x"\nbackend = \n')
    assert load_error(path) == f"{path}: invalid TOML at line 2: Invalid value"


def test_missing_profile_file(tmp_path):
    path = tmp_path / "nope.toml"
    assert load_error(path) == f"{path}: not found"


def test_relative_profile_path_is_named_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_error(Path("profiles/x.toml")) == "profiles/x.toml: not found"


def test_profile_from_dict_without_a_file_names_the_profile():
    with pytest.raises(ProfileError) as caught:
        profile_from_dict(edited(("sweep", "gamma"), [0]))
    assert str(caught.value) == "profile: sweep.gamma[0]: must be an integer >= 1 (got 0)"


def test_the_cli_prints_an_error_s_brackets(tmp_path, monkeypatch):
    """Errors name TOML tables like [sweep]; the terminal must show them, not read them as markup."""
    from typer.testing import CliRunner

    from specbench.cli import app

    (tmp_path / "p.toml").write_text('name = "x"\n[target]\nmodel = "builtin:smollm2-135m-instruct"\n')
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["run", "p.toml"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: p.toml: sweep: missing (add a [sweep] table)"

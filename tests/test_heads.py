"""`specbench heads train` and the native backend's eagle3 method end to end, on a tiny target: the distilled
head is cached, loads in vLLM's format and drafts in a sweep; bad input is one line, exit 2."""

from __future__ import annotations

import json
import re
import weakref
from pathlib import Path

import pandas as pd
import pytest
from tiny import WORDS, tiny_llama, write_model_folder
from typer.testing import CliRunner

from specbench.backends import inprocess
from specbench.backends.inprocess import load_models
from specbench.cli import app
from specbench.heads import distill, reference
from specbench.heads.distill import train_head
from specbench.heads.settings import HeadSettings
from specbench.models.load import load_model
from specbench.models.eagle3 import load_head
from specbench.profile import ProfileError, load_profile
from specbench.sweep import run_profile

PROMPTS = ["the cat sat on the mat", "write code to sum one two three", "explain why the dog ran fast",
           "what is a model draft token", "the red cat and the blue dog", "please write a test for the code",
           "how fast is the big model", "the small dog sat on the red mat"]
SETTINGS = {"workload": "prompts.jsonl", "max_prompts": 8, "max_new_tokens": 10, "epochs": 3, "draft_vocab_size": 24,
                "batch_tokens": 256, "generate_batch": 4, "held_out": 0.25}


class Quiet:
    def message(self, text: str) -> None: ...
    def phase(self, name: str, total: int) -> None: ...
    def advance(self, amount: int = 1, *, note: str = "") -> None: ...


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    """A six-layer target over WORDS, a prompts file, and an empty specbench cache."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    write_model_folder(tmp_path / "target", tiny_llama(vocab_size=len(WORDS), layers=6, init_std=0.3, seed=5))
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return tmp_path


def test_train_head_caches_a_head_in_vllms_format(project):
    settings = HeadSettings(**SETTINGS)
    report = train_head(str(project / "target"), settings=settings, observer=Quiet(), device="cpu")
    folder = Path(report.folder)
    assert folder.parent == project / "cache" / "heads" and not report.cached
    assert len(report.agreement) == 3 and all(0 <= a <= 1 for a in report.agreement)
    assert report.examples["train_prompts"] == 6 and report.examples["held_out_prompts"] == 2
    assert report.losses[1] < report.losses[0]
    config = json.loads((folder / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 3, 3] and config["draft_vocab_size"] == 24
    target = tiny_llama(vocab_size=len(WORDS), layers=6)
    assert load_head(folder, target_config=target.config).lm_head.weight.shape == (24, 64)

    again = train_head(str(project / "target"), settings=settings, observer=Quiet(), device="cpu")
    assert again.cached and again.agreement == report.agreement and again.folder == report.folder
    other = train_head(str(project / "target"), settings=HeadSettings(**{**SETTINGS, "seed": 1}), observer=Quiet(),
                       device="cpu")
    assert other.folder != report.folder and not other.cached


class Said(Quiet):
    def __init__(self):
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)


SMOKE_TEST = ("a head distilled from 8 prompts is a smoke test of the pipeline, not what a published EAGLE-3 head "
              "accepts (those are trained on hundreds of thousands of conversations): for figures to deploy on, point "
              "model at a published head for the target, or train on far more prompts (--max-prompts)")


def test_a_cached_head_does_not_load_the_target(project, monkeypatch):
    settings = HeadSettings(**SETTINGS)
    first = train_head(str(project / "target"), settings=settings, observer=Quiet(), device="cpu")

    def no_loading(*args, **kwargs):
        raise AssertionError("the target was loaded for a cached head")

    monkeypatch.setattr(distill, "load_model", no_loading)
    said = Said()
    again = train_head(str(project / "target"), settings=settings, observer=said, device="cpu")
    assert again.cached and again.folder == first.folder and again.agreement == first.agreement
    assert said.lines == [SMOKE_TEST]  # said of a cached head too; no "loading target"
    assert distill.smoke_test_note(HeadSettings(max_prompts=129)) is None


def test_trained_heads_are_distilled_before_the_run_loads_its_target_and_freed(project, monkeypatch):
    """trained:PRESET on the native backend: distilled first, the distillation's own copy of the target gone (freed)
    before the run loads the target; a second run takes the head from the cache without loading a second copy."""
    monkeypatch.setitem(reference.PRESETS, "quick", HeadSettings(**SETTINGS))
    distilled: list[weakref.ref] = []

    def distil_load(*args, **kwargs):
        loaded = load_model(*args, **kwargs)
        distilled.append(weakref.ref(loaded.model))
        return loaded

    def run_load(*args, **kwargs):
        assert distilled and all(model() is None for model in distilled), "the distillation's target is alive"
        return load_model(*args, **kwargs)

    monkeypatch.setattr(distill, "load_model", distil_load)
    monkeypatch.setattr(inprocess, "load_model", run_load)
    (project / "tiny.toml").write_text(profile_text(head="trained:quick"))
    said = Said()
    models = load_models(load_profile(project / "tiny.toml"), observer=said)
    assert len(distilled) == 1 and models.drafts["head"].model.lm_head.weight.shape == (24, 64)
    assert SMOKE_TEST in said.lines
    load_models(load_profile(project / "tiny.toml"), observer=Quiet())
    assert len(distilled) == 1  # the second run: the head from the cache


def heads_cli(*args: str):
    return CliRunner().invoke(app, ["heads", "train", *args])


def test_the_cli_trains_reports_and_copies(project):
    result = heads_cli("--target", "./target", "--workload", "prompts.jsonl", "--max-prompts", "8",
                       "--max-new-tokens", "8", "--epochs", "2", "--draft-vocab-size", "0", "--out", "head", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{\n"):])
    assert report["settings"]["draft_vocab_size"] == 0 and len(report["agreement"]) == 3
    assert {"config.json", "model.safetensors", "specbench_head.json"} <= {p.name for p in (project / "head").iterdir()}
    assert json.loads((project / "head" / "config.json").read_text())["draft_vocab_size"] == len(WORDS)


@pytest.mark.parametrize("args, message", [
    ((), "error: give a PROFILE or --target MODEL (the model the head drafts for)"),
    (("--target", "./target", "--held-out", "1.5"), "error: --held-out: must be a share in (0, 1) (got 1.5)"),
    (("--target", "./target", "--epochs", "0"), "error: --epochs: must be an integer >= 1 (got 0)"),
    (("--target", "./target", "--workload", "prompts.jsonl", "--draft-vocab-size", "1000"),
     (f"error: --draft-vocab-size: 1000 exceeds the target's vocabulary of {len(WORDS)} ids (use at most that, or 0 "
      "for all of it)")),
    (("--target", "./missing"), "error: --target: not found: {project}/missing"),
    (("missing.toml",), "error: missing.toml: not found"),
])
def test_bad_input_is_one_line_and_exit_2(project, args, message):
    result = heads_cli(*args)
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1] == message.format(project=project)  # after progress messages


# --- eagle3 on the native backend ------------------------------------------------------------------------------


def profile_text(*, head: str, backend: str = "native") -> str:
    return (f'name = "tiny-eagle3"\nbackend = "{backend}"\n[target]\nmodel = "./target"\n'
            f'[[drafts]]\nname = "head"\nmethod = "eagle3"\nmodel = "{head}"\n'
            '[sweep]\ngamma = [1, 3]\ntemperature = [0.0, 0.8]\n'
            '[workload]\nprompts = "prompts.jsonl"\nmax_prompts = 3\nmax_new_tokens = 12\n[run]\nwarmup = 0\n')


def test_eagle3_runs_on_the_native_backend(project):
    report = train_head(str(project / "target"), settings=HeadSettings(**SETTINGS), observer=Quiet(), device="cpu")
    (project / "tiny.toml").write_text(profile_text(head=report.folder))
    result = run_profile(load_profile(project / "tiny.toml"), out=project / "out")
    points = pd.read_parquet(project / "out" / "points.parquet")
    assert result.failed == 0 and (points["status"] == "ok").all()
    heads = points[points["method"] == "eagle3"]
    assert len(heads) == 4
    assert heads[heads["temperature"] == 0]["outputs_match_baseline"].all()
    assert heads["acceptance_rate"].between(0, 1).all() and (heads["mean_accepted_length"] >= 1).all()


def test_eagle3_runs_compiled_with_the_same_drafts(project):
    """run.compile: the target's step compiled with the head's aux-state hooks in it, every point static; greedy
    points accept exactly what the eager run's accept."""
    report = train_head(str(project / "target"), settings=HeadSettings(**SETTINGS), observer=Quiet(), device="cpu")
    (project / "tiny.toml").write_text(profile_text(head=report.folder).replace("[run]\n", "[run]\ncompile = true\n"))
    result = run_profile(load_profile(project / "tiny.toml"), out=project / "compiled")
    assert result.failed == 0
    compiled = pd.read_parquet(project / "compiled" / "points.parquet").set_index("point_id")
    assert (compiled["kv_cache"] == "static").all() and compiled["kv_cache_reason"].isna().all()
    manifest = json.loads((project / "compiled" / "manifest.json").read_text())["compile"]
    assert manifest["fallback"] is None and set(manifest["models"]) == {"target"}
    (project / "tiny.toml").write_text(profile_text(head=report.folder))
    run_profile(load_profile(project / "tiny.toml"), out=project / "eager")
    eager = pd.read_parquet(project / "eager" / "points.parquet").set_index("point_id")
    greedy = compiled[(compiled["method"] == "eagle3") & (compiled["temperature"] == 0)].index
    assert len(greedy) == 2 and compiled.loc[greedy, "outputs_match_baseline"].all()
    for point in greedy:
        assert list(compiled.loc[point, "accepted_per_position"]) == list(eager.loc[point, "accepted_per_position"])


def test_eagle3_on_the_hf_backend_is_refused(project):
    (project / "tiny.toml").write_text(profile_text(head="./target", backend="hf"))
    with pytest.raises(ProfileError, match=re.escape(
            'tiny.toml: drafts[0].method: "eagle3" runs on backend "native" or "server" (backend "hf" has draft and '
            'ngram)')):
        load_profile(project / "tiny.toml")


def test_a_head_that_is_not_eagle3_stops_the_run_before_any_point(project):
    (project / "tiny.toml").write_text(profile_text(head="./target"))  # a plain Llama folder, not a head
    with pytest.raises(ProfileError, match=re.escape(
            f'tiny.toml: drafts[0].model: {project}/target/config.json: architectures: ["LlamaForCausalLM"] is not '
            'an EAGLE-3 head; use a head saved as "LlamaForCausalLMEagle3" (vLLM\'s EAGLE-3 format) or in the '
            'speculators format')):
        load_models(load_profile(project / "tiny.toml"), observer=Quiet())


def test_a_profile_gives_the_target_workload_and_seed(project):
    (project / "tiny.toml").write_text(profile_text(head="./target").replace("[run]\n", "[run]\nseed = 3\n"))
    result = heads_cli("tiny.toml", "--max-new-tokens", "6", "--epochs", "1", "--draft-vocab-size", "16", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{\n"):])
    assert report["target"] == str(project / "target")
    assert report["settings"]["workload"] == str(project / "prompts.jsonl") and report["settings"]["seed"] == 3

"""One EAGLE-3 head, three backends, one answer: a head distilled here for the embedded SmolLM2 (or taken from the
machine's cache) run by the native backend, by vLLM's CPU build and by llama-server on the
same prompts at temperature 0; and Medusa heads distilled the same way, run by the native backend and by vLLM (llama.cpp
runs no Medusa). Each engine's acceptance comes from its own counters and is above zero at every position; greedy
outputs equal each backend's baseline (llama.cpp's, reported as its numerics where they differ); no engine is left
running; and per-position acceptance agrees across the backends.

Measured with the head below (5 prompts, 32 tokens, gamma 3; 2026-12-06, AMD EPYC Zen 4): native and llama.cpp
accepted [36, 27, 19] at positions 1-3, vLLM [36, 29, 19]; with an earlier head distilled on other prompts (6 prompts
of 48 tokens) [16, 2, 0], request by request the same counts, and vLLM [18, 2, 0]. The difference is not numerics
but a counting convention: at a request's last step vLLM still drafts gamma tokens and counts those it accepts past
max_tokens (then drops them), where native and llama.cpp draft only what the budget has room for (the earlier head:
264 vLLM drafts = native's 264 target steps; 757 drafted tokens natively and in llama.cpp against vLLM's 792). With
256 tokens, where five of six requests end at EOS, native and vLLM both accepted [72, 5, 0]. So: llama.cpp equals
native within one token per position (numerics); vLLM lies between native's counts and native's plus one per
position for each request that ended at its length limit.

The head is distilled for this test, on its own prompts (`specbench heads train --quick` on the five prompts below,
32 tokens each, 30 epochs; one prompt held out): it has learnt four of the five continuations (train agreement
85/81/85 % at positions 1-3, 28 s on the Zen 4 EPYC), so every backend accepts nearly half its drafts (0.45) and the
per-position comparison counts tens of tokens at every position. A head distilled on other prompts (the quick
preset's sharegpt prompts, 24 of them, 8 epochs: 81 s) drafted for 6 prompts of 48 tokens and was accepted 7 times
at position 1 and never after: a comparison of near-zeros, and the three runs twice as long. `trained:PRESET` in a
profile is tested on a tiny target (tests/test_heads.py).
llama-server runs the target as an f32 GGUF converted here from the same safetensors folder native and vLLM load
(the embedded Q4_1 file would be a different model's numerics). Skipped where an engine is not installed.

MTP the same way: the embedded SmolLM2 written as a MiMo model with one MTP layer distilled on the five prompts
(`specbench heads train --kind mtp`), drafting at gamma 2 (the layer chained) natively and on vLLM, each backend's
greedy outputs equal to its own baseline's. The MiMo model is the embedded model: natively its logits are the
embedded model's bit for bit, so the native run serves it as the target of every head (one baseline); on vLLM it
runs as MiMoForCausalLM (Qwen2's layers, which give EAGLE-3 heads no auxiliary states), its own launch, whose
baseline's greedy outputs equal the embedded model's. llama.cpp has no MTP for a MiMoForCausalLM (refused in one
line: tests/test_mtp.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
from installed_engines import LLAMA_SERVER, processes_running
from test_server_vllm import VLLM_PYTHON, needs_vllm, vllm_server

from specbench.backends.server.heads import find_converter, to_gguf
from specbench.models.load import hf_folder
from specbench.models.eagle3 import HeadError

TARGET = "builtin:smollm2-135m-instruct"


def _converter() -> Path | None:
    try:
        return find_converter(str(LLAMA_SERVER))
    except HeadError:
        return None


CONVERTER = _converter() if LLAMA_SERVER.exists() else None
pytestmark = pytest.mark.engine  # the module's fixture runs every engine installed here
needs_llama = pytest.mark.skipif(CONVERTER is None, reason=f"no llama-server at {LLAMA_SERVER}, or no llama.cpp "
                                                          "converter above it (make engine-llama.cpp)")

COMMON = """
[[drafts]]
name = "eagle3"
method = "eagle3"
model = "{head}"
{medusa}[sweep]
gamma = [3]
temperature = [0.0]
concurrency = [1]
[workload]
prompts = "prompts.jsonl"
max_prompts = 5
max_new_tokens = 32
[run]
repeats = 1
warmup = 1
seed = 0
"""

PROFILES = {
    "native": f"""
name = "e3-native"
backend = "native"
device = "cpu"
[target]
model = "{{mtp}}"
""",
    "vllm": f"""
name = "e3-vllm"
{vllm_server()}""",
    "llama.cpp": """
name = "e3-llama"
backend = "server"
[server]
engine = "llama.cpp"
binary = "{binary}"
ready_timeout_s = 300
extra_args = ["-t", "1", "-np", "1", "-c", "1024"]
[target]
model = "{target}"
""",
}


# the MTP layer at gamma 2: beside the heads natively (the MiMo model is the target there), alone on vLLM
MTP = """[[drafts]]
name = "mtp"
method = "mtp"
gamma = [2]
"""
MTP_VLLM = """
[target]
model = "{model}"
""" + MTP + """[sweep]
gamma = [2]
temperature = [0.0]
concurrency = [1]
[workload]
prompts = "prompts.jsonl"
max_prompts = 5
max_new_tokens = 32
[run]
repeats = 1
warmup = 0
seed = 0
"""


def _run_mtp_vllm(folder: Path, model: str) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    text = PROFILES["vllm"].split("[target]")[0].replace('name = "e3-', 'name = "mtp-') + MTP_VLLM.format(model=model)
    (folder / "mtp-vllm.toml").write_text(text)
    result = subprocess.run([sys.executable, "-m", "specbench.cli", "run", "mtp-vllm.toml", "--out", "mtp-vllm"],
                            cwd=folder, capture_output=True, text=True, timeout=2400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = folder / "mtp-vllm"
    return (pd.read_parquet(out / "points.parquet").set_index("draft"), pd.read_parquet(out / "requests.parquet"),
            result.stdout)


# Medusa heads on the backends that run them (llama.cpp has no Medusa)
MEDUSA = """[[drafts]]
name = "medusa"
method = "medusa"
model = "{heads}"
"""


def _run(folder: Path, name: str, text: str, head: str, medusa: str | None = None, extra: str = ""
         ) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    drafts = (MEDUSA.format(heads=medusa) if medusa else "") + extra
    (folder / f"{name}.toml").write_text(text + COMMON.format(head=head, medusa=drafts))
    result = subprocess.run([sys.executable, "-m", "specbench.cli", "run", f"{name}.toml", "--out", name], cwd=folder,
                            capture_output=True, text=True, timeout=2400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = folder / name
    return (pd.read_parquet(out / "points.parquet").set_index("draft"), pd.read_parquet(out / "requests.parquet"),
            result.stdout)


PROMPTS = ["Explain in two sentences why the sky is blue.",
           "Write a Python function that returns the factorial of n.",
           "Translate into French: The train leaves at eight tomorrow morning, and the tickets are on the table.",
           "List three tips for keeping houseplants healthy.",
           "What is 17 times 23? Show the steps."]
# the quick preset's head shape, distilled on the prompts the backends then run, to their 32 tokens; Medusa's three
# heads learn them in fewer epochs (each head has the target's whole vocabulary: 8 epochs took 14 s, 30 took 51)
SAME_PROMPTS = ["--quick", "--workload", "prompts.jsonl", "--max-prompts", "5", "--max-new-tokens", "32", "--device", "cpu"]
# the MTP layer learns the four training continuations in as many epochs as the EAGLE-3 head (16 left it at 25 %)
HEAD_SETTINGS = {"eagle3": [*SAME_PROMPTS, "--epochs", "30"], "medusa": [*SAME_PROMPTS, "--epochs", "8"],
                 "mtp": [*SAME_PROMPTS, "--epochs", "30"]}


def _distil(folder: Path, kind: str) -> str:
    if not (folder / "prompts.jsonl").exists():
        (folder / "prompts.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "category": "mixed", "messages": [
            {"role": "user", "content": prompt}]}) + "\n" for i, prompt in enumerate(PROMPTS)))
    result = subprocess.run([sys.executable, "-m", "specbench.cli", "heads", "train", "--kind", kind, "--target", TARGET,
                             *HEAD_SETTINGS[kind], "--out", str(folder / kind)],
                            cwd=folder, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return str(folder / kind)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("three-backends")  # not "eagle3": vLLM reads a method off a path
    before = processes_running(b"vllm") | processes_running(b"llama-server")
    seconds: dict[str, float] = {}  # what each step took, printed with the positions (pytest -s shows them)
    with _timed(seconds, "distillation"):
        head = _distil(folder, "eagle3")
    with _timed(seconds, "medusa distillation"):
        medusa = _distil(folder, "medusa")
    with _timed(seconds, "mtp distillation"):
        mtp = _distil(folder, "mtp")
    with _timed(seconds, "native"):
        done = {"native": _run(folder, "native", PROFILES["native"].format(mtp=mtp), head=head, medusa=medusa,
                                  extra=MTP)}
    if VLLM_PYTHON.exists():
        with _timed(seconds, "vllm"):
            done["vllm"] = _run(folder, "vllm", PROFILES["vllm"], head=head, medusa=medusa)
        with _timed(seconds, "mtp vllm"):
            done["mtp-vllm"] = _run_mtp_vllm(folder, mtp)
    if CONVERTER is not None:
        with _timed(seconds, "target to GGUF"):
            target = to_gguf(hf_folder(TARGET), folder / "target-f32.gguf", converter=CONVERTER)
        with _timed(seconds, "llama.cpp"):
            done["llama.cpp"] = _run(folder, "llama", PROFILES["llama.cpp"].format(binary=LLAMA_SERVER,
                                                                                   target=target), head=head)
    after = processes_running(b"vllm") | processes_running(b"llama-server")
    print(json.dumps({"seconds": seconds, **{name: _positions(points) for name, (points, _, _) in done.items()}}))
    return done, after - before


@contextmanager
def _timed(seconds: dict[str, float], step: str):
    started = time.monotonic()
    yield
    seconds[step] = round(time.monotonic() - started, 1)


def _accepted(runs, name: str, draft: str = "eagle3") -> list[int]:
    return [int(x) for x in runs[0][name][0].loc[draft, "accepted_per_position"]]


def _positions(points: pd.DataFrame) -> dict:
    return {draft: _draft_positions(row) for draft, row in points[points["method"] != "baseline"].iterrows()}


def _draft_positions(row: pd.Series) -> dict:
    return {"acceptance_rate": float(row["acceptance_rate"]), "mal": float(row["mean_accepted_length"]),
            "accepted_per_position": [int(x) for x in row["accepted_per_position"]],
            "drafts": int(row["engine_drafts"]) if pd.notna(row.get("engine_drafts")) else None}


@pytest.mark.parametrize("draft", ["eagle3", "medusa"])
def test_native_head_is_lossless_and_drafts(runs, draft):
    points, requests, _ = runs[0]["native"]
    assert points.loc[draft, "outputs_match_baseline"]
    assert points.loc[draft, "acceptance_rate"] > 0 and min(_accepted(runs, "native", draft)) > 0


@needs_vllm
@pytest.mark.parametrize("draft", ["eagle3", "medusa"])
def test_vllm_runs_the_head_from_its_per_request_counts(runs, draft):
    points, _, _ = runs[0]["vllm"]
    row = points.loc[draft]
    assert row["acceptance_source"] == "requests" and row["engine_accepted_tokens"] > 0
    assert row["outputs_match_baseline"]
    assert not runs[1], f"engines left running: {runs[1]}"


@needs_llama
def test_llama_cpp_runs_the_converted_head_from_its_counters(runs):
    points, _, stdout = runs[0]["llama.cpp"]
    row = points.loc["eagle3"]
    assert row["acceptance_source"] == "metrics" and row["engine_accepted_tokens"] > 0
    assert row["outputs_match_baseline"] or "not bit-exact" in " ".join(stdout.split())
    assert not runs[1], f"engines left running: {runs[1]}"


@needs_llama
def test_llama_cpp_accepts_what_native_accepts_at_every_position(runs):
    native, llama = _accepted(runs, "native"), _accepted(runs, "llama.cpp")
    assert len(native) == len(llama) == 3 and min(native) > 0  # accepted at every position
    assert all(abs(a - b) <= 1 for a, b in zip(native, llama)), (native, llama)


@needs_vllm
@pytest.mark.parametrize("draft", ["eagle3", "medusa"])
def test_vllm_accepts_what_native_accepts_plus_its_drafts_past_the_length_limit(runs, draft):
    native, vllm = _accepted(runs, "native", draft), _accepted(runs, "vllm", draft)
    requests = runs[0]["vllm"][1]
    at_limit = int((requests[requests["point_id"].str.startswith(draft)]["finish_reason"] == "length").sum())
    assert len(native) == len(vllm) == 3 and min(native) > 0
    assert all(a - 1 <= b <= a + at_limit for a, b in zip(native, vllm)), (native, vllm, at_limit)


# --- MTP ------------------------------------------------------------------------------------------------------


def _baseline_outputs(runs, name: str) -> dict[str, str]:
    requests = runs[0][name][1]
    baseline = requests[requests["point_id"].str.startswith("baseline")]
    return dict(zip(baseline["prompt_id"], baseline["output_sha"]))


def test_native_mtp_is_lossless_and_drafts_from_the_chained_layer(runs):
    row = runs[0]["native"][0].loc["mtp"]
    assert row["outputs_match_baseline"] and row["gamma"] == 2
    assert min(_accepted(runs, "native", "mtp")) > 0  # the chained step's drafts are accepted too


def test_the_mtp_model_is_the_embedded_model_natively(runs):
    """The MiMo model's logits are the embedded model's, bit for bit, on the native backend's path (transformers)."""
    import torch

    from specbench.models.load import load_model

    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 5646, 30]])
    with torch.no_grad():
        logits = [load_model(model, device=torch.device("cpu"), dtype=torch.float32).model(ids).logits
                  for model in (TARGET, runs[0]["native"][0].loc["baseline", "target_model"])]
    assert torch.equal(*logits)


@needs_vllm
def test_vllm_runs_the_mtp_model_from_its_per_request_counts(runs):
    row = runs[0]["mtp-vllm"][0].loc["mtp"]
    assert row["acceptance_source"] == "requests" and row["engine_accepted_tokens"] > 0
    assert row["outputs_match_baseline"]
    assert _baseline_outputs(runs, "mtp-vllm") == _baseline_outputs(runs, "vllm")  # the embedded model's outputs
    assert not runs[1], f"engines left running: {runs[1]}"


@needs_vllm
def test_vllm_accepts_what_native_accepts_from_the_mtp_layer(runs):
    native, vllm = _accepted(runs, "native", "mtp"), _accepted(runs, "mtp-vllm", "mtp")
    requests = runs[0]["mtp-vllm"][1]
    at_limit = int((requests[requests["point_id"].str.startswith("mtp")]["finish_reason"] == "length").sum())
    assert len(native) == len(vllm) == 2 and min(native) > 0
    assert all(a - 1 <= b <= a + at_limit for a, b in zip(native, vllm)), (native, vllm, at_limit)

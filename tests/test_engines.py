"""One mapping per serving engine from a speculation setting to its flags; llama.cpp's flag names are read
from the real binary's --help where it is installed (make engines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from installed_engines import LLAMA_SERVER, needs_llama_server
from specbench.backends.server.metrics import spec_counters
from specbench.engines import ENGINES, EngineError, Speculation, check_schedule, parse_schedule, schedule_text, with_mtp_draft



def test_vllm_speculative_config():
    vllm = ENGINES["vllm"]
    args = vllm.speculation_args(Speculation("ngram", 3, ngram_min=1, ngram_max=4))
    assert args[0] == "--speculative-config"
    assert json.loads(args[1]) == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                                   "prompt_lookup_max": 4}
    assert json.loads(vllm.speculation_args(Speculation("draft", 5, draft_model="/m/draft"))[1]) == {
        "method": "draft_model", "num_speculative_tokens": 5, "model": "/m/draft"}
    assert vllm.speculation_args(Speculation("baseline")) == []


def test_vllm_reports_each_requests_acceptance_where_it_can():
    """vLLM 0.32 has --per-request-spec-decode-metrics (refused without speculation, unknown before 0.32)."""
    vllm, ngram = ENGINES["vllm"], Speculation("ngram", 3, ngram_min=1, ngram_max=4)
    for version in ("0.32.0", "0.32.1+cpu", "1.0.0"):
        assert vllm.speculation_args(ngram, version=version)[2:] == ["--per-request-spec-decode-metrics", "detailed"]
    for version in ("0.31.2", "0.9.1", None, "unknown"):
        assert len(vllm.speculation_args(ngram, version=version)) == 2, version
    assert vllm.speculation_args(Speculation("baseline"), version="0.32.0") == []


def test_heads_and_mtp_map_to_each_engines_flags():
    """EAGLE-3 and MTP run for real on vLLM (test_eagle3_engines.py); SGLang's and llama.cpp's
    mappings are checked here, by argv. SGLang's NEXTN is given the target as the path of its MTP layers (it fills that
    in itself only for DeepSeek-V3-like architectures, not MiMo's); vLLM and llama.cpp read them from the target."""
    vllm, sglang, llama = ENGINES["vllm"], ENGINES["sglang"], ENGINES["llama.cpp"]
    assert json.loads(vllm.speculation_args(Speculation("eagle3", 3, draft_model="/h"))[1]) == {
        "method": "eagle3", "num_speculative_tokens": 3, "model": "/h"}
    assert json.loads(vllm.speculation_args(Speculation("mtp", 1))[1]) == {"method": "mtp", "num_speculative_tokens": 1}
    assert json.loads(vllm.speculation_args(Speculation("medusa", 2, draft_model="/m"))[1])["method"] == "medusa"
    assert sglang.speculation_args(Speculation("eagle3", 3, draft_model="/h")) == [
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/h", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    assert sglang.speculation_args(Speculation("mtp", 2))[:2] == ["--speculative-algorithm", "NEXTN"]
    assert sglang.speculation_args(with_mtp_draft(Speculation("mtp", 2), sglang, "/t")) == [
        "--speculative-algorithm", "NEXTN", "--speculative-draft-model-path", "/t", "--speculative-num-steps", "2",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]
    for engine in (vllm, llama):
        assert with_mtp_draft(Speculation("mtp", 2), engine, "/t") == Speculation("mtp", 2)
    assert llama.speculation_args(Speculation("eagle3", 2, draft_model="/h.gguf")) == [
        "--spec-type", "draft-eagle3", "--spec-draft-n-max", "2", "-md", "/h.gguf"]
    assert llama.speculation_args(Speculation("mtp", 2)) == ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]
    with pytest.raises(EngineError, match="llama.cpp has no speculative method 'medusa'"):
        llama.speculation_args(Speculation("medusa", 2, draft_model="/m"))


def test_a_gamma_per_batch_size_is_vllms_dynamic_speculation_and_nobody_elses():
    schedule = check_schedule([[1, 3, 4], [4, 8, 1], [9, 16, 0]])
    args = ENGINES["vllm"].speculation_args(Speculation("ngram", 4, ngram_min=2, ngram_max=2, gamma_schedule=schedule))
    # num_speculative_tokens is the largest gamma: vLLM clamps every range's gamma to it
    assert json.loads(args[1]) == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
                                   "prompt_lookup_max": 2,
                                   "num_speculative_tokens_per_batch_size": [[1, 3, 4], [4, 8, 1], [9, 16, 0]]}
    assert parse_schedule(schedule_text(schedule)) == schedule and schedule_text(schedule) == "1-3:4,4-8:1,9-16:0"
    for name in ("llama.cpp", "sglang"):
        with pytest.raises(EngineError, match="has no gamma per batch size"):
            ENGINES[name].speculation_args(Speculation("draft", 4, draft_model="m", gamma_schedule=schedule))


@pytest.mark.parametrize(("ranges", "message"), [
    ([[2, 4, 3]], "entry 0: must start at batch size 1 (got 2)"),
    ([[1, 3, 3], [5, 8, 1]], "entry 1: must start at batch size 4, right after the previous range (got 5)"),
    ([[1, 3, 3], [3, 8, 1]], "entry 1: must start at batch size 4, right after the previous range (got 3)"),
    ([[1, 3, 0]], "drafts at no batch size (every gamma is 0)"),
    ([[1, 3]], "entry 0: must be [first batch size, last batch size, gamma], three integers (got [1, 3])"),
    ([[1, 0, 2]], "entry 0: needs 1 <= first <= last and gamma >= 0 (got [1, 0, 2])"),
    ([], "must list at least one range"),
])
def test_a_bad_gamma_schedule_says_what_is_wrong(ranges, message):
    with pytest.raises(EngineError) as error:
        check_schedule(ranges)
    assert message in str(error.value)


def test_sglang_and_unknown_methods():
    args = ENGINES["sglang"].speculation_args(Speculation("eagle3", 4, draft_model="/m/eagle"))
    assert args == ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/m/eagle",
                    "--speculative-num-steps", "4", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "5"]
    with pytest.raises(EngineError, match=r"^llama.cpp has no speculative method 'medusa'"):
        ENGINES["llama.cpp"].speculation_args(Speculation("medusa", 2, draft_model="/m"))


def test_llama_cpp_flags_follow_the_binarys_help():
    llama = ENGINES["llama.cpp"]
    old_help = "-md, --model-draft FNAME\n--draft-max N\n--draft-min N\n"
    assert llama.speculation_args(Speculation("draft", 3, draft_model="d.gguf"), help_text=old_help) == [
        "-md", "d.gguf", "--draft-max", "3", "--draft-min", "0"]
    with pytest.raises(EngineError, match="predates --spec-type"):
        llama.speculation_args(Speculation("ngram", 3, ngram_min=1, ngram_max=3), help_text=old_help)


@needs_llama_server
def test_llama_cpp_flags_are_the_real_binarys():
    llama = ENGINES["llama.cpp"]
    env = {**os.environ, "LD_LIBRARY_PATH": str(LLAMA_SERVER.resolve().parent)}
    real_help = subprocess.run([str(LLAMA_SERVER), "--help"], capture_output=True, text=True, env=env).stdout
    args = llama.speculation_args(Speculation("ngram", 4, ngram_min=1, ngram_max=3), help_text=real_help)
    assert args == ["--spec-type", "ngram-simple", "--spec-draft-n-max", "4", "--spec-ngram-simple-size-n", "3",
                    "--spec-ngram-simple-size-m", "4"]
    for flag in args[::2]:
        assert flag in real_help  # every flag the mapping writes, the binary knows


def test_prometheus_counters_with_or_without_total_and_per_position():
    text = ("# TYPE vllm:spec_decode_num_drafts counter\nvllm:spec_decode_num_drafts_total{model_name=\"m\"} 6\n"
            "# TYPE vllm:spec_decode_num_draft_tokens counter\nvllm:spec_decode_num_draft_tokens_total{model_name=\"m\"} 18\n"
            "# TYPE vllm:spec_decode_num_accepted_tokens counter\nvllm:spec_decode_num_accepted_tokens_total{model_name=\"m\"} 12\n"
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter\n"
            "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"0\"} 6\n"
            "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"1\"} 4\n"
            "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"2\"} 2\n")
    counters = spec_counters(text, prefix="vllm:")
    assert (counters.drafts, counters.draft_tokens, counters.accepted_tokens) == (6, 18, 12)
    assert counters.accepted_per_position == (6, 4, 2)
    plain = "# TYPE llamacpp:spec_decode_num_drafts gauge\nllamacpp:spec_decode_num_drafts 2\n" \
            "# TYPE llamacpp:spec_decode_num_draft_tokens gauge\nllamacpp:spec_decode_num_draft_tokens 5\n"
    assert spec_counters(plain, prefix="llamacpp:").draft_tokens == 5  # without the _total suffix
    assert spec_counters("# TYPE x counter\nx_total 1\n", prefix="vllm:") is None
    assert counters.minus(spec_counters(text.replace(" 18\n", " 10\n"), prefix="vllm:")).draft_tokens == 8


def test_llama_cpp_ngram_below_its_lookup_size_is_refused_up_front(tmp_path, monkeypatch):
    """llama-server's ngram-simple drafts nothing when its draft length is below the lookup n-gram size
    (measured: size-n 3 with size-m 2 drafted 0 tokens, size-m 3 drafted): a point that would silently run
    as a baseline is refused, in the engine mapping and when the profile is read."""
    from typer.testing import CliRunner

    from specbench.cli import app

    with pytest.raises(EngineError, match=r"gamma \(2\) is below the n-gram size ngram_max \(3\)"):
        ENGINES["llama.cpp"].speculation_args(Speculation("ngram", 2, ngram_min=1, ngram_max=3))
    monkeypatch.chdir(tmp_path)
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    (tmp_path / "p.toml").write_text(f"""name = "p"
backend = "server"
[server]
engine = "llama.cpp"
binary = "{binary}"
[target]
model = "builtin:smollm2-135m-instruct"
[[drafts]]
name = "ngram"
method = "ngram"
ngram_max = 3
[sweep]
gamma = [2, 4]
temperature = [0.0]
[workload]
prompts = "builtin:mixed"
""")
    result = CliRunner().invoke(app, ["run", "p.toml"])
    assert result.exit_code == 2
    assert result.output.strip() == ("error: p.toml: sweep.gamma: llama.cpp's ngram-simple drafts nothing when gamma (2) "
                                     "is below the n-gram size ngram_max (3); use gamma >= ngram_max")
    assert not (tmp_path / "results").exists()
    (tmp_path / "p.toml").write_text((tmp_path / "p.toml").read_text().replace("ngram_max = 3\n",
                                                                                "ngram_max = 3\ngamma = [2, 3]\n"))
    result = CliRunner().invoke(app, ["run", "p.toml"])
    assert result.exit_code == 2
    assert result.output.strip().startswith("error: p.toml: drafts[0].gamma: llama.cpp's ngram-simple drafts nothing "
                                            "when gamma (2)")


def test_a_launch_that_never_becomes_ready_fails_its_other_points_without_starting_again(tmp_path):
    """A server that exits at start-up (here: a llama-server stand-in that knows --help and nothing else) fails
    every point of its launch, with one start per launch configuration, not one per point."""
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n[ \"$1\" = --help ] && { echo '--spec-type TYPE'; echo '--spec-draft-n-max N'; "
                      "exit 0; }\necho 'cannot load model' >&2\nexit 1\n")
    binary.chmod(0o755)
    (tmp_path / "p.toml").write_text(f'name = "p"\nbackend = "server"\n[server]\nengine = "llama.cpp"\nbinary = "{binary}"\n'
                                     '[target]\nmodel = "builtin:smollm2-135m-instruct"\n'
                                     '[[drafts]]\nname = "ngram"\nmethod = "ngram"\n'
                                     '[sweep]\ngamma = [3]\ntemperature = [0.0, 0.8]\n'
                                     '[workload]\nprompts = "builtin:mixed"\nmax_prompts = 1\n')
    result = subprocess.run([sys.executable, "-m", "specbench.cli", "run", "p.toml", "--out", "out"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert len(manifest["server"]["launches"]) == 2  # the baseline, the n-gram: each started once
    points = pd.read_parquet(tmp_path / "out" / "points.parquet").set_index("point_id")
    assert (points["status"] == "failed").all() and len(points) == 4
    assert "cannot load model" in points.loc["baseline-t0-p1", "error"]
    assert points.loc["baseline-t0.8-p1", "error"].startswith("ServerFailed: this launch failed earlier (log ")


def test_greedy_requests_carry_no_seed_and_sampled_ones_do():
    from specbench.backends.server.client import Request, payload

    greedy = payload(Request(0, [{"role": "user", "content": "hi"}], 0.0, 1.0, 8, seed=7), model="m")
    sampled = payload(Request(0, [{"role": "user", "content": "hi"}], 0.8, 0.9, 8, seed=7), model="m")
    assert "seed" not in greedy and "top_p" not in greedy
    assert (sampled["seed"], sampled["top_p"]) == (7, 0.9)


def test_a_draft_whose_path_vllm_reads_as_another_method_is_refused(tmp_path, monkeypatch):
    """vLLM 0.32 reads a method off the draft's path whatever method it is given but eagle/eagle3: Medusa heads in a
    folder whose path holds "eagle3" failed to start as an "Eagle3MedusaModel" (tests/test_eagle3_engines.py ran them
    so once). Refused in one line naming the draft's model, exit 2, nothing written; EAGLE-3 heads may live there."""
    from typer.testing import CliRunner

    from specbench.cli import app

    vllm = ENGINES["vllm"]
    for method, path in (("medusa", "/runs/eagle3-vs-medusa/medusa"), ("draft", "/models/EAGLE-qwen/draft"),
                         ("draft", "/m/dflash-small")):
        with pytest.raises(EngineError, match="move or link the") as error:
            vllm.speculation_args(Speculation(method, 3, draft_model=path))
        assert error.value.field == "model"
    assert json.loads(vllm.speculation_args(Speculation("eagle3", 3, draft_model="/runs/eagle3-heads/h"))[1])["model"] \
        == "/runs/eagle3-heads/h"
    monkeypatch.chdir(tmp_path)
    heads = tmp_path / "eagle3-vs-medusa" / "medusa"
    heads.mkdir(parents=True)
    (tmp_path / "p.toml").write_text(f"""name = "p"
backend = "server"
[server]
engine = "vllm"
[target]
model = "builtin:smollm2-135m-instruct"
[[drafts]]
name = "medusa"
method = "medusa"
model = "{heads}"
[sweep]
gamma = [3]
temperature = [0.0]
[workload]
prompts = "builtin:mixed"
""")
    result = CliRunner().invoke(app, ["run", "p.toml"])
    assert result.exit_code == 2
    assert result.output.strip() == (f"error: p.toml: drafts[0].model: vLLM takes a draft whose path contains 'eagle3' "
                                     f"for an EAGLE-3 draft, whatever method it is given ({heads}): move or link the "
                                     "medusa draft to a path without 'eagle3'")
    assert not (tmp_path / "results").exists()

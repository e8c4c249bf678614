"""EAGLE-3 heads in the formats they are published in: `pytorch_model.bin` weights and the vLLM speculators format
read into the same head as vLLM's own format with safetensors (the same tensors, the same native-backend acceptance
and outputs), converted once (and cached) for the engines that read only vLLM's own format, fetched from the hub
as safetensors where a repo has both; bad input is one line naming the head, the key and the fix."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from eagle3_tiny import VERIFIER, save_bin, save_speculators, tiny_target, trained_head, untrained_head
from tiny import WORDS, write_model_folder

from specbench.backends.server import heads as server_heads
from specbench.engines import ENGINES
from specbench.models import eagle3_formats
from specbench.models.eagle3 import HeadError, convert_head, load_head, read_config, save_head
from specbench.profile import load_profile
from specbench.sweep import run_profile

FORMATS = {
    "bin": lambda head, folder: save_bin(head, folder),
    "speculators": lambda head, folder: save_speculators(head, folder, norm_before_residual=False),
    "speculators-bin": lambda head, folder: save_speculators(head, folder, weights="bin", norm_before_residual=False),
}


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def same_tensors(first, second) -> bool:
    a, b = first.state_dict(), second.state_dict()
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) and a[k].dtype == b[k].dtype for k in a)


# --- the same head ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("draft_vocab", [None, 24])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_loads_to_exactly_the_same_head(target, tmp_path, fmt, draft_vocab):
    vocab = None if draft_vocab is None else torch.arange(0, 2 * draft_vocab, 2)
    head = untrained_head(target, seed=3, draft_vocab=vocab)
    original = load_head(save_head(head, tmp_path / "safetensors"), target_config=target.config)
    loaded = load_head(FORMATS[fmt](head, tmp_path / fmt), target_config=target.config)
    assert same_tensors(loaded, original)
    for key in ("hidden_size", "vocab_size", "draft_vocab_size", "target_hidden_size", "num_attention_heads",
                "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps", "norm_before_residual",
                "eagle_aux_hidden_state_layer_ids"):
        assert getattr(loaded.config, key) == getattr(original.config, key), key


def test_speculators_norm_before_residual_is_read_as_vllm_reads_it(target, tmp_path):
    """Absent from a speculators config it means true (vLLM's speculators reader); absent from vLLM's own format,
    false. Written, it is what it says."""
    head = untrained_head(target)
    assert read_config(save_speculators(head, tmp_path / "absent")).norm_before_residual is True
    assert read_config(save_speculators(head, tmp_path / "false", norm_before_residual=False)).norm_before_residual \
        is False
    own = save_head(head, tmp_path / "own")
    data = json.loads((own / "config.json").read_text())
    del data["norm_before_residual"]
    (own / "config.json").write_text(json.dumps(data))
    assert read_config(own).norm_before_residual is False


def test_safetensors_are_preferred_and_a_trainers_state_is_no_head(target, tmp_path):
    head = untrained_head(target)
    folder = save_head(head, tmp_path / "both")
    (folder / "pytorch_model.bin").write_bytes(b"not read: the safetensors are")
    assert same_tensors(load_head(folder, target_config=target.config), head)
    folder = save_bin(head, tmp_path / "bin")
    torch.save({"learning_rate": torch.tensor(1e-3)}, folder / "training_args.bin")
    assert same_tensors(load_head(folder, target_config=target.config), head)


def test_a_bin_head_and_a_speculators_head_accept_what_the_original_accepts(tmp_path, monkeypatch):
    """The native backend on one profile with the three heads: the same acceptance, per position and per request,
    and the same outputs, greedy and sampled (the same seeds at every point)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    target = tiny_target(vocab_size=len(WORDS), seed=5)
    write_model_folder(tmp_path / "target", target)
    head, _ = trained_head(target, epochs=15)
    save_head(head, tmp_path / "original")
    save_bin(head, tmp_path / "bin")
    save_speculators(head, tmp_path / "speculators", norm_before_residual=False)
    prompts = ["the cat sat on the mat", "write code to sum one two three", "the red cat and the blue dog"]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    drafts = "".join(f'[[drafts]]\nname = "{name}"\nmethod = "eagle3"\nmodel = "{name}"\n'
                     for name in ("original", "bin", "speculators"))
    (tmp_path / "formats.toml").write_text(
        f'name = "formats"\nbackend = "native"\ndevice = "cpu"\n[target]\nmodel = "./target"\n{drafts}'
        '[sweep]\ngamma = [3]\ntemperature = [0.0, 0.8]\n'
        '[workload]\nprompts = "prompts.jsonl"\nmax_prompts = 3\nmax_new_tokens = 16\n[run]\nwarmup = 0\n')
    result = run_profile(load_profile(tmp_path / "formats.toml"), out=tmp_path / "out")
    assert result.failed == 0
    points = pd.read_parquet(tmp_path / "out" / "points.parquet")
    requests = pd.read_parquet(tmp_path / "out" / "requests.parquet").merge(
        points[["point_id", "draft", "temperature"]], on="point_id")
    heads = points[points["method"] == "eagle3"].set_index(["draft", "temperature"]).sort_index()
    assert heads.loc[("original", 0.0), "acceptance_rate"] > 0, "the test needs accepted drafts"
    columns = ["output_ids", "accepted_tokens", "drafted_tokens", "accepted_per_position"]
    for temperature in (0.0, 0.8):
        rows = {name: requests[(requests["draft"] == name) & (requests["temperature"] == temperature)]
                .sort_values("request_id")[columns].map(_plain).to_dict("records")
                for name in ("original", "bin", "speculators")}
        assert rows["bin"] == rows["original"] and rows["speculators"] == rows["original"], temperature
        for name in ("bin", "speculators"):
            for column in ("acceptance_rate", "mean_accepted_length", "accepted_per_position"):
                assert _plain(heads.loc[(name, temperature), column]) == \
                    _plain(heads.loc[("original", temperature), column]), (name, temperature, column)
    assert heads.loc[(slice(None), 0.0), "outputs_match_baseline"].all()


def _plain(value):
    return value.tolist() if hasattr(value, "tolist") else value


# --- converted for the engines that read only vLLM's own format -----------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_head_converts_to_vllms_own_format(target, tmp_path, fmt):
    head = untrained_head(target, draft_vocab=torch.arange(5, 29))
    out = convert_head(FORMATS[fmt](head, tmp_path / fmt), tmp_path / "converted")
    assert {path.name for path in out.iterdir()} == {"config.json", "model.safetensors"}
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["norm_before_residual"] is False
    assert config["specbench_converted_from"]["format"] == ("speculators" if "speculators" in fmt else "eagle3")
    assert same_tensors(load_head(out, target_config=target.config), head)


def test_a_conversion_keeps_each_tensors_dtype(target, tmp_path):
    head = untrained_head(target).to(torch.bfloat16)
    out = convert_head(save_speculators(head, tmp_path / "bf16"), tmp_path / "converted")
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(str(out / "model.safetensors")).values()} == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def engine_head(folder: Path, engine: str):
    return server_heads._engine_head(str(folder), str(folder.parent / "target"), ENGINES[engine], binary=None,
                                     say=lambda text: None)


def test_sglang_gets_the_head_converted_once_and_vllm_gets_it_as_it_is(target, tmp_path, cache, monkeypatch):
    write_model_folder(tmp_path / "target", target)
    source = save_speculators(untrained_head(target), tmp_path / "speculators", norm_before_residual=False)
    sglang = engine_head(source, "sglang")
    assert Path(sglang.reference).parent == cache / "heads-converted" and sglang.folder == str(source)
    assert same_tensors(load_head(Path(sglang.reference), target_config=target.config),
                        load_head(source, target_config=target.config))
    vllm = engine_head(source, "vllm")
    assert vllm.reference == str(source) and vllm.identity == sglang.identity

    def no_conversion(folder, out):
        raise AssertionError("converted again")

    monkeypatch.setattr(server_heads, "convert_head", no_conversion)
    assert engine_head(source, "sglang") == sglang  # the cache: keyed by the source's identity
    native = save_head(untrained_head(target), tmp_path / "own")
    assert engine_head(native, "sglang").reference == str(native)  # vLLM's own format with safetensors: as it is
    save_bin(untrained_head(target, seed=1), tmp_path / "other")
    with pytest.raises(AssertionError, match="converted again"):  # another head: another key
        engine_head(tmp_path / "other", "sglang")


def test_a_variant_specbench_cannot_convert_is_refused_for_sglang_only(target, tmp_path, cache):
    write_model_folder(tmp_path / "target", target)
    source = save_speculators(untrained_head(target), tmp_path / "variant")
    data = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**data, "norm_before_fc": True}))
    assert engine_head(source, "vllm").reference == str(source)
    with pytest.raises(HeadError, match=f"^{re.escape(str(source / 'config.json'))}: norm_before_fc: sglang is given "
                                        "heads in vLLM's own format, and specbench converts only the heads it runs "
                                        'itself; run this one on vLLM \\(engine = "vllm"\\), which reads it as it is$'):
        engine_head(source, "sglang")


# --- the hub ------------------------------------------------------------------------------------------------


@pytest.fixture
def hub(monkeypatch):
    """The hub's API on the loopback, for the real client: a model's info lists the files `hub.files` names (None:
    503 for everything, a hub out of reach); `hub.requests` lists what it was asked."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import huggingface_hub.constants

    class Hub(BaseHTTPRequestHandler):
        files: list[str] | None = None
        requests: list[str] = []

        def do_GET(self):  # noqa: N802 - http.server's name
            Hub.requests.append(self.path)
            if Hub.files is None:
                self.send_error(503)
                return
            body = json.dumps({"id": "someone/head", "siblings": [{"rfilename": name} for name in Hub.files]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    Hub.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    yield Hub
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("files, patterns", [
    (["config.json", "model.safetensors", "pytorch_model.bin"], ["*.json", "*.safetensors"]),
    (["config.json", "pytorch_model.bin", "training_args.bin"], ["*.json", "*.bin"]),
    (None, ["*.json", "*.safetensors", "*.bin"]),  # not listed (out of reach): whichever the cache holds
])
def test_a_hub_head_is_fetched_as_safetensors_where_it_has_them_asking_once(monkeypatch, tmp_path, hub, files,
                                                                             patterns):
    """The repo listed in one request, also where the hub does not answer: list_repo_files retried it with backoff,
    23 s on a machine without the hub before the error said so."""
    import huggingface_hub

    hub.files = files
    fetched = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda ref, allow_patterns: fetched.append(allow_patterns) or str(tmp_path))
    assert eagle3_formats.download("someone/head") == tmp_path
    assert fetched == [patterns]
    # (a client new to its cache also asks once for something else of its own)
    assert [path for path in hub.requests if path.startswith("/api/models/")] == ["/api/models/someone/head"]


# --- bad input: one line naming the head, the key and the fix -------------------------------------------------


def speculators_with(folder: Path, target, **changes) -> Path:
    save_speculators(untrained_head(target), folder, norm_before_residual=False)
    data = json.loads((folder / "config.json").read_text())
    data["transformer_layer_config"].update(changes.pop("layer", {}))
    data.update(changes)
    for key in [key for key, value in data.items() if value is ...]:
        del data[key]
    (folder / "config.json").write_text(json.dumps(data))
    return folder


CONFIG_CASES = {
    "hidden size": ({"layer": {"hidden_size": 96}},
                    "{path}: transformer_layer_config.hidden_size: 96 does not match the target's hidden_size 64 (the "
                    f"head reads the target's embeddings); use a head trained for this target (it was trained for "
                    f"{VERIFIER})"),
    "vocabulary": ({"layer": {"vocab_size": 128}},
                   "{path}: transformer_layer_config.vocab_size: 128 does not match the target's vocab_size 64; use a "
                   f"head trained for this target (it was trained for {VERIFIER})"),
    "target hidden size": ({"target_hidden_size": 96},
                           "{path}: target_hidden_size: 96 does not match the target's hidden_size 64; use a head "
                           f"trained for this target (it was trained for {VERIFIER})"),
    "aux layers": ({"eagle_aux_hidden_state_layer_ids": [1, 2, 9]},
                   "{path}: eagle_aux_hidden_state_layer_ids: [1, 2, 9] must be layers 0..5 of the target (5 decoder "
                   "layers); train the head for this target"),
    "layers": ({"layer": {"num_hidden_layers": 2}},
               "{path}: transformer_layer_config.num_hidden_layers: specbench runs one-layer EAGLE-3 heads (got 2)"),
    "another speculator": ({"speculators_model_type": "peagle"},
                           '{path}: speculators_model_type: "peagle" is not an EAGLE-3 head; use a speculator saved '
                           'as "eagle3"'),
    "no layer config": ({"transformer_layer_config": ...},
                        "{path}: transformer_layer_config: missing or not an object; a speculators-format head keeps "
                        "its layer's Llama config there"),
    "no speculators config": ({"speculators_config": ...},
                              "{path}: speculators_config: missing or not an object; vLLM reads the speculators format "
                              "by it (the proposal and the verifier)"),
    "a Qwen3 layer": ({"layer": {"model_type": "qwen3"}},
                      '{path}: transformer_layer_config.model_type: "qwen3": this head variant is not supported by the '
                      'native backend (run it on backend = "server")'),
}


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_a_speculators_head_that_does_not_fit_is_refused_in_one_line(target, tmp_path, case):
    changes, message = CONFIG_CASES[case]
    folder = speculators_with(tmp_path / "head", target, **dict(changes))
    with pytest.raises(HeadError, match=f"^{re.escape(message.format(path=folder / 'config.json'))}$"):
        load_head(folder, target_config=target.config)


def _pickled_object(path: Path) -> None:
    import argparse

    torch.save({"fc.weight": argparse.Namespace()}, path)


BIN_CASES = {
    "more than tensors": (_pickled_object, "{path}: holds more than tensors (torch.load with weights_only=True "
                                           "refused it); save the head's state dict alone, or as safetensors"),
    "truncated": (lambda path: path.write_bytes(path.read_bytes()[:200]),
                  "{path}: unreadable PyTorch weights (RuntimeError: PytorchStreamReader failed reading zip archive: "
                  "failed finding central directory); write the head again"),
    "no state dict": (lambda path: torch.save([torch.zeros(1)], path),
                      "{path}: not a state dict (a mapping of tensor names to tensors); save the head's state_dict()"),
}


@pytest.mark.parametrize("case", BIN_CASES)
def test_bin_weights_that_are_no_head_are_refused_in_one_line(target, tmp_path, case):
    spoil, message = BIN_CASES[case]
    folder = save_bin(untrained_head(target), tmp_path / "head")
    spoil(folder / "pytorch_model.bin")
    with pytest.raises(HeadError, match=f"^{re.escape(message.format(path=folder / 'pytorch_model.bin'))}$"):
        load_head(folder, target_config=target.config)


def test_a_folder_without_weights_is_refused_in_one_line(target, tmp_path):
    folder = save_head(untrained_head(target), tmp_path / "head")
    (folder / "model.safetensors").unlink()
    message = f"{folder}: no .safetensors or .bin weights; save the head with its tensors"
    with pytest.raises(HeadError, match=f"^{re.escape(message)}$"):
        load_head(folder, target_config=target.config)

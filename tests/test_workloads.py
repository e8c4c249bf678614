"""Tests for specbench.workloads.prompts: builtin sets, user files, selection, encoding, fingerprint."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from specbench.workloads.prompts import (
    BUILTIN_SETS,
    CATEGORIES,
    Prompt,
    WorkloadError,
    encode_prompt,
    load_prompts,
    workload_fingerprint,
)


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


# --- builtin sets -------------------------------------------------------------------------


def test_builtin_sets_are_mixed_then_categories_then_datasets():
    assert BUILTIN_SETS == ("mixed", "multi_turn", "code", "summarization", "translation",
                            "qa", "math", "rag", "sharegpt", "humaneval")


@pytest.mark.parametrize("category", CATEGORIES)
def test_builtin_category_has_at_least_ten_valid_prompts(category):
    prompts = load_prompts(f"builtin:{category}")

    assert len(prompts) >= 10
    assert {p.category for p in prompts} == {category}
    ids = [p.prompt_id for p in prompts]
    assert ids == [f"{category}-{n:02d}" for n in range(1, len(prompts) + 1)]
    for prompt in prompts:
        assert prompt.messages[-1]["role"] == "user"
        assert all(m["content"].strip() for m in prompt.messages)


def test_builtin_multi_turn_prompts_have_prior_turns():
    for prompt in load_prompts("builtin:multi_turn"):
        roles = [m["role"] for m in prompt.messages]
        assert roles[:2] == ["user", "assistant"] and len(roles) >= 3 and len(roles) % 2 == 1


def test_builtin_mixed_is_every_category_with_unique_ids():
    mixed = load_prompts("builtin:mixed")
    per_category = [load_prompts(f"builtin:{c}") for c in CATEGORIES]

    assert sorted(p.prompt_id for p in mixed) == sorted(
        p.prompt_id for group in per_category for p in group)
    assert len({p.prompt_id for p in mixed}) == len(mixed)


# --- selection ----------------------------------------------------------------------------


def test_mixed_max_prompts_7_takes_one_per_category():
    prompts = load_prompts("builtin:mixed", max_prompts=7)

    assert [p.prompt_id for p in prompts] == [
        "multi_turn-01", "code-01", "summarization-01", "translation-01", "qa-01", "math-01",
        "rag-01",
    ]


def test_mixed_max_prompts_9_starts_second_round_in_category_order():
    prompts = load_prompts("builtin:mixed", max_prompts=9)

    assert [p.prompt_id for p in prompts] == [
        "multi_turn-01", "code-01", "summarization-01", "translation-01", "qa-01", "math-01",
        "rag-01", "multi_turn-02", "code-02",
    ]


def test_single_category_max_prompts_keeps_file_order():
    assert [p.prompt_id for p in load_prompts("builtin:math", max_prompts=3)] == [
        "math-01", "math-02", "math-03"]


def test_category_filter_keeps_category_order_not_filter_order():
    prompts = load_prompts("builtin:mixed", categories=["rag", "code"], max_prompts=5)

    assert [p.prompt_id for p in prompts] == [
        "code-01", "rag-01", "code-02", "rag-02", "code-03"]


def test_max_prompts_beyond_set_size_returns_all():
    assert len(load_prompts("builtin:qa", max_prompts=1000)) == len(load_prompts("builtin:qa"))


def test_selection_is_deterministic():
    first = load_prompts("builtin:mixed", max_prompts=20)
    second = load_prompts("builtin:mixed", max_prompts=20)

    assert first == second
    assert workload_fingerprint(first) == workload_fingerprint(second)


# --- user files ---------------------------------------------------------------------------


def test_jsonl_user_file_loads_exact_prompts(tmp_path):
    path = write(tmp_path, "mine.jsonl", (
        '{"prompt": "What is 2+2?"}\n'
        "\n"
        '{"prompt": "Fix this bug", "category": "code", "id": "bug-1", "extra": 3}\n'
        '{"messages": [{"role": "system", "content": "Be brief."},'
        ' {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},'
        ' {"role": "user", "content": "Name a colour."}]}\n'
        "   \n"
    ))

    prompts = load_prompts(str(path))

    # Round-robin: builtin category "code" first, then the user category "user" in file order.
    assert prompts == [
        Prompt("bug-1", "code", (user("Fix this bug"),)),
        Prompt("mine-1", "user", (user("What is 2+2?"),)),
        Prompt("mine-3", "user", (
            {"role": "system", "content": "Be brief."}, user("Hi"),
            {"role": "assistant", "content": "Hello!"}, user("Name a colour."),
        )),
    ]


def test_jsonl_relative_path_resolves_against_cwd(tmp_path, monkeypatch):
    write(tmp_path, "rel.jsonl", '{"prompt": "a"}\n')
    monkeypatch.chdir(tmp_path)

    assert load_prompts("rel.jsonl") == [Prompt("rel-1", "user", (user("a"),))]


def test_csv_user_file_loads_exact_prompts(tmp_path):
    path = write(tmp_path, "set.csv", (
        "id,prompt,category,notes\n"
        'a,"Summarize: one, two, three.",summarization,x\n'
        ',"Line one\nline two",,\n'
        "c,Plain question,,ignored\n"
    ))

    prompts = load_prompts(str(path))

    assert prompts == [
        Prompt("a", "summarization", (user("Summarize: one, two, three."),)),
        Prompt("set-2", "user", (user("Line one\nline two"),)),
        Prompt("c", "user", (user("Plain question"),)),
    ]


def test_user_file_category_filter_and_max_prompts(tmp_path):
    path = write(tmp_path, "p.jsonl", "".join(
        f'{{"prompt": "q{n}", "category": "{cat}"}}\n'
        for n, cat in enumerate(["alpha", "beta", "alpha", "beta", "gamma"], start=1)))

    prompts = load_prompts(str(path), categories=["beta", "alpha"], max_prompts=3)

    assert [(p.prompt_id, p.category) for p in prompts] == [
        ("p-1", "alpha"), ("p-2", "beta"), ("p-3", "alpha")]


# --- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "content", "message"), [
    ("p.jsonl", '{"prompt": "a"}\n{"prompt": "b"\n',
     "p.jsonl line 2: invalid JSON: Expecting ',' delimiter at column 15 "
     "(each line must be one JSON object)"),
    ("p.jsonl", '["a"]\n',
     "p.jsonl line 1: expected a JSON object, got a list (each line must be one JSON object)"),
    ("p.jsonl", '{"prompt": "a"}\n\n{"text": "b"}\n',
     "p.jsonl line 3: missing key 'prompt' "
     "(each line needs a \"prompt\" string or a \"messages\" list)"),
    ("p.jsonl", '{"prompt": "  "}\n',
     "p.jsonl line 1: empty 'prompt' (give the prompt text)"),
    ("p.jsonl", '{"prompt": 42}\n',
     "p.jsonl line 1: key 'prompt' must be a string, got a number"),
    ("p.jsonl", '{"prompt": "a", "category": null}\n',
     "p.jsonl line 1: key 'category' must be a string, got null"),
    ("p.jsonl", '{"prompt": "a", "id": ""}\n',
     "p.jsonl line 1: empty 'id' (give a value or leave the key out)"),
    ("p.jsonl", '{"prompt": "a", "messages": []}\n',
     "p.jsonl line 1: both 'prompt' and 'messages' given (keep one of them)"),
    ("p.jsonl", '{"messages": "hi"}\n',
     "p.jsonl line 1: key 'messages' must be a non-empty list of "
     '{"role": ..., "content": ...} objects'),
    ("p.jsonl", '{"messages": [{"role": "user"}]}\n',
     "p.jsonl line 1: messages[0] must be an object with string 'role' and 'content'"),
    ("p.jsonl", '{"messages": [{"role": "bot", "content": "x"}]}\n',
     "p.jsonl line 1: messages[0] has unknown role 'bot' (use one of: system, user, assistant)"),
    ("p.jsonl", '{"messages": [{"role": "user", "content": "x"}, '
                '{"role": "assistant", "content": "y"}]}\n',
     "p.jsonl line 1: the last message must have role 'user' (the model answers it), "
     "got 'assistant'"),
    ("p.jsonl", '{"prompt": "a", "id": "x"}\n{"prompt": "b"}\n{"prompt": "c", "id": "x"}\n',
     "p.jsonl line 3: duplicate id 'x' (first used on line 1; ids must be unique)"),
    ("p.jsonl", '{"prompt": "a", "id": "p-2"}\n{"prompt": "b"}\n',
     "p.jsonl line 2: duplicate id 'p-2' (first used on line 1; ids must be unique)"),
    ("p.jsonl", "\n  \n",
     'p.jsonl: no prompts found (add one JSON object per line with a "prompt")'),
    ("p.csv", "",
     'p.csv: no prompts found (add a header row, then one row per prompt with a "prompt")'),
    ("p.csv", "prompt,category\n",
     'p.csv: no prompts found (add a header row, then one row per prompt with a "prompt")'),
    ("p.csv", "text,category\nhello,qa\n",
     "p.csv: missing column 'prompt' (the header row needs a \"prompt\" column)"),
    ("p.csv", "prompt,id\nhello,a\n,b\n",
     "p.csv row 3: empty 'prompt' (give the prompt text)"),
    ("p.csv", "prompt,id\nhello,a\nbye,a\n",
     "p.csv row 3: duplicate id 'a' (first used on row 2; ids must be unique)"),
    ("p.jsonl", b'{"prompt": "caf\xe9"}\n',
     "p.jsonl: not valid UTF-8 at byte 15 (save the file as UTF-8)"),
    ("p.txt", "hello\n",
     "p.txt: unsupported file type '.txt' (use a .jsonl or .csv file, or builtin:SET with SET "
     "one of: mixed, multi_turn, code, summarization, translation, qa, math, rag, sharegpt, humaneval)"),
])
def test_bad_user_file_raises_exact_message(tmp_path, name, content, message):
    path = write(tmp_path, name, content)

    with pytest.raises(WorkloadError) as error:
        load_prompts(str(path))

    assert str(error.value) == message


def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "absent.jsonl"

    with pytest.raises(WorkloadError) as error:
        load_prompts(str(path))

    assert str(error.value) == (
        f"prompt file not found: {path} "
        "(check the path; relative paths are relative to the current directory)")


def test_unknown_builtin_set():
    with pytest.raises(WorkloadError, match=re.escape(
            "unknown builtin prompt set 'chat' (choose one of: mixed, multi_turn, code, "
            "summarization, translation, qa, math, rag, sharegpt, humaneval)")):
        load_prompts("builtin:chat")


def test_unknown_category_filter_on_builtin_set():
    with pytest.raises(WorkloadError) as error:
        load_prompts("builtin:code", categories=["math"])

    assert str(error.value) == "builtin:code: unknown category 'math' (categories here: code)"


def test_unknown_category_filter_on_user_file(tmp_path):
    path = write(tmp_path, "p.jsonl", '{"prompt": "a"}\n{"prompt": "b", "category": "qa"}\n')

    with pytest.raises(WorkloadError) as error:
        load_prompts(str(path), categories=["qa", "chat"])

    assert str(error.value) == "p.jsonl: unknown category 'chat' (categories here: qa, user)"


def test_empty_category_filter():
    with pytest.raises(WorkloadError) as error:
        load_prompts("builtin:qa", categories=[])

    assert str(error.value) == "builtin:qa: the category filter is empty (name at least one of: qa)"


def test_max_prompts_below_one():
    with pytest.raises(WorkloadError) as error:
        load_prompts("builtin:mixed", max_prompts=0)

    assert str(error.value) == "max_prompts must be at least 1, got 0"


def test_workload_error_is_a_value_error():
    assert issubclass(WorkloadError, ValueError)


# --- encode_prompt ------------------------------------------------------------------------

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
VOCAB = {"[UNK]": 0, "<s>": 1, "\n\n": 2, "hello": 3, "world": 4,
         "<system>": 5, "<user>": 6, "<assistant>": 7}


@pytest.fixture
def tokenizer():
    """A tiny offline WordLevel tokenizer that adds <s> as its special token."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\n\n"), behavior="isolated"),
        pre_tokenizers.Split(" ", behavior="removed"),
    ])
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", bos_token="<s>")


CONVERSATION = Prompt("c-1", "multi_turn", (
    {"role": "system", "content": "hello"},
    user("hello world"),
    {"role": "assistant", "content": "world"},
    user("world hello"),
))


def test_encode_prompt_without_chat_template_joins_contents(tokenizer):
    assert not tokenizer.chat_template

    ids = encode_prompt(tokenizer, CONVERSATION)

    # "<s> hello \n\n hello world \n\n world \n\n world hello"
    assert ids == [1, 3, 2, 3, 4, 2, 4, 2, 4, 3]
    assert type(ids) is list and all(type(t) is int for t in ids)


def test_encode_prompt_with_chat_template_adds_generation_prompt(tokenizer):
    tokenizer.chat_template = CHAT_TEMPLATE

    ids = encode_prompt(tokenizer, CONVERSATION)

    # "<system> hello <user> hello world <assistant> world <user> world hello <assistant>"
    assert ids == [5, 3, 6, 3, 4, 7, 4, 6, 4, 3, 7]
    assert type(ids) is list and all(type(t) is int for t in ids)


def test_encode_prompt_does_not_mutate_prompt(tokenizer):
    tokenizer.chat_template = CHAT_TEMPLATE
    prompt = Prompt("p-1", "user", (user("hello"),))

    encode_prompt(tokenizer, prompt)

    assert prompt == Prompt("p-1", "user", ({"role": "user", "content": "hello"},))


# --- workload_fingerprint -----------------------------------------------------------------


def test_fingerprint_is_sha256_of_canonical_json():
    prompts = [Prompt("a", "qa", (user("Why?"),)), Prompt("b", "user", (user("café"),))]
    canonical = (
        '[{"category":"qa","id":"a","messages":[{"content":"Why?","role":"user"}]},'
        '{"category":"user","id":"b","messages":[{"content":"café","role":"user"}]}]'
    )

    assert workload_fingerprint(prompts) == hashlib.sha256(canonical.encode()).hexdigest()


def test_fingerprint_changes_with_content_and_order():
    a = Prompt("a", "qa", (user("Why?"),))
    b = Prompt("b", "qa", (user("How?"),))
    base = workload_fingerprint([a, b])

    assert workload_fingerprint([b, a]) != base
    assert workload_fingerprint([a, Prompt("b", "qa", (user("How??"),))]) != base
    assert workload_fingerprint([a, Prompt("b", "code", (user("How?"),))]) != base
    assert workload_fingerprint([a]) != base

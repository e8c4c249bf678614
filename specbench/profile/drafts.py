"""The profile's [[drafts]] tables: each proposer swept against the baseline (a draft model, an n-gram lookup, an
EAGLE-3 or Medusa head, ...), with its own gammas or a gamma per batch size where it needs them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import re

from pydantic import StrictInt, StrictStr, field_validator, model_validator

from specbench.core.imposed import check_entries
from specbench.engines.base import EngineError, check_schedule
from specbench.profile.fields import Axis, FolderName, PositiveInt, Quantize, Table
from specbench.profile.references import ModelReference, is_trained_head
from specbench.profile.validation import URL_PATTERN, converted, rule, show


DRAFT_MODEL_METHODS = ("draft", "eagle", "eagle3", "medusa")  # need a model: the draft, or the target's heads
NATIVE_METHODS = ("draft", "ngram", "eagle3", "medusa", "mtp")  # what the native backend drafts with (hf: draft, ngram)


class DraftSpec(Table):
    name: FolderName
    method: Literal["draft", "ngram", "eagle", "eagle3", "mtp", "medusa"]
    model: ModelReference | None = None
    quantize: Quantize | None = None
    ngram_min: PositiveInt = 1
    ngram_max: PositiveInt = 3
    # a gamma per batch size, [[first, last, gamma], ...] from batch size 1 (gamma 0: no drafting there), instead of
    # the sweep's gammas: vLLM's num_speculative_tokens_per_batch_size, as `specbench tune` recommends it under load
    gamma_schedule: Annotated[tuple[tuple[StrictInt, ...], ...], converted(check_schedule, EngineError)] | None = None
    # this draft's gammas instead of sweep.gamma (e.g. an n-gram lookup that needs gamma >= its n-gram size on
    # llama.cpp, beside a head swept from 1)
    gamma: Annotated[tuple[PositiveInt, ...], Axis] | None = None
    # a deployment already running this draft (with server.url, the baseline's): measured as it is, nothing launched;
    # method, model and gamma then say what it runs, for the tables
    url: StrictStr | None = None
    # an acceptance what-if: instead of this draft's own acceptance, each entry imposed in turn (a point per entry) —
    # a list of per-position unconditional rates (one per position up to the largest gamma), or a mean accepted
    # length; the draft still runs and costs what it costs, its tokens are kept per the imposed rates, not verified
    # (specbench.core.imposed). Points say acceptance_source = "synthetic" and are not lossless. The entry "measured"
    # runs the draft's own point too (verified, as without `acceptance`): predicted and measured side by side.
    acceptance: Annotated[tuple[Any, ...], converted(check_entries)] | None = None
    # a draft model whose tokenizer is not the target's: how it proposes (specbench.decoding.vocab) — "intersection"
    # (its distribution on the tokens both vocabularies share: lossless at any temperature; the default in-process)
    # or "text" (its greedy text, re-tokenised for the target); on vLLM either runs as use_heterogeneous_vocab
    vocabulary: Literal["intersection", "text"] | None = None

    @field_validator("acceptance", mode="before")
    @classmethod
    def _acceptance_list(cls, value):
        if value is not None and not isinstance(value, (list, tuple)):
            raise rule(f"must be a list: per-position rates ([[0.8, 0.6, 0.4]]) or mean accepted lengths ([1.5, 2.5]) "
                       f"(got {show(value)})")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        if url is not None and not re.fullmatch(URL_PATTERN, url):
            raise rule(f'must be "http://HOST:PORT" (got {show(url)})')
        return url

    @model_validator(mode="after")
    def _fits_method(self) -> "DraftSpec":
        if self.gamma is not None and self.gamma_schedule is not None:
            raise rule("gamma_schedule already sets this draft's gammas (remove gamma)", at=("gamma",))
        if self.model is not None and is_trained_head(self.model) and self.method != "eagle3":
            raise rule(f'trained:... is an EAGLE-3 head: set method = "eagle3", or a draft model for '
                        f'method "{self.method}"', at=("model",))
        if self.method == "mtp" and self.model is not None:
            raise rule('"mtp" drafts with the target\'s own MTP layers (remove model; for a target without them, '
                       'target.mtp = "trained:quick" makes one)', at=("model",))
        if self.vocabulary is not None and self.method != "draft":
            raise rule(f'a vocabulary of its own is a draft model\'s (method "draft"), not method "{self.method}"\'s '
                       "(remove vocabulary)", at=("vocabulary",))
        if self.method != "ngram":
            if self.model is None and self.method in DRAFT_MODEL_METHODS and self.url is None:
                raise rule(
                    f'required for method "{self.method}" (set model = "builtin:..." or a hub id/path)',
                    at=("model",),
                )
            for key in ("ngram_min", "ngram_max"):
                if key in self.model_fields_set:
                    raise rule(f'not used by method "{self.method}" (remove it)', at=(key,))
        else:
            for key in ("model", "quantize"):
                if getattr(self, key) is not None:
                    raise rule(
                        'not used by method "ngram" (remove it, or set method = "draft")',
                        at=(key,),
                    )
            if self.ngram_min > self.ngram_max:
                raise rule(
                    f"must be <= ngram_max = {self.ngram_max} (got {self.ngram_min})",
                    at=("ngram_min",),
                )
        return self

"""The hf backend: transformers' own `generate` (assisted generation for a draft model, prompt lookup for
n-grams) on the same models, as the reference implementation. Its acceptance is not observable per step;
the warm start's verify costs are not timed (its drafting is not visible either). A draft with another tokenizer runs
through transformers' `assistant_tokenizer`: its text re-tokenised when greedy (universal assisted generation), the
token-level intersection when sampling (which prunes the draft's output layer to the shared tokens: sampled points
draft with one copy, so the greedy points keep the whole layer)."""

from __future__ import annotations

import copy
from typing import Any

from specbench.backends.inprocess import GenerateOne, InProcessBackend, InProcessSession
from specbench.decoding.hf import hf_generate
from specbench.core.results import PointSpec


class HfSession(InProcessSession):
    backend = "hf"

    def __init__(self, models) -> None:
        super().__init__(models)
        self._pruned: dict[str, Any] = {}  # draft name -> the copy transformers prunes for sampled points

    def generate_one(self, spec: PointSpec) -> GenerateOne:
        m = self.models
        draft = m.draft_model(spec)
        model = draft.model if draft else None
        tokenizers: dict[str, Any] = {}
        if draft is not None and spec.draft in m.vocabularies:
            tokenizers = {"tokenizer": m.target.tokenizer, "assistant_tokenizer": draft.tokenizer}
            if spec.temperature > 0:  # transformers prunes the draft's output layer for the intersection, once per
                # tokenizer pair (it caches the pruned map): every sampled point drafts with one pruned copy
                if spec.draft not in self._pruned:
                    self._pruned[spec.draft] = copy.deepcopy(model)
                model = self._pruned[spec.draft]
        return lambda ids, seed, max_new_tokens: hf_generate(
            m.target.model, ids, method=spec.method, gamma=spec.gamma or 1, seed=seed, draft=model,
            ngram_max=spec.ngram_max or 3, temperature=spec.temperature, top_p=spec.top_p,
            max_new_tokens=max_new_tokens, eos_token_ids=m.eos_token_ids, **tokenizers)

    def point_context(self, spec: PointSpec) -> dict[str, Any]:
        """A draft of another tokenizer drafts as transformers does: by text when greedy, by intersection else."""
        context = super().point_context(spec)
        if "vocabulary" in context:
            context["vocabulary"] = "text" if spec.temperature == 0 else "intersection"
        return context


BACKEND = InProcessBackend("hf", HfSession)

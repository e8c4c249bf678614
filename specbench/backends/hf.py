"""The hf backend: transformers' own `generate` (assisted generation for a draft model, prompt lookup for
n-grams) on the same models, as the reference implementation. Its acceptance is not observable per step;
the warm start's verify costs are not timed (its drafting is not visible either)."""

from __future__ import annotations

from specbench.backends.inprocess import GenerateOne, InProcessBackend, InProcessSession
from specbench.decoding.hf import hf_generate
from specbench.core.results import PointSpec


class HfSession(InProcessSession):
    backend = "hf"

    def generate_one(self, spec: PointSpec) -> GenerateOne:
        m = self.models
        draft = m.draft_model(spec)
        return lambda ids, seed, max_new_tokens: hf_generate(
            m.target.model, ids, method=spec.method, gamma=spec.gamma or 1, seed=seed,
            draft=draft.model if draft else None, ngram_max=spec.ngram_max or 3, temperature=spec.temperature,
            top_p=spec.top_p, max_new_tokens=max_new_tokens, eos_token_ids=m.eos_token_ids)


BACKEND = InProcessBackend("hf", HfSession)

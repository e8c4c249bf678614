"""The native backend: specbench's instrumented engine (`specbench.decoding`), one request at a time, with
per-step acceptance and timings."""

from __future__ import annotations

from specbench.backends.inprocess import GenerateOne, InProcessBackend, InProcessSession, LoadedModels
from specbench.decoding import BaselineProposer, DraftModelProposer, Eagle3Proposer, NgramProposer, Proposer, generate
from specbench.decoding.costs import verify_costs_ms
from specbench.results import PointSpec


class NativeSession(InProcessSession):
    backend = "native"

    def __init__(self, models: LoadedModels):
        super().__init__(models)
        self._verify_costs: dict[int, tuple[float, ...]] = {}

    def generate_one(self, spec: PointSpec) -> GenerateOne:
        m = self.models
        proposer = self.proposer(spec)
        return lambda ids, seed, max_new_tokens: generate(
            m.target.model, proposer, ids, gamma=spec.gamma or 1, seed=seed, temperature=spec.temperature,
            top_p=spec.top_p, max_new_tokens=max_new_tokens, eos_token_ids=m.eos_token_ids)

    def proposer(self, spec: PointSpec) -> Proposer:
        m = self.models
        if spec.method == "baseline":
            return BaselineProposer(m.device)
        if spec.method == "ngram":
            return NgramProposer(ngram_min=spec.ngram_min, ngram_max=spec.ngram_max, device=m.device)
        if spec.method == "eagle3":
            return Eagle3Proposer(m.draft_model(spec).model, m.target.model, device=m.device, name=spec.draft)
        vocab_size = m.target.model.get_output_embeddings().weight.shape[0]
        return DraftModelProposer(m.draft_model(spec).model, vocab_size=vocab_size, device=m.device, name=spec.draft)

    def verify_costs(self, max_tokens: int) -> tuple[float, ...]:
        """The target's forward time for 1..max_tokens tokens, after a typical context (the median prompt
        plus half the output); timed once per process."""
        if max_tokens not in self._verify_costs:
            prompt_tokens = sorted(self.prompt_tokens)
            budgets = sorted(self.workload.max_new_tokens)
            context = prompt_tokens[len(prompt_tokens) // 2] + budgets[len(budgets) // 2] // 2
            self._verify_costs[max_tokens] = verify_costs_ms(self.models.target.model, max_tokens=max_tokens,
                                                             context_tokens=max(context, 1))
        return self._verify_costs[max_tokens]


BACKEND = InProcessBackend("native", NativeSession)

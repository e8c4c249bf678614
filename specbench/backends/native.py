"""The native backend: specbench's instrumented engine (`specbench.decoding`), one request at a time, with
per-step acceptance and timings."""

from __future__ import annotations

from typing import Any

import torch

from specbench.backends.inprocess import GenerateOne, InProcessBackend, InProcessSession, LoadedModels
from specbench.decoding import BaselineProposer, DraftModelProposer, Eagle3Proposer, NgramProposer, Proposer, generate
from specbench.decoding.costs import verify_costs_ms
from specbench.decoding.static import BUCKETS, StaticModel
from specbench.errors import one_line
from specbench.results import PointSpec

DRAFT_STEP_TOKENS = 2  # a draft model's step feeds at most the bonus token and the last accepted draft


def compile_enabled(models: LoadedModels) -> bool:
    """run.compile, else on a GPU only. On the 2-core CPU the embedded SmolLM2-135M's compiled steps were ~11 % faster
    than eager ones (1 thread: 49.6 vs 55.7 ms at 1 token, 80.7 vs 91.5 ms at 4) while compiling cost 30-50 s per
    step bucket: more than a quickstart-sized run saves."""
    chosen = models.profile.run.compile
    return chosen if chosen is not None else models.device.type == "cuda"


class NativeSession(InProcessSession):
    backend = "native"

    def __init__(self, models: LoadedModels):
        super().__init__(models)
        self._verify_costs: dict[int, tuple[float, ...]] = {}
        self.compiled = compile_enabled(models)
        # each distinct model (target, drafts): its StaticModel, or why it decodes on a dynamic cache
        self.static: dict[int, StaticModel | str] = {}
        if self.compiled:
            self._prepare_static()

    def _prepare_static(self) -> None:
        """A static cache for every model that can take one, its steps compiled for the profile's gammas now,
        before the manifest and the first point; a model that fails to compile keeps the dynamic cache."""
        m = self.models
        capacity = max(len(ids) + budget for ids, budget in zip(m.prompt_ids, m.workload.max_new_tokens)) + BUCKETS[-1]
        max_gamma = max(m.profile.all_gammas(), default=1)
        needs = [(m.target.model, m.target.name, max_gamma + 1)]
        needs += [(draft.model, draft.name, DRAFT_STEP_TOKENS) for spec in m.profile.drafts if spec.method == "draft"
                  and not isinstance(draft := m.drafts.get(spec.name), Exception) and draft is not None]
        for model, name, tokens in needs:
            if id(model) in self.static:
                continue
            try:
                static = StaticModel(model, capacity=capacity, name=name)
                static.warm_up(range(1, tokens + 1))
                self.static[id(model)] = static
            except ValueError as error:  # a cache layout the static cache cannot hold
                self.static[id(model)] = one_line(error)
            except Exception as error:  # noqa: BLE001 - whatever compilation raises: this model stays eager
                self.static[id(model)] = f"compilation failed: {one_line(error)}"

    def decoding(self, model: torch.nn.Module) -> torch.nn.Module | StaticModel:
        """What `model` decodes with: its StaticModel, else the module itself (a dynamic cache per request)."""
        static = self.static.get(id(model))
        return static if isinstance(static, StaticModel) else model

    @property
    def identity(self) -> dict[str, Any]:
        return {**super().identity, **({"compile": True} if self.compiled else {})}

    def point_context(self, spec: PointSpec) -> dict[str, Any]:
        """kv_cache: "static" when every model of the point decodes on a static cache (its steps compiled), else
        "dynamic" with the reason."""
        m = self.models
        models = [m.target.model] + ([m.draft_model(spec).model] if spec.method == "draft" and
                                     not isinstance(m.drafts.get(spec.draft), Exception) else [])
        if not self.compiled:
            reasons = ["run.compile is off"]
        elif spec.method == "eagle3":
            reasons = ["eagle3 reads the target's hidden states through hooks (runs eagerly)"]
        else:
            reasons = [self.static[id(model)] for model in models if isinstance(self.static.get(id(model)), str)]
        return {**super().point_context(spec), "kv_cache": "dynamic" if reasons else "static",
                "kv_cache_reason": "; ".join(reasons) if reasons else None}

    def generate_one(self, spec: PointSpec) -> GenerateOne:
        m = self.models
        proposer = self.proposer(spec)
        target = m.target.model if spec.method == "eagle3" else self.decoding(m.target.model)
        if isinstance(target, StaticModel):
            target.warm_up(range(1, (spec.gamma or 1) + 2))  # a gamma beyond the profile's compiles here, untimed
        return lambda ids, seed, max_new_tokens: generate(
            target, proposer, ids, gamma=spec.gamma or 1, seed=seed, temperature=spec.temperature,
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
        return DraftModelProposer(self.decoding(m.draft_model(spec).model), vocab_size=vocab_size, device=m.device,
                                  name=spec.draft)

    def verify_costs(self, max_tokens: int) -> tuple[float, ...]:
        """The target's forward time for 1..max_tokens tokens, after a typical context (the median prompt
        plus half the output), on the path its points decode on; timed once per process."""
        if max_tokens not in self._verify_costs:
            prompt_tokens = sorted(self.prompt_tokens)
            budgets = sorted(self.workload.max_new_tokens)
            context = prompt_tokens[len(prompt_tokens) // 2] + budgets[len(budgets) // 2] // 2
            target = self.decoding(self.models.target.model)
            if isinstance(target, StaticModel):
                target.warm_up(range(1, max_tokens + 1))
            self._verify_costs[max_tokens] = verify_costs_ms(target, max_tokens=max_tokens,
                                                             context_tokens=max(context, 1))
        return self._verify_costs[max_tokens]

    def describe(self) -> dict[str, Any]:
        """The manifest's entries, with what compilation cost: seconds per model and bucket of padded step tokens."""
        described = super().describe()
        if not self.compiled:
            return {**described, "compile": {"enabled": False}}
        models = {}
        for model, name in [(self.models.target.model, self.models.target.name),
                            *[(d.model, d.name) for d in self.models.drafts.values() if not isinstance(d, Exception)]]:
            static = self.static.get(id(model))
            if isinstance(static, StaticModel):
                models[name] = {"kv_cache": "static", "compile_s": sum(static.compile_s.values()),
                                "compile_s_by_step_tokens": {str(k): v for k, v in sorted(static.compile_s.items())},
                                "mode": "cuda graphs" if static.graphs else "inductor"}
            elif static is not None:
                models[name] = {"kv_cache": "dynamic", "reason": static}
        return {**described, "compile": {"enabled": True, "models": models}}


BACKEND = InProcessBackend("native", NativeSession)

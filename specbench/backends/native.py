"""The native backend: specbench's instrumented engine (`specbench.decoding`), one request at a time, with
per-step acceptance and timings."""

from __future__ import annotations

from typing import Any

import torch

from specbench.backends.inprocess import GenerateOne, InProcessBackend, InProcessSession, LoadedModels
from specbench.decoding.proposers import BaselineProposer, DraftModelProposer, NgramProposer, Proposer
from specbench.decoding.medusa import MedusaProposer
from specbench.decoding.vocab import CrossVocabularyProposer
from specbench.decoding.eagle3 import Eagle3Proposer, MtpProposer
from specbench.decoding.decode import generate
from specbench.decoding.costs import verify_costs_ms
from specbench.decoding.static import BUCKETS, StaticModel, buckets_to_freeze, captured_cuda_graphs, freeze_refusal
from specbench.decoding.devices import available_bytes
from specbench.core.errors import one_line
from specbench.models.load import LoadedModel, weight_bytes
from specbench.core.results import PointSpec

DRAFT_STEP_TOKENS = 2  # a draft model's step feeds at most the bonus token and the last accepted draft


def compile_enabled(models: LoadedModels) -> bool:
    """run.compile, else on a GPU only. On the 2-core CPU (`make bench`, embedded SmolLM2-135M, fp32) the compiled
    baseline made 1.05x the eager tokens/s and n-gram gamma 3 1.25x, but compiling its three step buckets took 95 s:
    more than a quickstart-sized run saves, and its int8 self-draft cannot compile at all (the run would fall back
    to eager)."""
    chosen = models.profile.run.compile
    return chosen if chosen is not None else models.device.type == "cuda"


class NativeSession(InProcessSession):
    backend = "native"

    def __init__(self, models: LoadedModels):
        super().__init__(models)
        self._verify_costs: dict[int, tuple[float, ...]] = {}
        self.compiled = compile_enabled(models)
        # with run.compile: each distinct model's StaticModel (the target's and the drafts'), or why none serves the run
        self.static: dict[int, StaticModel] = {}
        self.fallback: str | None = None
        self.freeze_refusal: str | None = None  # why the CPU graphs are not frozen (their copies would not fit)
        if self.compiled:
            self._prepare_static()

    def _prepare_static(self) -> None:
        """A static cache for every model of the run, its steps compiled for the profile's gammas now, before the
        manifest and the first point — or none at all: when one model cannot take one (a cache layout it cannot
        hold, a compilation that fails), every point decodes eagerly, so that each speedup divides like by like (a
        compiled baseline under an eager draft's points would credit the draft with the compiler's loss). Drafts
        first: they are where it fails, and the target's compilation is then not spent. An EAGLE-3 head's aux-state
        hooks are compiled into the target's step (the head itself runs eagerly: ~3 ms per drafted token)."""
        m = self.models
        heads = {spec.name: draft.model for spec in m.profile.drafts
                 if spec.method in ("eagle3", "mtp") and isinstance(draft := m.drafts.get(spec.name), LoadedModel)}
        layers = {name: tuple(head.aux_layer_ids) for name, head in heads.items()}
        if len(set(layers.values())) > 1:
            (first, one), (second, other) = list(layers.items())[:2]
            self.fallback = (f"the drafters {first} and {second} read different layers of the target ({list(one)} "
                             f"and {list(other)}), and its compiled step keeps one set: every point decodes eagerly")
            return
        aux_layers = next(iter(layers.values()), ())
        capacity = max(len(ids) + budget for ids, budget in zip(m.prompt_ids, m.workload.max_new_tokens)) + BUCKETS[-1]
        max_gamma = max(m.profile.all_gammas(), default=1)
        needs = [(draft.model, f"draft {spec.name}", DRAFT_STEP_TOKENS) for spec in m.profile.drafts
                 if spec.method == "draft" and spec.name not in m.vocabularies  # another tokenizer: dynamic
                 and isinstance(draft := m.drafts.get(spec.name), LoadedModel)]
        needs.append((m.target.model, "target", max_gamma + 1))
        if m.device.type == "cpu":  # CUDA graphs are not frozen
            distinct = {id(model): (weight_bytes(model), len(buckets_to_freeze(range(1, tokens + 1))))
                        for model, _, tokens in needs}
            self.freeze_refusal = freeze_refusal(list(distinct.values()), available_bytes(m.device))
        for model, role, tokens in needs:
            if id(model) in self.static:
                continue
            static = None
            try:
                static = StaticModel(model, capacity=capacity, name=role, freeze=self.freeze_refusal is None,
                                     aux_layers=aux_layers if model is m.target.model else ())
                static.warm_up(range(1, tokens + 1))
            except ValueError as error:  # a cache layout the static cache cannot hold
                reason = one_line(error)
            except Exception as error:  # noqa: BLE001 - whatever compilation raises
                reason = f"{role} failed to compile: {one_line(error)}"
            else:
                self.static[id(model)] = static
                continue
            for built in [*self.static.values(), static]:
                if built is not None:
                    built.close()  # its hooks off the model
            self.static.clear()
            self.fallback = f"{reason}: every point decodes eagerly"
            return

    def decoding(self, model: torch.nn.Module) -> torch.nn.Module | StaticModel:
        """What `model` decodes with: its StaticModel, else the module itself (a dynamic cache per request)."""
        return self.static.get(id(model), model)

    @property
    def identity(self) -> dict[str, Any]:
        return {**super().identity, **({"compile": True} if self.static else {})}

    def point_context(self, spec: PointSpec) -> dict[str, Any]:
        """kv_cache: "static" when the run decodes on static caches (its steps compiled), else "dynamic" and why."""
        reason = "run.compile is off" if not self.compiled else self.fallback
        if spec.method == "medusa" and reason is None:
            reason = "Medusa heads read the target's last norm through a hook: its points decode eagerly"
        return {**super().point_context(spec), "kv_cache": "dynamic" if reason else "static", "kv_cache_reason": reason}

    def generate_one(self, spec: PointSpec) -> GenerateOne:
        m = self.models
        proposer = self.proposer(spec)
        # Medusa reads the target's last norm through a hook: its points decode the target eagerly
        target = m.target.model if spec.method == "medusa" else self.decoding(m.target.model)
        if isinstance(target, StaticModel):
            target.warm_up(range(1, (spec.gamma or 1) + 2))  # a gamma beyond the profile's compiles here, untimed
        return lambda ids, seed, max_new_tokens: generate(
            target, proposer, ids, gamma=spec.gamma or 1, seed=seed, temperature=spec.temperature,
            top_p=spec.top_p, max_new_tokens=max_new_tokens, eos_token_ids=m.eos_token_ids,
            imposed_acceptance=spec.imposed_rates)

    def proposer(self, spec: PointSpec) -> Proposer:
        m = self.models
        if spec.method == "baseline":
            return BaselineProposer(m.device)
        if spec.method == "ngram":
            return NgramProposer(ngram_min=spec.ngram_min, ngram_max=spec.ngram_max, device=m.device)
        if spec.method == "medusa":
            return MedusaProposer(m.draft_model(spec).model, m.target.model, device=m.device, name=spec.draft)
        if spec.method in ("eagle3", "mtp"):
            target = self.static.get(id(m.target.model))  # compiled: the step keeps the head's aux states
            drafter = MtpProposer if spec.method == "mtp" else Eagle3Proposer
            return drafter(m.draft_model(spec).model, m.target.model, device=m.device, name=spec.draft, aux=target)
        vocab_size = m.target.model.get_output_embeddings().weight.shape[0]
        if spec.draft in m.vocabularies:  # another tokenizer: re-tokenised each step, so on a dynamic cache
            mode, mapping = m.vocabularies[spec.draft]
            draft = m.draft_model(spec)
            return CrossVocabularyProposer(draft.model, target_tokenizer=m.target.tokenizer,
                                           draft_tokenizer=draft.tokenizer, vocabulary=mapping, mode=mode,
                                           device=m.device, name=spec.draft)
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
        m = self.models
        graphs = captured_cuda_graphs(m.device) if m.device.type == "cuda" else None
        roles = [("target", m.target.model)] + [(f"draft {spec.name}", draft.model) for spec in m.profile.drafts
                                                if isinstance(draft := m.drafts.get(spec.name), LoadedModel)]
        models = {role: {"kv_cache": "static", "compile_s": sum(static.compile_s.values()),
                         "compile_s_by_step_tokens": {str(k): v for k, v in sorted(static.compile_s.items())},
                         "compile_mb": (sum(static.compile_mb.values()) if None not in static.compile_mb.values()
                                        else None),
                         "mode": _mode(static, graphs)}
                  for role, model in roles if (static := self.static.get(id(model))) is not None}
        return {**described, "compile": {"enabled": True, "fallback": self.fallback, "models": models,
                                          **({"cuda_graphs": {"captured": graphs[0], "skipped": graphs[1]}}
                                             if graphs is not None else {}),
                                          **({"freeze_refusal": self.freeze_refusal} if self.freeze_refusal else {})}}


def _mode(static: StaticModel, graphs: tuple[int | None, int] | None) -> str:
    """How a model's steps run: "cuda graphs" only where graphs were captured and none was skipped."""
    if not static.graphs:
        return _inductor_mode(static.frozen_buckets)
    captured, skipped = graphs
    if captured is None:
        return "inductor reduce-overhead (CUDA graphs asked for; this torch does not say whether they were captured)"
    if captured == 0 or skipped:
        return f"inductor reduce-overhead without CUDA graphs ({captured} captured, {skipped} skipped: see the log)"
    return "cuda graphs"


def _inductor_mode(frozen: list[int]) -> str:
    return f"inductor, frozen at {', '.join(map(str, frozen))} tokens" if frozen else "inductor"


BACKEND = InProcessBackend("native", NativeSession)

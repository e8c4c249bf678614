"""Drafts whose tokenizer is not the target's (another model family's small model).

The shared vocabulary is every token whose string is the same in both vocabularies (byte-level BPE families share
most of theirs). The draft reads the target's sequence re-tokenised with its own tokenizer (the text of the target's
ids, encoded again; its KV cache kept for the prefix that did not change), and proposes in one of two ways, chosen per
draft (`vocabulary` in the profile):

- "intersection": the token-level intersection of Timor et al. (ICML 2025, "TLI"): the draft's distribution
  restricted to the shared tokens and renormalised, q mapped onto the target's ids; speculative sampling with that q
  is exact for the target's distribution, at any temperature;
- "text": the draft decodes greedily in its own vocabulary, its text is encoded with the target's tokenizer, and the
  target's tokens are proposed as a deterministic guess (q a point mass, verified as an n-gram lookup's are): exact
  too, and it can propose tokens the vocabularies do not share, but its guess ignores the draft's uncertainty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specbench.decoding import kv
from specbench.decoding.proposers import Proposal
from specbench.decoding.sampling import Sampler

VOCABULARIES = ("intersection", "text")
MIN_SHARED = 0.1  # a draft sharing less than this share of the target's vocabulary is refused


@dataclass(frozen=True)
class VocabularyMap:
    """Which draft tokens the target has too."""

    draft_to_target: torch.Tensor  # [Vd] long: the target id of each draft token with the same string, -1 where none
    target_size: int  # the target's logits width V
    target_tokens: int  # tokens in the target's vocabulary (V counts padding rows too)

    @property
    def shared(self) -> int:
        return int((self.draft_to_target >= 0).sum())

    @property
    def shared_share(self) -> float:
        """The shared tokens as a share of the target's vocabulary."""
        return self.shared / self.target_tokens if self.target_tokens else 0.0

    def shared_target_ids(self) -> torch.Tensor:
        return self.draft_to_target[self.draft_to_target >= 0]


def vocabulary_map(target_tokenizer: Any, draft_tokenizer: Any, *, target_size: int, draft_size: int,
                   device: torch.device | str = "cpu") -> VocabularyMap:
    """The map of every draft token (below the draft's logits width) to the target token with the same string."""
    target = {token: i for token, i in target_tokenizer.get_vocab().items() if i < target_size}
    mapping = torch.full((draft_size,), -1, dtype=torch.long)
    for token, i in draft_tokenizer.get_vocab().items():
        if i < draft_size and token in target:
            mapping[i] = target[token]
    return VocabularyMap(mapping.to(device), target_size, len(target))


def same_vocabulary(target_tokenizer: Any, draft_tokenizer: Any) -> bool:
    """Whether every id both tokenizers have means the same token, with the same end of sequence (the draft's ids are
    then the target's: no mapping)."""
    target, draft = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    by_id = {i: token for token, i in target.items()}
    return (all(by_id.get(i, token) == token for token, i in draft.items())
            and draft_tokenizer.eos_token_id == target_tokenizer.eos_token_id)


class CrossVocabularyProposer:
    """A draft model with its own tokenizer drafts k tokens for the target (see the module's docstring)."""

    method = "draft"

    def __init__(self, model: torch.nn.Module | kv.CachedModel, *, target_tokenizer: Any, draft_tokenizer: Any,
                 vocabulary: VocabularyMap, mode: str, device: torch.device, name: str | None = None):
        if mode not in VOCABULARIES:
            raise ValueError(f"vocabulary must be one of {', '.join(VOCABULARIES)} (got {mode!r})")
        self.cached = kv.as_cached(model, name=name)
        self.target_tokenizer, self.draft_tokenizer = target_tokenizer, draft_tokenizer
        self.vocabulary, self.mode, self.device = vocabulary, mode, device
        self.name = name or kv.model_name(self.cached.model)
        self._shared = vocabulary.draft_to_target >= 0  # [Vd] bool
        self._draft_ids: list[int] = []  # what the draft's cache holds: the sequence in the draft's tokens

    def shared_target_ids(self) -> torch.Tensor:
        """The target ids the draft can propose from (intersection), for the decoder's shared-mass measure."""
        return self.vocabulary.shared_target_ids()

    def prefill(self, prompt_ids: list[int], *, max_length: int) -> None:
        draft_ids = self._encode(prompt_ids)
        # the draft's own tokens can outnumber the target's; room for k drafted tokens beyond the longest sequence
        self.cached.begin(2 * max_length + len(draft_ids) + 16, rolls_back=True)
        self.cached.prefill(torch.tensor([draft_ids], device=self.device))
        self._draft_ids = list(draft_ids)

    def propose(self, sequence: list[int], k: int, sampler: Sampler) -> Proposal:
        draft_ids = self._encode(sequence)
        keep = _common_prefix(self._draft_ids, draft_ids)
        keep = min(keep, len(draft_ids) - 1, self.cached.length)  # at least one token to feed
        self.cached.crop(keep)
        step_input = torch.tensor([draft_ids[keep:]], device=self.device)  # [1, T>=1]
        self._draft_ids = list(draft_ids)
        drafted, probs = [], []
        for _ in range(k):
            logits = self.cached.forward(step_input, last=1)[-1]  # [Vd]
            if self.mode == "text":
                token = logits.argmax(dim=-1)
            elif sampler.greedy:
                token = logits.masked_fill(~self._shared[: logits.shape[-1]], float("-inf")).argmax(dim=-1)
            else:
                q = restricted_probs(logits, self._shared[: logits.shape[-1]], sampler)  # [Vd]
                probs.append(q)
                token = sampler.sample(q)
            drafted.append(int(token))
            self._draft_ids.append(int(token))
            step_input = token.view(1, 1)
        if self.mode == "text":
            return Proposal(self._as_target_tokens(drafted, k), None)
        tokens = self.vocabulary.draft_to_target[torch.tensor(drafted, device=self.vocabulary.draft_to_target.device)]
        if not probs:
            return Proposal(tokens.to(self.device), None)
        return Proposal(tokens.to(self.device), self._on_target(torch.stack(probs)))

    def rollback(self, length: int) -> None:
        """Nothing to do: the next `propose` re-tokenises the sequence and keeps the cache for what did not change."""

    def _encode(self, target_ids: list[int]) -> list[int]:
        text = self.target_tokenizer.decode(target_ids)
        ids = self.draft_tokenizer.encode(text, add_special_tokens=False)
        return ids or [self.draft_tokenizer.eos_token_id or 0]

    def _on_target(self, q: torch.Tensor) -> torch.Tensor:
        """[k, Vd] draft probabilities on the shared tokens -> [k, V] on the target's ids."""
        out = q.new_zeros((q.shape[0], self.vocabulary.target_size))
        shared = self._shared[: q.shape[-1]]
        out[:, self.vocabulary.draft_to_target[: q.shape[-1]][shared]] = q[:, shared]
        return out

    def _as_target_tokens(self, drafted: list[int], k: int) -> torch.Tensor:
        text = self.draft_tokenizer.decode(drafted)
        ids = self.target_tokenizer.encode(text, add_special_tokens=False)[:k]
        return torch.tensor([i for i in ids if i < self.vocabulary.target_size], dtype=torch.long, device=self.device)


def restricted_probs(logits: torch.Tensor, shared: torch.Tensor, sampler: Sampler) -> torch.Tensor:
    """The draft's distribution on the shared tokens only: [Vd] logits, [Vd] bool -> [Vd], renormalised (no mass
    left on tokens the target cannot be offered), then shaped by the sampler's temperature and top_p."""
    return sampler.probs(logits.masked_fill(~shared, float("-inf")))


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n

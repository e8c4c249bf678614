"""Draft models with another tokenizer than the target's, found before any engine starts. A draft whose ids mean
other tokens than the target's drafts through the engine's token-level intersection where it has one (vLLM:
use_heterogeneous_vocab), whether or not the profile says `vocabulary`, as the in-process backends do; refused in
one line naming the draft where the engine has none (llama.cpp, SGLang) or where the two share under MIN_SHARED of
the target's tokens. What is shared is recorded with each of the draft's points."""

from __future__ import annotations

from typing import Any, Callable

from specbench.decoding.vocab import MIN_SHARED, same_vocabulary
from specbench.models.load import load_tokenizer
from specbench.profile import Profile, ProfileError


def draft_vocabularies(profile: Profile, engine: Any, target_tokenizer: Any, *, where: str,
                       say: Callable[[str], None]) -> dict[str, tuple[str, int]]:
    """Per draft of another tokenizer: (how it drafts, the tokens it shares with the target)."""
    found: dict[str, tuple[str, int]] = {}
    for index, draft in enumerate(profile.drafts):
        if draft.method != "draft" or not draft.model or draft.url is not None:
            continue
        tokenizer, _ = load_tokenizer(draft.model)
        if same_vocabulary(target_tokenizer, tokenizer):
            continue
        target_tokens = target_tokenizer.get_vocab()
        shared = len(target_tokens.keys() & tokenizer.get_vocab().keys())
        overlap = (f"{draft.model} shares {shared} of the target's {len(target_tokens)} tokens "
                   f"({shared / len(target_tokens):.1%})")
        if shared < MIN_SHARED * len(target_tokens):
            raise ProfileError(f"{where}drafts[{index}].model: {overlap}, under the {MIN_SHARED:.0%} a draft of another "
                               "tokenizer needs; pick a draft whose tokenizer is closer to the target's")
        mode = draft.vocabulary or "intersection"
        if mode not in getattr(engine, "vocabularies", ()):
            raise ProfileError(f"{where}drafts[{index}].model: its tokenizer is not the target's ({overlap}) and "
                               f"{engine.name} drafts only with the target's; use engine = \"vllm\" "
                               "(use_heterogeneous_vocab), backend = \"native\", or a draft of the target's family")
        say(f"draft {draft.name}: another tokenizer than the target's; {overlap}, drafting by {mode}")
        found[draft.name] = (mode, shared)
    return found

"""What an EAGLE-3 head is distilled from and how it is trained (`HeadSettings`, the `QUICK` preset), and what
came out (`HeadReport`): plain data, importable without torch (the CLI's defaults and the terminal report)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specbench.models.errors import HeadError


@dataclass(frozen=True)
class HeadSettings:
    """What the head is distilled from and how it is trained (all of it keys the cache)."""

    workload: str = "builtin:sharegpt"  # the prompts the target continues
    max_prompts: int = 128
    max_prompt_tokens: int = 256  # longer prompts are skipped (their states cost the most to capture)
    max_new_tokens: int = 64
    held_out: float = 0.15  # share of the prompts kept out of training, for the agreement figures
    draft_vocab_size: int = 8192  # the head's own lm_head over the most chosen ids; 0: the target's lm_head
    ttt_steps: int = 3
    epochs: int = 12
    batch_tokens: int = 2048
    learning_rate: float = 1e-3
    seed: int = 0
    norm_before_residual: bool = False
    generate_batch: int = 16  # prompts per batch of greedy generation

    def check(self) -> None:
        """ValueError with one line naming the setting."""
        for name in ("max_prompts", "max_prompt_tokens", "max_new_tokens", "ttt_steps", "epochs", "batch_tokens", "generate_batch"):
            if getattr(self, name) < 1:
                raise HeadError(f"--{_flag(name)}: must be an integer >= 1 (got {getattr(self, name)})")
        if not 0 < self.held_out < 1:
            raise HeadError(f"--held-out: must be a share in (0, 1) (got {self.held_out})")
        if self.draft_vocab_size < 0:
            raise HeadError(f"--draft-vocab-size: must be >= 0, 0 for the target's whole vocabulary "
                            f"(got {self.draft_vocab_size})")
        if not self.learning_rate > 0:
            raise HeadError(f"--learning-rate: must be > 0 (got {self.learning_rate})")


def _flag(name: str) -> str:
    return name.replace("_", "-")


QUICK = HeadSettings(max_prompts=48, max_prompt_tokens=128, max_new_tokens=48, epochs=20, draft_vocab_size=2048,
                     batch_tokens=1024)  # CI: a few minutes on a 2-core CPU


@dataclass(frozen=True)
class HeadReport:
    """A trained head and the figures that say how well it drafts."""

    folder: str
    target: str
    target_identity: str
    settings: dict[str, Any]
    device: str
    agreement: tuple[float, ...]  # held-out top-1 agreement at draft positions 1..ttt_steps
    agreement_untrained: tuple[float, ...]  # the same for the initial head
    train_agreement: tuple[float, ...]
    draft_vocab_coverage: float  # share of the held-out choices inside the draft vocabulary
    losses: tuple[float, float]  # the first and the last optimizer step's loss
    examples: dict[str, int]  # prompts and tokens, train and held out
    seconds: dict[str, float]  # generate, capture, train, total
    cached: bool = field(default=False, compare=False)

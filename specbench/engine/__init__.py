"""The speculative decoding engine: native (instrumented) and the Hugging Face reference."""

from specbench.engine.decode import StepState, generate
from specbench.engine.proposers import BaselineProposer, DraftModelProposer, NgramProposer, Proposal, Proposer
from specbench.engine.sampling import Sampler, logits_to_probs
from specbench.engine.trace import StepRecord, Trace, first_divergence

__all__ = [
    "BaselineProposer", "DraftModelProposer", "NgramProposer", "Proposal", "Proposer", "Sampler",
    "StepRecord", "StepState", "Trace", "first_divergence", "generate", "logits_to_probs",
]

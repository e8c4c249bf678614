"""Speculative decoding in this process: the native (instrumented) decoder and the Hugging Face reference.

"Engine" in specbench means an external serving engine (vLLM, SGLang, llama.cpp: specbench.engines); this
package is the decoding the in-process backends (native, hf) run."""

from specbench.decoding.decode import StepState, generate
from specbench.decoding.eagle3 import Eagle3Proposer
from specbench.decoding.proposers import BaselineProposer, DraftModelProposer, NgramProposer, Proposal, Proposer
from specbench.decoding.sampling import Sampler, logits_to_probs
from specbench.decoding.trace import StepRecord, Trace, first_divergence

__all__ = [
    "BaselineProposer", "DraftModelProposer", "Eagle3Proposer", "NgramProposer", "Proposal", "Proposer", "Sampler",
    "StepRecord", "StepState", "Trace", "first_divergence", "generate", "logits_to_probs",
]

"""EAGLE-3 draft heads distilled here: the target's own greedy continuations and auxiliary states as data, a
one-layer head trained with the target frozen, saved in vLLM's format and cached.

Modules: ``data`` (continuations, target states, the draft vocabulary), ``train`` (training-time test, the
optimizer loop, agreement), ``distill`` (the whole recipe and its cache), ``render`` and ``cli``
(`specbench heads train`). The head itself and its format live in ``specbench.models.eagle3``; drafting with it
in ``specbench.decoding.eagle3``.
"""

from specbench.heads.distill import QUICK, HeadReport, HeadSettings, head_key, heads_dir, read_report, train_head

__all__ = ["QUICK", "HeadReport", "HeadSettings", "head_key", "heads_dir", "read_report", "train_head"]

"""EAGLE-3 draft heads distilled here: the target's own greedy continuations and auxiliary states as data, a
one-layer head trained with the target frozen, saved in vLLM's format and cached.

Modules: ``settings`` (what a head is trained from and what came out: plain data), ``data`` (continuations, target
states, the draft vocabulary), ``train`` (training-time test, the optimizer loop, agreement), ``distill`` (the whole
recipe and its cache), ``reference`` (a profile's trained:PRESET resolved to a head). `specbench heads train` is
specbench.cli.heads, its terminal output specbench.ui.heads; the head itself and its format live in
specbench.models.eagle3, drafting with it in specbench.decoding.eagle3.
"""

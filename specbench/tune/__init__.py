"""`specbench tune`: search drafts x gamma (x n-gram length) per temperature with Optuna, warm-started by
the analytic model, and recommend the configuration to deploy.

Modules: ``objectives`` (what is optimised, the constraints), ``space`` (the search space), ``plan`` (settings,
studies, the tune's run), ``runner`` (the trial loop), ``evaluate`` and ``measure`` (a trial's point and its
value), ``propose`` and ``warmstart`` (the configurations tried first), ``load`` (several load levels, the load
mix, gamma schedules), ``capacity`` (--objective capacity), ``recommend`` and ``outputs`` (the recommendation, its
profile and engine flags), ``verify`` (launching the recommendation to measure it).
"""

"""`specbench tune`: search drafts x gamma (x n-gram length) per temperature with Optuna, warm-started by
the analytic model, and recommend the configuration to deploy.
"""

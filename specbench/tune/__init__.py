"""`specbench tune`: search drafts x gamma (x n-gram length) per temperature with Optuna, warm-started by
the analytic model, and recommend the configuration to deploy."""

from specbench.tune.plan import TuneResult, TuneSettings
from specbench.tune.runner import tune
from specbench.tune.space import OBJECTIVES, Constraints, TuneError, parse_objective

__all__ = ["OBJECTIVES", "Constraints", "TuneError", "TuneResult", "TuneSettings", "parse_objective", "tune"]

"""The `specbench` command line: one module per command, each a thin layer over the library (parse the options,
validate them, call one function, hand the result to specbench.ui). Each module imports at its top only what its
`--help` needs; the sweep, the tune and the heads (torch, Optuna) load when a command runs."""

from __future__ import annotations

import typer

from specbench.cli.datasets import datasets_app
from specbench.cli.heads import heads_app
from specbench.cli.merge import merge
from specbench.cli.models import models_app
from specbench.cli.report import report
from specbench.cli.run import run
from specbench.cli.tune import tune

app = typer.Typer(
    help="Benchmark speculative decoding: which draft, gamma and temperature to deploy, and what it buys.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
app.command()(run)
app.command()(tune)
app.command()(report)
app.command()(merge)
app.add_typer(models_app, name="models")
app.add_typer(datasets_app, name="datasets")
app.add_typer(heads_app, name="heads")


def main() -> None:
    app()

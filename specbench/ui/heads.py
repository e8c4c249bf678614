"""Progress bars while a head is distilled, and the report of a trained head (rich lives here only)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from specbench.heads.settings import HeadReport


class HeadProgress:
    """An `Observer` for `train_head`: one bar per phase (continuations, target states, training)."""

    def __init__(self, console: Console):
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[note]}"), console=console)
        self.task = None

    def __enter__(self) -> HeadProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def message(self, text: str) -> None:
        self.progress.console.print(f"[dim]{escape(text)}[/dim]", highlight=False)

    def phase(self, name: str, total: int) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=self.progress.tasks[-1].total)
        self.task = self.progress.add_task(name, total=total, note="")

    def advance(self, amount: int = 1, *, note: str = "") -> None:
        self.progress.update(self.task, advance=amount, note=note)


def print_head_report(console: Console, report: HeadReport) -> None:
    table = Table(title="top-1 agreement with the target (teacher-forced, generated tokens)")
    table.add_column("draft position", justify="right")
    table.add_column("held out", justify="right")
    table.add_column("held out, untrained", justify="right")
    table.add_column("train", justify="right")
    for position, values in enumerate(zip(report.agreement, report.agreement_untrained, report.train_agreement), 1):
        table.add_row(str(position), *(f"{value:.1%}" for value in values))
    console.print(table)
    examples, seconds = report.examples, report.seconds
    console.print(
        f"{'cached head' if report.cached else 'trained'}: {escape(report.folder)}\n"
        f"target {escape(report.target)} on {escape(str(report.settings['workload']))}: "
        f"{examples['train_prompts']} prompts ({examples['train_tokens']} tokens) trained, "
        f"{examples['held_out_prompts']} ({examples['held_out_tokens']}) held out; draft vocabulary covers "
        f"{report.draft_vocab_coverage:.1%} of the held-out choices\n"
        f"loss {report.losses[0]:.3f} -> {report.losses[1]:.3f}; on {report.device} in {seconds['total']:.0f} s "
        f"(continuations {seconds['generate']:.0f} s, target states {seconds['capture']:.0f} s, "
        f"training {seconds['train']:.0f} s)", highlight=False, soft_wrap=True)

"""Terminal output of `specbench tune`: progress lines (timestamped, with a heartbeat, in a log), the recommendation
panel, the trials table."""

from __future__ import annotations

from typing import Any

import pandas as pd
from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from specbench.tune.document import Recommendation
from specbench.capacity.document import CapacityEntry
from specbench.capacity.sentence import capacity_sentence
from specbench.ui.lines import PlainLines, duration, wants_lines
from specbench.ui.run import fmt


TRIAL_STATES = {"COMPLETE": "done", "PRUNED": "pruned"}  # any other state: failed
STATE_STYLES = {"done": "green", "pruned": "yellow", "failed": "red"}


def trial_line(study: str, row: dict[str, Any], *, styled: bool = False) -> str:
    """A finished trial: its state, and its objective or why it failed; `styled`: rich markup, the state coloured."""
    state = TRIAL_STATES.get(row["state"], "failed")
    detail = str(row["error"]) if row.get("error") else f"objective {fmt(row.get('value'), '.4g')}"
    if styled:
        state, detail = f"[{STATE_STYLES[state]}]{state}[/{STATE_STYLES[state]}]", escape(detail)
    reused = " (recorded)" if row.get("evaluated") is False else ""
    return f"{study} #{row['number']} {row['point_id']}: {state} {detail}{reused}"


class TuneProgress:
    """One line per finished trial (implements TuneObserver)."""

    def __init__(self, console: Console):
        self.console = console

    def __enter__(self) -> "TuneProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def message(self, text: str) -> None:
        self.console.print(f"[dim]{escape(text)}[/dim]")

    def trial_finished(self, study: str, row: dict[str, Any]) -> None:
        self.console.print(trial_line(study, row, styled=True), highlight=False)


class TuneLines(PlainLines):
    """`specbench tune` in a log: a timestamped line per message and finished trial, and a heartbeat while the tune
    has been quiet (a trial, a baseline or the verification running)."""

    def __init__(self, console: Console, **options: Any):
        super().__init__(console, **options)
        self._started = self.clock()
        self._trials = 0

    def trial_finished(self, study: str, row: dict[str, Any]) -> None:
        with self.lock:
            self._trials += 1
            self.say(trial_line(study, row))

    def beat_text(self) -> str:
        return f"tune: running, {self._trials} trials finished, elapsed {duration(self.clock() - self._started)}"


def tune_observer(console: Console) -> TuneProgress | TuneLines:
    """Coloured lines in a terminal; timestamped plain lines and a heartbeat in a log."""
    return TuneLines(console) if wants_lines(console) else TuneProgress(console)


def recommendation_panel(recommendation: Recommendation) -> Panel:
    lines = []
    for choice in recommendation.temperatures:
        head = f"[bold]temperature {choice['temperature']:g}, top_p {choice['top_p']:g}[/bold]: "
        if choice.get("load") is not None:
            lines += _load_lines(head, choice)
        elif not choice.get("speculate"):
            lines.append(head + f"no speculation — {escape(str(choice.get('reason', '')))}")
        else:
            ci = choice["speedup_ci"]
            lines.append(head + f"[bold green]{choice['point_id']}[/bold green]  speedup {fmt(choice['speedup'])}x "
                         f"(95% CI {fmt(ci[0])}-{fmt(ci[1])}{_prediction(choice)}), "
                         f"{fmt(choice['tokens_per_s'], '.1f')} tok/s, acceptance {fmt(choice['acceptance_rate'], '.0%')}, "
                         f"peak {fmt(choice['peak_memory_mb'], '.0f')} MB")
            settings = choice["engine_settings"]
            vllm = settings["vllm"].get("args", [])
            lines.append(f"  vLLM: {escape(' '.join(vllm[:1] + [repr(a) for a in vllm[1:]]))}")
            if "args" in settings["llama_cpp"]:
                lines.append(f"  llama.cpp: {escape(' '.join(settings['llama_cpp']['args']))}")
            for r in choice.get("pareto_front", []):
                lines.append(f"  front: {r['point_id']}  {fmt(r['tokens_per_s'], '.1f')} tok/s, "
                             f"{fmt(r['peak_memory_mb'], '.0f')} MB")
        if choice.get("capacity") is not None:
            lines.append("  " + escape(_capacity_text(choice["point_id"], choice["capacity"])))
        exhausted = " (every configuration evaluated)" if choice.get("space_exhausted") else ""
        lines.append(f"  {choice['evaluations']} evaluations, {choice['trials']} trials of "
                     f"{recommendation.space_size} configurations{exhausted}")
    title = f"recommendation ({recommendation.objective['name']})"
    return Panel(Group(*lines), title=title, title_align="left")


def _load_lines(head: str, choice: dict[str, Any]) -> list[str]:
    """A recommendation over several load levels: the single setting, per level the best configuration, the
    crossover, the gamma schedule and what the verification measured."""
    load = choice["load"]
    single = load.get("single")
    lines = [head + (f"[bold green]{escape(single['point_id'])}[/bold green] over the load mix"
                     + (f" (loses at {', '.join(single['loses_at'])})" if single["loses_at"] else "")
                     if single else f"no single setting — {escape(str(choice.get('reason', '')))}")]
    for level in load["levels"]:
        best = level["best"]
        what = "-" if best is None else (f"{best['point_id']} {fmt(best['speedup'])}x "
                                          f"[{fmt(best['speedup_ci'][0])}, {fmt(best['speedup_ci'][1])}]")
        lines.append(f"  {level['load']} (weight {level['weight']:.2f}): best {escape(what)}"
                     f"{'' if level['speculate'] else ' — the baseline wins'}")
    lines.append(f"  crossover: {escape(load['crossover']['note'])}")
    schedule = load.get("schedule")
    if schedule is not None:
        steps = ", ".join(f"{g['load']}: {g['gamma'] or 'off'}" for g in schedule["gammas"])
        lines.append(f"  gamma per concurrency ({escape(schedule['draft'])}): {steps}")
    vllm = choice["engine_settings"]["vllm"].get("args", [])
    if vllm:
        lines.append(f"  vLLM: {escape(' '.join(vllm[:1] + [repr(a) for a in vllm[1:]]))}")
    verification = load.get("verification")
    if verification is not None and verification["status"] != "measured":
        lines.append(f"  verification: {verification['status']} ({escape(str(verification['reason']))})")
    elif verification is not None:
        for level in verification["levels"]:
            parts = [f"{role} {fmt(level[role]['speedup'])}x" for role in ("single", "schedule") if level[role]]
            versus = level["schedule_vs_single"]
            if versus is not None and versus["ratio"] is not None:
                parts.append(f"schedule/single {fmt(versus['ratio'])}x [{fmt(versus['ci'][0])}, {fmt(versus['ci'][1])}]"
                             + (" [red]worse[/red]" if versus["worse"] else ""))
            lines.append(f"  verified at {level['load']}: {', '.join(parts)}")
        if verification.get("fallback"):
            lines.append(f"  [yellow]{escape(verification['fallback'])}[/yellow]")
        elif verification["schedule_no_worse"] is not None:
            lines.append("  the schedule is no worse than the single setting at any level" if
                         verification["schedule_no_worse"] else
                         "  [red]the schedule is worse than the single setting at some level (beyond its CI)[/red]")
    return lines


def trials_table(study: str, trials: pd.DataFrame) -> Table:
    """One study's trials that ran (duplicates and surplus trials ran nothing)."""
    table = Table(title=f"trials of {study}", title_justify="left")
    for column in ("#", "role", "point", "state", "objective", "speedup", "accept", "peak MB", "warm-start pred."):
        table.add_column(column, justify="left" if column in ("role", "point", "state") else "right",
                         no_wrap=column in ("role", "point", "state"))
    shown = trials[~trials["role"].isin(["duplicate", "surplus"])]
    for row in shown.to_dict("records"):
        table.add_row(str(row["number"]), _text(row["role"]), _text(row["point_id"]), _text(row["state"]).lower(),
                      fmt(row["value"], ".4g"), fmt(row["speedup"]), fmt(row["acceptance_rate"], ".0%"),
                      fmt(row["peak_memory_mb"], ".0f"), fmt(row["warm_start_prediction"]))
    return table


def print_tune_summary(console: Console, trials: pd.DataFrame, recommendation: Recommendation, out_dir: str) -> None:
    for study, group in trials.groupby("study", sort=False):
        console.print(trials_table(str(study), group))
    console.print(recommendation_panel(recommendation))
    console.print(f"results: {escape(str(out_dir))}  (trials.parquet, recommendation.json, recommendation.toml)")


def _prediction(choice: dict[str, Any]) -> str:
    """The warm start's prediction (timed verify costs, the drafted-token distribution) where there is one,
    else the point's own Leviathan prediction."""
    if choice.get("warm_start_prediction") is not None:
        return f", warm start predicted {fmt(choice['warm_start_prediction'])}x"
    if choice.get("predicted_speedup") is not None:
        return f", predicted {fmt(choice['predicted_speedup'])}x"
    return ""


def _capacity_text(name: str, capacity: dict[str, Any]) -> str:
    """--objective capacity: the chosen configuration's capacity and cost beside the baseline's, in the sentence
    `specbench run` and `specbench report` use."""
    common = {"temperature": 0.0, "top_p": 1.0, "axis": "request_rate"}  # the tune's capacities are request rates
    interval, gain = capacity.get("interval") or [None, None], capacity.get("gain_interval") or [None, None]
    chosen = CapacityEntry(
        configuration=name, method="chosen", status=capacity["status"], capacity=capacity["capacity_rps"],
        capacity_low=interval[0], capacity_high=interval[1],
        bracket_low=capacity["bracket"][0], bracket_high=capacity["bracket"][1],
        usd_per_mtok_at_capacity=capacity["usd_per_mtok_at_capacity"], gain_vs_baseline=capacity["gain_vs_baseline"],
        gain_low=gain[0], gain_high=gain[1], verdict=capacity.get("verdict"),
        replicas_for_traffic=capacity["replicas_for_traffic"], replicas_range=_pair(capacity.get("replicas_range")),
        **common)
    baseline_interval = capacity.get("baseline_interval") or [None, None]
    baseline = CapacityEntry(
        configuration="baseline", method="baseline", status=capacity["baseline_status"],
        capacity=capacity["baseline_capacity_rps"], capacity_low=baseline_interval[0],
        capacity_high=baseline_interval[1], bracket_low=capacity["baseline_bracket"][0],
        bracket_high=capacity["baseline_bracket"][1],
        usd_per_mtok_at_capacity=capacity["baseline_usd_per_mtok_at_capacity"],
        replicas_for_traffic=capacity["baseline_replicas_for_traffic"],
        replicas_range=_pair(capacity.get("baseline_replicas_range")), **common)
    return capacity_sentence(chosen, baseline, usd_per_hour=capacity.get("usd_per_hour"),
                             traffic_rps=capacity["traffic_rps"])


def _pair(value: Any) -> tuple[int, int] | None:
    return None if value is None else (int(value[0]), int(value[1]))


def _text(value: Any) -> str:
    return "-" if value is None or value is pd.NA else str(value)

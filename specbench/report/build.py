"""Assemble a report from result folders: read, filter, tabulate; compare when there are two runs."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from specbench.core.manifest import Manifest
from specbench.report import load_tables, predictions, tables
from specbench.report.capacity import CapacityReport, capacity_report
from specbench.report.folders import Run, Skipped, load_runs
from specbench.report.trials import StudyReport, study_reports
from specbench.report.workload import WorkloadReport, workload_report
from specbench.report.whatif import WhatIf, WhatIfError, synthetic_mask, whatif_report


@dataclass(frozen=True)
class RunReport:
    run: Run
    points: pd.DataFrame  # the run's points after --filter (all columns; plots read these)
    table: pd.DataFrame  # tables.TABLE_COLUMNS, sorted, --top per temperature
    categories: pd.DataFrame  # tables.category_speedups of the filtered points
    # tables.load_speedups of the configurations shown (empty for a run at one load level)
    speedups_by_load: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=tables.LOAD_COLUMNS))
    crossover: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=load_tables.CROSSOVER_COLUMNS))
    goodput: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=load_tables.GOODPUT_COLUMNS))
    studies: list[StudyReport] = field(default_factory=list)  # a tune's studies (empty for a plain sweep)
    workload: WorkloadReport | None = None  # what the run sent (None when the folder records nothing of it)
    capacity: CapacityReport | None = None  # the run's capacity.json (None when it has none)
    # predictions.across_gamma: each gamma's speedup as its draft's largest gamma predicts it, beside the measured
    across_gamma: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=predictions.COLUMNS))
    # the acceptance what-if: its synthetic points (kept out of `points`), break-even and predictions (None: none ran)
    whatif: WhatIf | None = None

    @property
    def failed(self) -> pd.DataFrame:
        return self.points[self.points["status"] == "failed"][["point_id", "error"]]

    @property
    def mismatched(self) -> list[dict]:
        """Rows of points whose greedy outputs differ from the baseline's."""
        return self.points[tables.status_labels(self.points) == "mismatch"].to_dict("records")

    @property
    def unstable(self) -> list[dict]:
        """Rows of points measured while the machine was not quiet (their speedups are not to be trusted)."""
        return self.points[tables.status_labels(self.points) == "unstable"].to_dict("records")

    @property
    def unstable_reasons(self) -> list[tuple[str, list[str]]]:
        """Each reason a point's timing is not trusted (a point's `unstable_reason` joins several with "; "),
        in order of first appearance, with the points it applies to."""
        reasons: dict[str, list[str]] = {}
        for row in self.unstable:
            for reason in str(row.get("unstable_reason") or "no reason recorded").split("; "):
                reasons.setdefault(reason, []).append(row["point_id"])
        return list(reasons.items())

    @property
    def launches(self) -> list[dict[str, str]]:
        """What a server backend launched: per launch, the point that launched it, the command line and its log."""
        launches = (self.run.manifest.server or {}).get("launches") or []
        return [{"point": str(launch.get("point")), "command": shlex.join(str(a) for a in launch.get("argv") or []),
                 "log": str(launch.get("log"))} for launch in launches]

    @property
    def summary(self) -> str:
        return run_summary(self.run)


@dataclass(frozen=True)
class Report:
    runs: list[RunReport]
    skipped: list[Skipped]
    comparison: pd.DataFrame | None  # tables.compare_runs of the first run (a) and the second (b)
    sort: str
    filters: list[tables.Filter]
    top: int | None = None

    def points_table(self) -> pd.DataFrame:
        """Every run's table rows, one frame (the csv output)."""
        frames = [r.table for r in self.runs if len(r.table)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=tables.TABLE_COLUMNS)


def build_report(paths: list[str | Path], *, filters: list[str] = (), sort: str = "speedup",
                 top: int | None = None, acceptance_from: str | Path | None = None) -> Report:
    """Raises ReportError for a bad --filter/--sort/--top, a missing path or no readable results, and for an
    `acceptance_from` folder that cannot predict (another target, no per-position acceptance); unreadable folders are
    listed in `skipped` instead."""
    parsed = [tables.Filter.parse(text) for text in filters]
    tables.check_sort_key(sort)
    if top is not None and top < 1:
        raise tables.ReportError(f"--top {top}: expected a positive number of points per temperature")
    runs, skipped = load_runs(list(paths))
    source = _acceptance_source(acceptance_from, runs)
    reports = []
    for run in runs:
        points = tables.apply_filters(run.points, parsed)
        imposed = synthetic_mask(points)  # what-if points: their own section, never among the measured ones
        try:
            whatif = whatif_report(points, run.requests, name=run.name, source=source) if imposed.any() else None
        except WhatIfError as error:
            raise tables.ReportError(f"--acceptance-from {error}") from None
        points = points[~imposed]
        table = tables.points_table(points, run=run.name, sort=sort, top=top)
        categories = tables.category_speedups(points, run.requests)
        speedups = _shown_configurations(tables.load_speedups(points), table)
        reports.append(RunReport(
            run=run, points=points, table=table,
            categories=categories[categories["point_id"].isin(set(table["point_id"]))],  # --top cuts them too
            speedups_by_load=speedups, crossover=load_tables.crossovers(speedups),
            goodput=load_tables.goodput(points),
            studies=study_reports(run.tune, parsed) if run.tune is not None else [],
            workload=workload_report(run.manifest, run.points, run.requests),
            capacity=capacity_report(run.capacity, parsed) if run.capacity is not None else None,
            across_gamma=predictions.across_gamma(points), whatif=whatif,
        ))
    comparison = None
    if len(reports) == 2:
        first, second = reports
        comparison = tables.compare_runs(first.points, second.points, name_a=first.run.name, name_b=second.run.name)
    return Report(runs=reports, skipped=skipped, comparison=comparison, sort=sort, filters=parsed, top=top)


def _acceptance_source(path: str | Path | None, runs: list[Run]):
    """(name, points, requests) of --acceptance-from's folder; None without one."""
    if path is None:
        return None
    if not any(synthetic_mask(run.points).any() for run in runs):
        raise tables.ReportError("--acceptance-from predicts on a surface measured with imposed acceptance: pass a "
                                 "result folder whose profile gives its drafts an `acceptance` list")
    found, skipped = load_runs([path])
    if len(found) != 1 or skipped:
        raise tables.ReportError(f"--acceptance-from {path}: expected one readable result folder"
                                 + (f" ({'; '.join(str(s) for s in skipped)})" if skipped else ""))
    return str(path), found[0].points, found[0].requests


def _shown_configurations(speedups: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """Every level of the configurations --top kept at some level and of the best at each level (decided
    before the cut, as in the point table), and the baselines."""
    kept = speedups["point_id"].isin(set(table["point_id"])) | speedups["best"]
    shown = set(speedups.loc[kept, "configuration"])
    return speedups[speedups["configuration"].isin(shown) | (speedups["method"] == "baseline")]


def run_summary(run: Run) -> str:
    """One line from the manifest: target, backend, device (or the serving engine, its version and launch
    settings), workload, when, status."""
    manifest = run.manifest
    profile = manifest.profile or {}
    environment = manifest.environment or {}
    target = (((manifest.models or {}).get("target") or {}).get("model")
              or (profile.get("target") or {}).get("model"))
    device = environment.get("device_name") or environment.get("device")
    parts = [
        f"target {target}" if target else None,
        f"backend {profile['backend']}" if profile.get("backend") else None,
        f"device {device}" if device else None,
        server_summary(manifest),
        f"workload {(profile.get('workload') or {}).get('prompts')}" if profile.get("workload") else None,
        f"started {manifest.started_at}" if manifest.started_at else None,
        f"status {manifest.status}" if manifest.status else None,
    ]
    return ", ".join(p for p in parts if p) or "no manifest.json"


def server_summary(manifest: Manifest) -> str | None:
    """`engine vllm 0.11.0 launched with --dtype float32 (env VLLM_CPU_KVCACHE_SPACE=2), 5 launches`, `engine
    vllm at http://host:8000 (attached)`; None for a run without a server."""
    server = manifest.server
    if not server:
        return None
    settings = (manifest.profile or {}).get("server") or {}
    engine = f"engine {server.get('engine') or settings.get('engine')}"
    if server.get("attached"):
        return f"{engine} at {server['attached']} (attached)"
    engine += f" {server['engine_version']}" if server.get("engine_version") else " (version not recorded)"
    if settings.get("extra_args"):
        engine += f" launched with {shlex.join(settings['extra_args'])}"
    if settings.get("env"):
        engine += " (env " + " ".join(f"{key}={value}" for key, value in settings["env"].items()) + ")"
    launches = len(server.get("launches") or [])
    return engine + f", {launches} launch{'' if launches == 1 else 'es'}"

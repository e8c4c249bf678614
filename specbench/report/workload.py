"""The workload a run sent: its requests and conversations, the dataset and its sampling, shared system-prompt
prefixes, ignore_eos, and the token lengths (mean, p50, p99) of the prompts sent, the output budgets and the outputs
generated.

The manifest's workload stats give the first (`specbench run` writes them; from an older manifest, only the
requests and the prompt lengths, computed from its prompt_tokens); the request rows of the baseline at the first
temperature give the generated lengths. Every statistic is workload_build.length_stats, the one the manifest holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from specbench.core.manifest import Manifest
from specbench.report.tables import fmt
from specbench.workloads.build import length_stats

LENGTH_COLUMNS = ("tokens", "mean", "p50", "p99")
PROMPT_ROW, BUDGET_ROW, OUTPUT_ROW = "prompt tokens (sent)", "max new tokens (budget)", "output tokens (generated)"


@dataclass(frozen=True)
class WorkloadReport:
    stats: dict[str, Any]  # the manifest's workload stats (from an older manifest: requests and prompt_tokens)
    lengths: pd.DataFrame  # LENGTH_COLUMNS: a row per length known, in PROMPT_ROW, BUDGET_ROW, OUTPUT_ROW order
    generated_by: str  # whose request rows gave OUTPUT_ROW: "the baseline at temperature 0"
    generated_requests: int  # how many (repeats included)


def workload_report(manifest: Manifest, points: pd.DataFrame, requests: pd.DataFrame) -> WorkloadReport | None:
    """The run's workload, from all its points (--filter does not change what was sent); None when the folder
    records none (no workload in the manifest and no request rows)."""
    workload = manifest.workload or {}
    if not workload and not len(requests):
        return None
    stats = workload.get("stats") or older_stats(workload)
    rows, generated_by = generated_rows(points, requests)
    generated = length_stats(rows["output_tokens"].dropna().astype(int).tolist())
    lengths = [(name, values) for name, values in ((PROMPT_ROW, stats.get("prompt_tokens")),
                                                   (BUDGET_ROW, stats.get("max_new_tokens")), (OUTPUT_ROW, generated))
               if values]
    frame = pd.DataFrame([(name, *(values.get(key) for key in LENGTH_COLUMNS[1:])) for name, values in lengths],
                         columns=LENGTH_COLUMNS).astype({key: "float64" for key in LENGTH_COLUMNS[1:]})
    return WorkloadReport(stats=stats, lengths=frame, generated_by=generated_by, generated_requests=len(rows))


def older_stats(workload: dict[str, Any]) -> dict[str, Any]:
    """What a manifest written before the workload stats tells: the requests and their prompt lengths (no
    budgets: every request had the profile's max_new_tokens)."""
    stats: dict[str, Any] = {}
    if workload.get("prompt_ids"):
        stats["requests"] = len(workload["prompt_ids"])
    if workload.get("prompt_tokens"):
        stats["prompt_tokens"] = length_stats(workload["prompt_tokens"])
    return stats


def generated_rows(points: pd.DataFrame, requests: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The request rows whose output lengths are shown, and whose they are: the baseline's at the lowest
    temperature (every top_p and load level, repeats included), or every row of a run without a baseline."""
    baselines = points[points["method"] == "baseline"]
    if not len(baselines):
        return requests, "every point (the run has no baseline)"
    temperature = baselines["temperature"].min()
    ids = set(baselines.loc[baselines["temperature"] == temperature, "point_id"])
    return requests[requests["point_id"].isin(ids)], f"the baseline at temperature {temperature:g}"


# --- what every text format shows -----------------------------------------------------------------


def workload_lines(report: WorkloadReport) -> list[str]:
    """The facts above the lengths table, one per line; only those the manifest records."""
    stats = report.stats
    lines = []
    requests, conversations = stats.get("requests"), stats.get("conversations")
    if requests is not None:
        lines.append(f"{requests} requests" + (f" from {conversations} conversations"
                                               if conversations is not None and conversations != requests else ""))
    if stats.get("dataset"):
        lines.append(dataset_line(stats))
    if stats.get("sampling"):
        lines.append(f"sampling: {stats['sampling']}")
    if stats.get("dataset_cut_at_byte") is not None:
        lines.append(f"the dataset file is cut off at byte {stats['dataset_cut_at_byte']}: only its complete entries "
                     "are used")
    if stats.get("shared_prefixes"):
        lines.append(f"shared prefixes: {stats['shared_prefixes']} system prompts of {stats['shared_prefix_tokens']} "
                     "tokens, one per conversation in turn")
    if stats.get("ignore_eos"):
        lines.append("ignore_eos: every request generates its whole budget")
    return lines


def dataset_line(stats: dict[str, Any]) -> str:
    """`dataset: NAME (FILE): 94145 entries, 90000 with two turns or more`; what is recorded of it."""
    line = f"dataset: {stats['dataset']}"
    if stats.get("dataset_file") and stats["dataset_file"] != stats["dataset"]:
        line += f" ({stats['dataset_file']})"
    if stats.get("dataset_entries") is not None:
        line += f": {stats['dataset_entries']} entries"
        if stats.get("dataset_conversations") is not None:
            line += f", {stats['dataset_conversations']} with two turns or more"
    return line


def display_lengths(report: WorkloadReport) -> pd.DataFrame:
    """LENGTH_COLUMNS as strings, one decimal ("-" for no values)."""
    rows = [(row["tokens"], *(fmt(row[key], ".1f") for key in LENGTH_COLUMNS[1:]))
            for row in report.lengths.to_dict("records")]
    return pd.DataFrame(rows, columns=LENGTH_COLUMNS)


def lengths_caption(report: WorkloadReport) -> str:
    return (f"Output tokens (generated): {report.generated_by}, {report.generated_requests} requests (repeats "
            "included).")


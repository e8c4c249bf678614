"""`specbench report` on a server run under load, as `profiles/vllm-cpu-load.toml` makes one (n-gram and a
self-draft at gamma 1 and 3; concurrency 1, 2 and 4; 0.3 and 1 requests/s; a few unstable points), read as a
reader reads it: speedup vs gamma per load level, closed and open loop never on one axis, one unstable-timing
banner, wide tables scrolling in their own box, and a header naming the engine instead of `device None`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specbench.report import Format, build_report, render
from specbench.report.load_plots import load_figure
from specbench.report.plots import gamma_figure
from test_report import RUN_A, markdown_tables, report_cli, write_run
from test_report_concurrency import BASE, NGRAM, at, ok
from test_report_load import lines_of, rate

LOADS = [("concurrency", 1), ("concurrency", 2), ("concurrency", 4), ("rate", 0.3), ("rate", 1.0)]
SPEEDUPS = {  # per draft and gamma, at each of LOADS
    ("ngram", 1): [1.10, 1.08, 1.05, 1.09, 1.06],
    ("ngram", 3): [1.22, 1.27, 1.12, 1.15, 1.16],
    ("close", 1): [0.95, 0.93, 0.90, 0.97, 0.92],
    ("close", 3): [0.80, 0.75, 0.70, 0.85, 0.60],
}
CPU = "other processes used 40% of the CPU"
TPOT = "baseline: TPOT p90/p10 3.1"
UNSTABLE_AT = {"ngram-g1-t0-p1-r1": TPOT, "ngram-g3-t0-p1-c4": CPU, "close-g1-t0-p1-r1": f"{CPU}; {TPOT}"}
EXTRA_ARGS = ["--dtype", "float32", "--max-model-len", "2048", "--max-num-seqs", "8"]
PYTHON = "/opt/engines/vllm/bin/python"


def at_load(point_id: str, axis: str, level: float, **values) -> dict:
    return at(point_id, level, **values) if axis == "concurrency" else rate(point_id, level, **values)


def under_load() -> list[dict]:
    rows = [at_load("baseline-t0-p1", axis, level, **BASE) for axis, level in LOADS]
    for (draft, gamma), speedups in SPEEDUPS.items():
        for (axis, level), speedup in zip(LOADS, speedups):
            row = at_load(f"{draft}-g{gamma}-t0-p1", axis, level, **ok(speedup, half=0.05, acceptance=0.6),
                          **(NGRAM if draft == "ngram" else {}))
            reason = UNSTABLE_AT.get(row["point_id"])
            rows.append({**row, "unstable": True, "unstable_reason": reason} if reason else row)
    return rows


def launch(number: int, point: str, *speculation: str) -> dict:
    argv = [PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", "HuggingFaceTB/SmolLM2-135M-Instruct",
            "--port", str(8000 + number), *speculation, *EXTRA_ARGS]
    return {"point": point, "argv": argv, "log": f"server-logs/0{number}-{point}.log"}


LAUNCHES = [launch(1, "baseline-t0-p1"),
            launch(2, "ngram-g1-t0-p1", "--speculative-config",
                   '{"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_max": 3}')]


def server_manifest(*, attached: str | None = None) -> dict:
    return {
        "profile": {"backend": "server", "workload": {"prompts": "builtin:mixed"},
                    "server": {"engine": "vllm", "binary": PYTHON, "url": attached, "command": None,
                               "extra_args": EXTRA_ARGS, "env": {"VLLM_CPU_KVCACHE_SPACE": "2"}}},
        "models": {"target": {"model": "builtin:smollm2-135m-instruct"}},
        "environment": {"specbench": "0.1.0", "python": "3.11.7", "cpu_count": 2},  # a server run: no device
        "server": {"engine": "vllm", "engine_version": None if attached else "0.11.0", "attached": attached,
                   "launches": [] if attached else LAUNCHES},
        "started_at": "2025-01-01T00:00:00", "status": "complete",
    }


def write_server_run(folder: Path, manifest: dict) -> Path:
    write_run(folder, under_load())
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


@pytest.fixture
def server_run(tmp_path: Path) -> Path:
    return write_server_run(tmp_path / "vllm-cpu-load", server_manifest())


# --- speedup vs gamma: a panel per load level -----------------------------------------------------

LEVEL_TITLES = ["temperature 0, concurrency 1", "temperature 0, concurrency 2", "temperature 0, concurrency 4",
                "temperature 0, 0.3 requests/s", "temperature 0, 1 requests/s"]


def test_speedup_vs_gamma_draws_a_line_per_draft_and_load_level_never_joining_levels(server_run):
    axes = gamma_figure(build_report([server_run]).runs[0].points).axes
    assert [ax.get_title() for ax in axes] == LEVEL_TITLES
    drawn = [lines_of(ax) for ax in axes]
    for index, lines in enumerate(drawn):  # one line per (draft, level): gamma 1 and 3, once each
        assert lines == {"ngram": ([1.0, 3.0], [SPEEDUPS["ngram", 1][index], SPEEDUPS["ngram", 3][index]]),
                         "close": ([1.0, 3.0], [SPEEDUPS["close", 1][index], SPEEDUPS["close", 3][index]]),
                         "baseline": ([0, 1], [1.0, 1.0])}
    colors = {(line.get_label(), line.get_color()) for ax in axes for line in ax.get_lines()}
    assert len(colors) == 3  # ngram, close and the baseline: each the same colour in every panel


def test_speedup_vs_gamma_says_it_is_per_load_level_and_a_run_at_one_level_has_a_panel_per_temperature(
        server_run, tmp_path):
    html = render(build_report([server_run]), Format.html)
    assert ("Speedup over the baseline per draft, a panel per load level (each point against the baseline at its "
            "own level)") in html
    (greedy, sampled) = gamma_figure(build_report([write_run(tmp_path / "a", RUN_A)]).runs[0].points).axes
    assert (greedy.get_title(), sampled.get_title()) == ("temperature 0", "temperature 0.8")
    assert lines_of(greedy) == {"close": ([2.0], [1.2]), "ngram": ([2.0], [1.5]), "baseline": ([0, 1], [1.0, 1.0])}


# --- speedup vs load: closed and open loop apart --------------------------------------------------


def test_speedup_vs_load_never_joins_a_concurrency_to_a_request_rate(server_run):
    closed, opened = load_figure(build_report([server_run]).runs[0].points).axes
    assert (closed.get_title(), opened.get_title()) == ("temperature 0, closed loop", "temperature 0, open loop")
    closed_lines, open_lines = lines_of(closed), lines_of(opened)
    assert closed_lines["ngram n=3 g=3"] == ([1, 2, 4], SPEEDUPS["ngram", 3][:3])
    assert open_lines["ngram n=3 g=3"] == ([0.3, 1.0], SPEEDUPS["ngram", 3][3:])
    assert open_lines["close g=3"] == ([0.3, 1.0], [0.85, 0.6])
    assert {x for label, (xs, _) in closed_lines.items() if label != "baseline" for x in xs} == {1, 2, 4}
    assert {x for label, (xs, _) in open_lines.items() if label != "baseline" for x in xs} == {0.3, 1.0}
    assert [t.get_text() for t in opened.get_xticklabels()] == ["0.3", "1"]


# --- one unstable-timing banner -------------------------------------------------------------------

BANNER = ("unstable timing at 3 of 25 points: their speedups cannot be trusted; repeat them on a quiet machine "
          "(--fresh), or stop the other load")
REASONS = [f"ngram-g1-t0-p1-r1, close-g1-t0-p1-r1: {TPOT}", f"ngram-g3-t0-p1-c4, close-g1-t0-p1-r1: {CPU}"]


def test_one_banner_lists_every_unstable_point_by_reason_in_every_format(server_run):
    report = build_report([server_run])
    assert report.runs[0].unstable_reasons == [(TPOT, ["ngram-g1-t0-p1-r1", "close-g1-t0-p1-r1"]),
                                               (CPU, ["ngram-g3-t0-p1-c4", "close-g1-t0-p1-r1"])]
    markdown = render(report, Format.md)
    assert markdown.count("unstable timing") == 1
    assert f"> **{BANNER}.**\n>\n> - {REASONS[0]}\n> - {REASONS[1]}\n" in markdown
    html = render(report, Format.html)
    assert html.count('class="warning') == 1 and html.count("unstable timing") == 1
    assert f'<div class="warning unstable">{BANNER}.<ul><li>{REASONS[0]}</li><li>{REASONS[1]}</li></ul></div>' in html
    run = json.loads(render(report, Format.json))["runs"][0]
    assert run["warnings"] == [BANNER]
    assert run["unstable"] == [{"reason": TPOT, "points": ["ngram-g1-t0-p1-r1", "close-g1-t0-p1-r1"]},
                               {"reason": CPU, "points": ["ngram-g3-t0-p1-c4", "close-g1-t0-p1-r1"]}]
    lines = [" ".join(line.split()) for line in report_cli(server_run).stdout.splitlines()]
    assert sum("unstable timing" in line for line in lines) == 1
    start = next(i for i, line in enumerate(lines) if line.startswith("unstable timing"))
    assert " ".join(lines[start:start + 4]).startswith(f"{BANNER}. {REASONS[0]} {REASONS[1]}")


def test_a_run_without_unstable_points_has_no_banner(tmp_path):
    quiet = [{**row, "unstable": False, "unstable_reason": None} for row in under_load()]
    report = build_report([write_run(tmp_path / "quiet", quiet)])
    assert report.runs[0].unstable_reasons == []
    assert "unstable timing" not in render(report, Format.md) and "unstable timing" not in render(report, Format.html)
    assert json.loads(render(report, Format.json))["runs"][0]["warnings"] == []


# --- wide tables ----------------------------------------------------------------------------------


def test_every_html_table_scrolls_sideways_in_its_own_box(server_run):
    html = render(build_report([server_run]), Format.html)
    assert ".table-scroll { overflow-x: auto; max-width: 100%;" in html
    assert html.count("<table>") == html.count('<div class="table-scroll"><table>') > 2
    assert html.count("</table>") == html.count("</table></div>")
    load_table = re.search(r"<h3>Speedup by load, temperature 0</h3>\s*<div class=\"table-scroll\"><table>", html)
    assert load_table is not None
    assert "<td>1.22× [1.17, 1.27]<br>accept 60%</td>" in html  # acceptance below the speedup: narrower columns
    header = markdown_tables(render(build_report([server_run]), Format.md))["Speedup by load, temperature 0"][0]
    assert header == ("| configuration | concurrency 1 | concurrency 2 | concurrency 4 | 0.3 requests/s "
                      "| 1 requests/s |")


# --- the header -----------------------------------------------------------------------------------

SUMMARY = ("target builtin:smollm2-135m-instruct, backend server, engine vllm 0.11.0 launched with --dtype float32 "
           "--max-model-len 2048 --max-num-seqs 8 (env VLLM_CPU_KVCACHE_SPACE=2), 2 launches, workload "
           "builtin:mixed, started 2025-01-01T00:00:00, status complete")
NGRAM_COMMAND = (f"{PYTHON} -m vllm.entrypoints.openai.api_server --model HuggingFaceTB/SmolLM2-135M-Instruct "
                 "--port 8002 --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 1, "
                 "\"prompt_lookup_max\": 3}' --dtype float32 --max-model-len 2048 --max-num-seqs 8")


def test_the_header_names_the_engine_its_version_and_launch_settings_not_device_none(server_run):
    report = build_report([server_run])
    assert report.runs[0].summary == SUMMARY
    markdown = render(report, Format.md)
    assert f"`{server_run}`: {SUMMARY}" in markdown and "device None" not in markdown
    assert (f"- `ngram-g1-t0-p1`: `{NGRAM_COMMAND}` (log `server-logs/02-ngram-g1-t0-p1.log`)") in markdown
    html = render(report, Format.html).replace("&#x27;", "'").replace("&quot;", '"')
    assert "device None" not in html
    assert ('<details class="launches"><summary>2 server launches: the command lines and logs</summary><ul><li>'
            "<code>baseline-t0-p1</code>: ") in html
    assert (f"<li><code>ngram-g1-t0-p1</code>: <code>{NGRAM_COMMAND}</code> (log "
            "<code>server-logs/02-ngram-g1-t0-p1.log</code>)</li></ul></details>") in html
    terminal = " ".join(report_cli(server_run).stdout.split())
    assert SUMMARY in terminal


def test_an_attached_server_is_named_by_its_url(tmp_path):
    run = write_server_run(tmp_path / "attached", server_manifest(attached="http://127.0.0.1:8000"))
    report = build_report([run])
    assert report.runs[0].summary == ("target builtin:smollm2-135m-instruct, backend server, engine vllm at "
                                      "http://127.0.0.1:8000 (attached), workload builtin:mixed, started "
                                      "2025-01-01T00:00:00, status complete")
    assert "server launches" not in render(report, Format.html) and "Server launches" not in render(report, Format.md)


def test_a_run_without_a_recorded_device_or_server_leaves_both_out(tmp_path):
    run = write_run(tmp_path / "old", RUN_A)
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "environment": {"python": "3.11.7"}}))
    assert build_report([run]).runs[0].summary == ("target tiny-target, backend native, workload prompts.jsonl, "
                                                   "started 2025-01-01T00:00:00, status failed points")

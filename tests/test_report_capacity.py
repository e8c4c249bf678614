"""`specbench report` on a run folder with capacity.json (a capacity search's configurations, brackets, probes
and costs): per temperature the headline per speculative configuration, the capacity table, the probes, the HTML
plot of SLO attainment and goodput against load; --filter; and a folder without capacity.json unchanged."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from specbench.capacity.document import document_from_dict
from specbench.report import Format, build_report, render
from specbench.report.capacity import capacity_report, groups
from specbench.report.load_plots import capacity_figure
from test_report import RUN_A, markdown_tables, report_cli, write_run

SLO = {"ttft_ms": 2000, "tpot_ms": 150}


def probe(load: float, point_id: str, n: int, met: int, ci: tuple[float, float], decision: str,
          goodput: float | None, tokens_per_s: float, *, reused: bool = False) -> dict:
    return {"load": load, "point_id": point_id, "n_requests": n, "met": met, "attainment": met / n, "ci_low": ci[0],
            "ci_high": ci[1], "decision": decision, "next": "-", "reused": reused, "duration_s": 30.0,
            "goodput": goodput, "tokens_per_s": tokens_per_s, "usd_per_mtok": None, "completed_per_s": load}


def configuration(name: str, temperature: float, *, capacity: float | None, bracket: tuple, attainment: tuple,
                  status: str = "found", gain: float | None = None, usd: float | None = None,
                  usd_change: float | None = None, replicas: int | None = None, probes: list[dict] = (),
                  axis: str = "request_rate", note: str | None = None, interval: tuple | None = None,
                  gain_interval: tuple = (None, None), verdict: str | None = None) -> dict:
    """An entry as `specbench run` writes it; the capacity's interval is the bracket unless given (a step between
    the two probes: the probes cannot place it closer)."""
    interval = interval if interval is not None else bracket if status == "found" else (None, None)
    draft, _, gamma = name.partition(" γ")
    return {"configuration": name, "method": "baseline" if name == "baseline" else "ngram" if draft == "ngram"
            else "draft", "draft": None if name == "baseline" else draft, "gamma": int(gamma) if gamma else None,
            "temperature": temperature, "top_p": 1.0, "axis": axis, "capacity": capacity, "bracket_low": bracket[0],
            "bracket_high": bracket[1], "attainment_low": attainment[0], "attainment_high": attainment[1],
            "status": status, "note": note, "gain_vs_baseline": gain, "usd_per_mtok_at_capacity": usd,
            "usd_per_mtok_change_vs_baseline": usd_change, "replicas_for_traffic": replicas, "probes": list(probes),
            "capacity_low": interval[0], "capacity_high": interval[1], "gain_low": gain_interval[0],
            "gain_high": gain_interval[1], "verdict": verdict}


BASELINE_PROBES = [
    probe(0.5, "baseline-t0-p1-r0.5", 40, 40, (0.91, 1.0), "pass", 0.5, 24.0),
    probe(1.0, "baseline-t0-p1-r1", 40, 39, (0.87, 1.0), "pass", 0.98, 44.0, reused=True),
    probe(2.0, "baseline-t0-p1-r2", 40, 20, (0.35, 0.65), "fail", 1.0, 50.0),
    probe(1.1, "baseline-t0-p1-r1.1", 40, 37, (0.8, 0.97), "undecided: add requests", 1.02, 47.0),
    probe(1.1, "baseline-t0-p1-r1.1", 80, 70, (0.8, 0.93), "fail", 0.96, 47.5),
]
NGRAM_PROBES = [
    probe(1.0, "ngram-g3-t0-p1-r1", 40, 40, (0.91, 1.0), "pass", 1.0, 58.0, reused=True),
    probe(2.0, "ngram-g3-t0-p1-r2", 40, 24, (0.45, 0.74), "fail", 1.2, 70.0),
    probe(1.3, "ngram-g3-t0-p1-r1.3", 40, 39, (0.87, 1.0), "pass", 1.27, 66.0),
    probe(1.4, "ngram-g3-t0-p1-r1.4", 40, 34, (0.71, 0.93), "fail", 1.19, 67.0),
]
DOCUMENT = {
    "version": 2, "target_attainment": 0.95, "confidence": 0.95, "slo": SLO, "resolution": 0.1, "resolution_unit": "relative",
    "usd_per_hour": 2.5, "traffic_rps": 5.0,
    "configurations": [
        configuration("baseline", 0.0, capacity=1.0, bracket=(1.0, 1.1),
                      attainment=([0.975, 0.87, 1.0], [0.875, 0.8, 0.93]), usd=0.52, replicas=5,
                      probes=BASELINE_PROBES),
        configuration("ngram γ3", 0.0, capacity=1.3, bracket=(1.3, 1.4),
                      attainment=([0.975, 0.87, 1.0], [0.85, 0.71, 0.93]), gain=0.30, usd=0.40, usd_change=-0.2308,
                      replicas=4, probes=NGRAM_PROBES, note="stopped at the probe limit", gain_interval=(0.17, 0.45),
                      verdict="higher"),
        configuration("self γ1", 0.0, capacity=None, bracket=(None, 0.5), attainment=(None, [0.6, 0.45, 0.73]),
                      status="not bracketed: misses the SLO at its lowest rate 0.5",
                      probes=[probe(0.5, "self-g1-t0-p1-r0.5", 40, 24, (0.45, 0.73), "fail", 0.3, 18.0)]),
        configuration("baseline", 0.8, capacity=0.9, bracket=(0.9, 1.0),
                      attainment=([0.95, 0.9, 0.99], [0.8, 0.7, 0.88]), usd=0.6, replicas=6),
        configuration("ngram γ3", 0.8, capacity=4.0, bracket=(4.0, None), attainment=([1.0, 0.91, 1.0], None),
                      status="not bracketed: meets it at the highest rate probed 4", usd=0.2),
    ],
}
HEADLINES_T0 = [  # the sentence `specbench run` and `specbench tune` print too (specbench.capacity.sentence)
    "ngram γ3 holds the SLO up to 1.3 requests/s [1.3, 1.4] against the baseline's 1.0 [1.0, 1.1]: +30 % [+17 %, "
    "+45 %], measurably higher, $0.52 → $0.40 per 1M output tokens (-23 %); 4 replicas for 5.0 requests/s against 5 "
    "(stopped at the probe limit)",
    "self γ1: no request-rate capacity found (not bracketed: misses the SLO at its lowest rate 0.5)",
]
HEADLINES_T08 = ["ngram γ3 holds the SLO up to at least 4.0 requests/s against the baseline's 0.9 [0.9, 1.0]: $0.60 → "
                 "$0.20 per 1M output tokens (not bracketed: meets it at the highest rate probed 4)"]
TABLE_T0 = [
    "| configuration | capacity [interval] | bracket | met at low end | met at high end | gain [interval] "
    "| $/1M tokens | cost change | replicas | status |",
    "|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    "| baseline | 1.0 requests/s [1.0, 1.1] | [1.0, 1.1] | 98% [87%, 100%] | 88% [80%, 93%] | - | $0.52 | - | 5 "
    "| found |",
    "| ngram γ3 | 1.3 requests/s [1.3, 1.4] | [1.3, 1.4] | 98% [87%, 100%] | 85% [71%, 93%] | +30 % [+17 %, +45 %], "
    "measurably higher | $0.40 | -23 % | 4 | found (stopped at the probe limit) |",
    "| self γ1 | below 0.5 requests/s | [-, 0.5] | - | 60% [45%, 73%] | - | - | - | - "
    "| not bracketed: misses the SLO at its lowest rate 0.5 |",
]
CAPTION = ("Capacity: the highest request rate at which at least 95% of requests meet the SLO (ttft_ms <= 2000, "
           "tpot_ms <= 150), where the attainment fitted to every request of every probe (non-increasing in load) "
           "crosses 95%; in brackets its 95% interval (a bootstrap over neighbouring requests within each probe, "
           "never narrower than the two loads the crossing lies between; - where it is open). Bracket: the highest "
           "load that passed and the lowest that failed, where the search stopped. Met at low / high end: the share "
           "of requests that met the SLO there, with the 95% confidence interval that decided the probe (the probes "
           "list every one); searched to within 10% of the load. Gain: capacity over the baseline's, with its "
           "interval; measurably higher or lower only where the whole interval lies above or below zero. $/1M "
           "tokens: the cost of 1M output tokens at capacity, at $2.5 per replica-hour; replicas: how many serve 5.0 "
           "requests/s at capacity (in parentheses, at the interval's ends).")


def as_written(found, written):
    """`found` cut to the keys `written` has (the typed document adds the keys a file left out, as None)."""
    if isinstance(written, dict):
        return {key: as_written(found[key], value) for key, value in written.items()}
    if isinstance(written, list) and len(found) == len(written):
        return [as_written(f, w) for f, w in zip(found, written)]
    return found


def write_capacity_run(folder: Path, document: dict = DOCUMENT) -> Path:
    write_run(folder, RUN_A)
    (folder / "capacity.json").write_text(json.dumps(document))
    return folder


@pytest.fixture
def capacity_run(tmp_path: Path) -> Path:
    return write_capacity_run(tmp_path / "capacity")


# --- the table and the headline -------------------------------------------------------------------


def test_markdown_has_a_capacity_table_per_temperature_with_exact_rows(capacity_run):
    markdown = render(build_report([capacity_run]), Format.md)
    found = markdown_tables(markdown)
    assert found["Capacity and cost, temperature 0"] == TABLE_T0
    assert found["Capacity and cost, temperature 0.8"][2:] == [
        "| baseline | 0.9 requests/s [0.9, 1.0] | [0.9, 1.0] | 95% [90%, 99%] | 80% [70%, 88%] | - | $0.60 | - | 6 "
        "| found |",
        "| ngram γ3 | at least 4.0 requests/s | [4.0, -] | 100% [91%, 100%] | - | - | $0.20 | - | - "
        "| not bracketed: meets it at the highest rate probed 4 |"]
    assert CAPTION in markdown


def test_the_headline_per_speculative_configuration_in_every_format(capacity_run):
    report = build_report([capacity_run])
    markdown = render(report, Format.md)
    section = markdown.split("### Capacity and cost, temperature 0\n\n", 1)[1]
    assert section.startswith("\n".join(f"- {line}" for line in HEADLINES_T0) + "\n\n" + TABLE_T0[0])
    assert "\n".join(f"- {line}" for line in HEADLINES_T08) in markdown
    html = render(report, Format.html)
    assert ('<h3>Capacity and cost, temperature 0</h3>\n<ul><li>'
            + "</li><li>".join(HEADLINES_T0) + "</li></ul>").replace("'", "&#x27;") in html
    document = json.loads(render(report, Format.json))["capacity"]
    assert [entry["run"] for entry in document] == ["capacity"]
    assert document[0]["headlines"] == HEADLINES_T0 + HEADLINES_T08
    written = json.loads(json.dumps(DOCUMENT["configurations"]))  # every key as written, every probe included
    assert as_written(document[0]["configurations"], written) == written
    assert {key: document[0][key] for key in ("target_attainment", "slo", "usd_per_hour", "traffic_rps")} == {
        "target_attainment": 0.95, "slo": SLO, "usd_per_hour": 2.5, "traffic_rps": 5.0}
    lines = [" ".join(line.split()) for line in report_cli(capacity_run).stdout.splitlines()]
    terminal = " ".join(lines)
    assert all(line in terminal for line in HEADLINES_T0 + HEADLINES_T08)
    start = lines.index("Capacity and cost, temperature 0")  # the sentences, then every column, split not cut off
    assert lines[start + 1:start + 3] == HEADLINES_T0
    assert lines[start + 4] == "configuration capacity [interval] bracket met at low end met at high end"
    assert lines[start + 6] == "baseline 1.0 requests/s [1.0, 1.1] [1.0, 1.1] 98% [87%, 100%] 88% [80%, 93%]"
    assert lines[start + 10] == "Capacity and cost, temperature 0 (continued)"
    assert lines[start + 12] == "configuration gain [interval] $/1M tokens cost change replicas"
    assert lines[start + 15] == "ngram γ3 +30 % [+17 %, +45 %], measurably higher $0.40 -23 % 4"
    assert lines[start + 18] == "Capacity and cost, temperature 0 (continued)"
    assert lines[start + 20:start + 24] == ["configuration status", "─" * 67, "baseline found",
                                           "ngram γ3 found (stopped at the probe limit)"]
    assert "Capacity probes, temperature 0" in lines and "Capacity probes, temperature 0 (continued)" in lines


def test_without_a_price_or_traffic_the_cost_and_the_replicas_are_left_out(tmp_path):
    document = {**copy.deepcopy(DOCUMENT), "usd_per_hour": None, "traffic_rps": None}
    report = capacity_report(document_from_dict(document))
    markdown = render(build_report([write_capacity_run(tmp_path / "free", document)]), Format.md)
    table = markdown_tables(markdown)["Capacity and cost, temperature 0"]
    assert table[0] == ("| configuration | capacity [interval] | bracket | met at low end | met at high end "
                        "| gain [interval] | status |")
    assert table[3] == ("| ngram γ3 | 1.3 requests/s [1.3, 1.4] | [1.3, 1.4] | 98% [87%, 100%] | 85% [71%, 93%] "
                        "| +30 % [+17 %, +45 %], measurably higher | found (stopped at the probe limit) |")
    assert ("- ngram γ3 holds the SLO up to 1.3 requests/s [1.3, 1.4] against the baseline's 1.0 [1.0, 1.1]: +30 % "
            "[+17 %, +45 %], measurably higher (stopped at the probe limit)\n") in markdown
    section = markdown[markdown.index("### Capacity and cost"):markdown.index("### Workload")]
    assert report.usd_per_hour is None and "$" not in section and "replicas" not in section
    assert section.endswith("searched to within 10% of the load. Gain: capacity over the baseline's, with its "
                            "interval; measurably higher or lower only where the whole interval lies above or below "
                            "zero.\n\n" + section[section.index("### Capacity probes"):])


def test_a_search_over_concurrency_names_concurrency_levels(tmp_path):
    document = {**DOCUMENT, "usd_per_hour": None, "traffic_rps": None, "configurations": [
        configuration("baseline", 0.0, capacity=4, bracket=(4, 5), attainment=([1.0, 0.9, 1.0], [0.5, 0.35, 0.65]),
                      axis="concurrency", probes=[probe(4, "baseline-t0-p1-c4", 40, 40, (0.91, 1.0), "pass", 0.7,
                                                        30.0)]),
        configuration("ngram γ3", 0.0, capacity=6, bracket=(6, 7), attainment=([1.0, 0.9, 1.0], [0.7, 0.55, 0.82]),
                      axis="concurrency", gain=0.5)]}
    markdown = render(build_report([write_capacity_run(tmp_path / "closed", document)]), Format.md)
    assert "- ngram γ3 holds the SLO up to concurrency 6 [6, 7] against the baseline's 4 [4, 5]: +50 %\n" in markdown
    rows = markdown_tables(markdown)["Capacity and cost, temperature 0"]
    assert rows[2].startswith("| baseline | concurrency 4 [4, 5] |")
    assert "Capacity: the highest concurrency at which at least 95% of requests" in markdown
    assert markdown_tables(markdown)["Capacity probes, temperature 0"][2] == (
        "| baseline | concurrency 4 | baseline-t0-p1-c4 | 40 | 40 | 100% [91%, 100%] | pass | 0.70 req/s | 30.0 |")


def test_a_search_on_both_axes_has_a_section_per_axis_each_against_its_own_baseline(tmp_path):
    # as `specbench run` lists them: the request rate, then the closed loop; a baseline's gain is 0 against itself
    both = {**DOCUMENT, "traffic_rps": None, "configurations": [
        configuration("baseline", 0.0, capacity=1.3, bracket=(1.3, 1.41), attainment=([1.0, 0.81, 1.0], None),
                      gain=0.0, usd=16.33, usd_change=0.0),
        configuration("baseline", 0.0, capacity=3, bracket=(3, 4), attainment=([1.0, 0.81, 1.0], None),
                      gain=0.0, usd=7.81, usd_change=0.0, axis="concurrency"),
        configuration("ngram γ3", 0.0, capacity=1.68, bracket=(1.68, 1.83), attainment=([1.0, 0.81, 1.0], None),
                      gain=0.29, usd=12.93, usd_change=-0.21),
        configuration("ngram γ3", 0.0, capacity=5, bracket=(5, 6), attainment=([1.0, 0.81, 1.0], None),
                      gain=0.67, usd=5.21, usd_change=-0.33, axis="concurrency")]}
    markdown = render(build_report([write_capacity_run(tmp_path / "both", both)]), Format.md)
    found = markdown_tables(markdown)
    closed, opened = (found[f"Capacity and cost, temperature 0, by {axis}"]
                      for axis in ("concurrency", "request rate"))
    assert closed[2:] == [
        "| baseline | concurrency 3 [3, 4] | [3, 4] | 100% [81%, 100%] | - | - | $7.81 | - | found |",
        "| ngram γ3 | concurrency 5 [5, 6] | [5, 6] | 100% [81%, 100%] | - | +67 % | $5.21 | -33 % | found |"]
    assert opened[2] == ("| baseline | 1.3 requests/s [1.3, 1.41] | [1.3, 1.41] | 100% [81%, 100%] | - | - | $16.33 | - "
                         "| found |")
    assert markdown.index("by concurrency") < markdown.index("by request rate")
    assert ("- ngram γ3 holds the SLO up to concurrency 5 [5, 6] against the baseline's 3 [3, 4]: +67 %, $7.81 → "
            "$5.21 per 1M output tokens (-33 %)\n") in markdown
    assert ("- ngram γ3 holds the SLO up to 1.68 requests/s [1.68, 1.83] against the baseline's 1.3 [1.3, 1.41]: "
            "+29 %, $16.33 → $12.93 per 1M output tokens (-21 %)\n") in markdown
    assert "Capacity: the highest concurrency at which" in markdown
    assert "Capacity: the highest request rate at which" in markdown


def test_the_probes_behind_each_capacity_are_listed_in_the_order_they_ran(capacity_run):
    rows = markdown_tables(render(build_report([capacity_run]), Format.md))["Capacity probes, temperature 0"]
    assert rows[0] == "| configuration | load | point | requests | met | SLO met [CI] | decision | goodput | tok/s |"
    assert rows[2:8] == [
        "| baseline | 0.5 requests/s | baseline-t0-p1-r0.5 | 40 | 40 | 100% [91%, 100%] | pass | 0.50 req/s | 24.0 |",
        "| baseline | 1.0 requests/s | baseline-t0-p1-r1 (reused) | 40 | 39 | 98% [87%, 100%] | pass | 0.98 req/s "
        "| 44.0 |",
        "| baseline | 2.0 requests/s | baseline-t0-p1-r2 | 40 | 20 | 50% [35%, 65%] | fail | 1.00 req/s | 50.0 |",
        "| baseline | 1.1 requests/s | baseline-t0-p1-r1.1 | 40 | 37 | 92% [80%, 97%] | undecided: add requests "
        "| 1.02 req/s | 47.0 |",
        "| baseline | 1.1 requests/s | baseline-t0-p1-r1.1 | 80 | 70 | 88% [80%, 93%] | fail | 0.96 req/s | 47.5 |",
        "| ngram γ3 | 1.0 requests/s | ngram-g3-t0-p1-r1 (reused) | 40 | 40 | 100% [91%, 100%] | pass | 1.00 req/s "
        "| 58.0 |",
    ]
    assert len(rows) == 2 + len(BASELINE_PROBES) + len(NGRAM_PROBES) + 1


# --- the plot -------------------------------------------------------------------------------------


def test_the_plot_has_attainment_with_its_ci_and_goodput_per_configuration_the_target_and_each_capacity():
    report = capacity_report(document_from_dict(DOCUMENT))
    greedy, sampled = groups(report)
    attainment, goodput = capacity_figure(report, greedy).axes
    assert attainment.get_title() == goodput.get_title() == "temperature 0"
    bars = {container.get_label(): container for container in attainment.containers}
    assert list(bars) == ["baseline", "ngram γ3", "self γ1"]
    line, _, (ci,) = bars["baseline"]  # the last probe at a load decides it: 1.1 with 80 requests
    assert list(line.get_xdata()) == [0.5, 1.0, 1.1, 2.0]
    assert list(line.get_ydata()) == pytest.approx([1.0, 39 / 40, 70 / 80, 0.5])
    lows = [segment[0][1] for segment in ci.get_segments()]
    highs = [segment[1][1] for segment in ci.get_segments()]
    assert lows == pytest.approx([0.91, 0.87, 0.8, 0.35]) and highs == pytest.approx([1.0, 1.0, 0.93, 0.65])
    marks = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in attainment.get_lines()}
    assert marks["target 95%"][1] == [0.95, 0.95]
    assert marks["_capacity baseline"][0] == [1.0, 1.0] and marks["_capacity ngram γ3"][0] == [1.3, 1.3]
    assert "_capacity self γ1" not in marks  # no capacity found: no marker
    bands = {patch.get_label(): patch.get_x() for patch in attainment.patches}  # each capacity's interval, shaded
    assert set(bands) == {"_interval baseline", "_interval ngram γ3"} and bands["_interval ngram γ3"] == 1.3
    curves = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in goodput.get_lines()}
    assert curves["ngram γ3"] == ([1.0, 1.3, 1.4, 2.0], [1.0, 1.27, 1.19, 1.2])
    assert curves["_capacity ngram γ3"][0] == [1.3, 1.3]
    assert attainment.get_xlabel() == goodput.get_xlabel() == "request rate (requests/s)"
    assert capacity_figure(report, sampled) is None  # no probes recorded there


def test_html_has_the_section_its_plot_and_the_probes(capacity_run):
    html = render(build_report([capacity_run]), Format.html)
    assert "<h3>Capacity and cost, temperature 0</h3>" in html and "<h3>Capacity and cost, temperature 0.8</h3>" in html
    assert '<h3>SLO attainment and goodput, temperature 0</h3><figure><img src="data:image/png;base64,' in html
    assert "SLO attainment and goodput, temperature 0.8" not in html
    assert "<details><summary>Capacity probes, temperature 0</summary>" in html
    assert "<td>1.3 requests/s [1.3, 1.4]</td>" in html


# --- filters, bad files, and folders without capacity.json ---------------------------------------


def test_filters_on_a_configuration_key_keep_the_baseline(capacity_run):
    report = build_report([capacity_run], filters=["draft=self", "temperature=0"])
    capacity = report.runs[0].capacity
    assert list(capacity.configurations["configuration"]) == ["baseline", "self γ1", "baseline"]
    assert [entry.configuration for entry in capacity.entries] == ["baseline", "self γ1", "baseline"]
    assert set(capacity.probes["configuration"]) == {"baseline", "self γ1"}
    markdown = render(report, Format.md)
    assert "ngram γ3 holds" not in markdown and "- self γ1: no request-rate capacity found" in markdown
    assert len(build_report([capacity_run], filters=["concurrency=4"]).runs[0].capacity.configurations) == 5


@pytest.mark.parametrize(("text", "reason"), [
    ("{not json", "unreadable capacity.json: Expecting property name enclosed in double quotes: line 1 column 2 "
                  "(char 1)"),
    ('{"configurations": {}}', "capacity.json: `configurations` is not a list of objects"),
    ('{"configurations": [{"configuration": "baseline", "temperature": 0, "top_p": 1}]}',
     "capacity.json: configurations[0] lacks axis"),
])
def test_an_unusable_capacity_json_skips_the_folder_with_its_reason(tmp_path, text, reason):
    bad = write_run(tmp_path / "bad", RUN_A)
    (bad / "capacity.json").write_text(text)
    report = build_report([bad, write_run(tmp_path / "good", RUN_A)])
    assert [str(s) for s in report.skipped] == [f"skipped {bad}: {reason}"]


def test_a_folder_without_capacity_json_renders_as_before(tmp_path, capacity_run):
    plain = write_run(tmp_path / "plain" / "capacity", RUN_A)  # the same run name
    assert build_report([plain]).runs[0].capacity is None
    without = render(build_report([plain]), Format.md).replace(str(plain), "RUN")
    with_capacity = render(build_report([capacity_run]), Format.md).replace(str(capacity_run), "RUN")
    section = re.compile(r"### Capacity and cost, temperature 0\n.*?(?=Failed points:)", re.S)
    assert section.sub("", with_capacity) == without  # the capacity section is all that differs
    assert "Capacity" not in without
    assert "capacity" not in json.loads(render(build_report([plain]), Format.json))
    html = render(build_report([plain]), Format.html)
    assert "Capacity" not in html and "SLO attainment" not in html
    assert "Capacity" not in report_cli(plain).stdout


def test_a_repeated_search_shows_each_repeats_capacity_beside_the_pooled_one():
    from specbench.report.capacity import display_capacity

    document = copy.deepcopy(DOCUMENT)
    for entry, (first, second) in zip(document["configurations"], ((1.02, 0.98), (1.31, None))):
        entry["repeats"] = [{"repeat": 0, "status": "found", "capacity": first, "capacity_low": None,
                             "capacity_high": None},
                            {"repeat": 1, "status": "not bracketed", "capacity": second}]
    report = capacity_report(document_from_dict(document))
    group = groups(report)[0]
    assert list(display_capacity(report, group.configurations)["each repeat"])[:2] == ["1.02 · 0.98", "1.31 · -"]
    plain = capacity_report(document_from_dict(copy.deepcopy(DOCUMENT)))  # one search: no such column
    assert "each repeat" not in display_capacity(plain, groups(plain)[0].configurations)

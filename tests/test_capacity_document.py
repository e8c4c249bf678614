"""capacity.json as a typed document (specbench.capacity.document) and the one sentence every command says it with
(specbench.capacity.sentence)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from specbench.capacity.document import (CAPACITY_FILE, VERSION, CapacityDocument, CapacityEntry, CapacityFileError,
                                         CapacityProbe, compared, measurable, read_capacity, write_capacity)
from specbench.capacity.sentence import capacity_sentence

PROBE = CapacityProbe(load=1.0, n_requests=16, met=16, attainment=1.0, ci_low=0.81, ci_high=1.0, decision="pass",
                      point_id="baseline-t0-p1-r1", next="next 2 requests/s")


def entry(name: str, low: float | None, high: float | None, *, status: str = "found", usd: float | None = None,
          axis: str = "request_rate", interval: tuple[float | None, float | None] | None = None) -> CapacityEntry:
    """A search whose bracket is [low, high], its capacity at `low` with the interval [0.9, 1.1] x low unless
    given."""
    interval = interval or ((None, None) if low is None else (0.9 * low, 1.1 * low))
    return CapacityEntry(configuration=name, temperature=0.0, top_p=1.0, axis=axis,
                         method="baseline" if name == "baseline" else "ngram", status=status, capacity=low,
                         capacity_low=interval[0], capacity_high=interval[1], bracket_low=low, bracket_high=high,
                         usd_per_mtok_at_capacity=usd)


def document(*entries: CapacityEntry, traffic_rps: float | None = 5.0) -> CapacityDocument:
    return CapacityDocument(target_attainment=0.95, slo={"ttft_ms": 1000.0}, confidence=0.95, resolution=0.1,
                            resolution_unit="relative", usd_per_hour=2.0, traffic_rps=traffic_rps,
                            configurations=compared(list(entries), traffic_rps=traffic_rps))


def test_written_then_read_is_the_same_document_with_its_version(tmp_path):
    written = document(replace(entry("baseline", 1.0, 1.1, usd=0.5), probes=(PROBE,)), entry("ngram γ3", 1.3, 1.4))
    path = write_capacity(written, tmp_path)
    assert path == tmp_path / CAPACITY_FILE and json.loads(path.read_text())["version"] == VERSION
    assert read_capacity(path) == written
    assert [p.name for p in tmp_path.iterdir()] == [CAPACITY_FILE]  # nothing half-written beside it


def test_a_file_written_before_the_version_field_reads_as_version_1(tmp_path):
    data = document(entry("baseline", 1.0, 1.1)).to_dict()
    del data["version"]
    (tmp_path / CAPACITY_FILE).write_text(json.dumps(data))
    assert read_capacity(tmp_path / CAPACITY_FILE).version == 1


def test_a_version_1_file_reads_without_intervals():
    from specbench.capacity.document import document_from_dict

    old = {"version": 1, "target_attainment": 0.9, "slo": {"ttft_ms": 1000.0}, "configurations": [
        {"configuration": "ngram γ3", "method": "ngram", "temperature": 0.0, "top_p": 1.0, "axis": "request_rate",
         "status": "found", "capacity": 1.4, "bracket_low": 1.4, "bracket_high": 1.54, "gain_vs_baseline": 0.06,
         "gain_beyond_brackets": False}]}
    (read,) = document_from_dict(old).configurations
    assert (read.capacity, read.capacity_low, read.capacity_high, read.verdict) == (1.4, None, None, None)
    assert capacity_sentence(read, None, usd_per_hour=None, traffic_rps=None) == (
        "ngram γ3 holds the SLO up to 1.4 requests/s; there is no baseline to compare with")


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(version=VERSION + 1),
     f"capacity.json: version {VERSION + 1}: this specbench reads version {VERSION} (write it again with this "
     "version's `specbench run`)"),
    (lambda d: d["configurations"][0].pop("axis"), "capacity.json: configurations[0] lacks axis"),
    (lambda d: d.update(configurations={"baseline": 1}), "capacity.json: `configurations` is not a list of objects"),
    (lambda d: d["configurations"][0].update(probes=[1]),
     "capacity.json: configurations[0]: `probes` is not a list of objects"),
])
def test_an_unusable_file_is_one_line_naming_the_file_and_the_key(tmp_path, change, message):
    data = document(entry("baseline", 1.0, 1.1)).to_dict()
    change(data)
    (tmp_path / CAPACITY_FILE).write_text(json.dumps(data))
    with pytest.raises(CapacityFileError) as raised:
        read_capacity(tmp_path / CAPACITY_FILE)
    assert str(raised.value) == message


def test_one_rule_decides_whether_two_capacities_differ_measurably():
    baseline = entry("baseline", 1.0, 1.2, interval=(0.95, 1.05))
    # the gain's interval from both capacities' (+-5 % each: +-7 % in quadrature): only its sign decides
    assert measurable(entry("a", 1.2, 1.3, interval=(1.14, 1.26)), baseline)[3] == "higher"
    assert measurable(entry("a", 0.8, 1.0, interval=(0.76, 0.84)), baseline)[3] == "lower"
    gain, low, high, verdict = measurable(entry("a", 1.05, 1.3, interval=(1.0, 1.1)), baseline)
    assert verdict == "within" and low < 0 < high and gain == pytest.approx(0.05)
    # the same gain with a bracket above the baseline's: the brackets no longer decide, the intervals do
    assert measurable(entry("a", 1.05, 1.3, interval=(1.0, 1.1)), entry("baseline", 1.0, 1.04, interval=(0.95, 1.05)))[3] == "within"
    assert measurable(entry("a", None, 0.5, status="not bracketed"), baseline) is None
    assert measurable(entry("a", 1.2, 1.3, interval=(1.14, None)), baseline) is None  # open: no interval for the gain


def test_the_gain_cost_and_replicas_are_against_the_baseline_of_the_same_axis():
    found = document(entry("baseline", 1.0, 1.1, usd=0.5), entry("ngram γ3", 1.5, 1.6, usd=0.4),
                     entry("baseline", 4, 5, axis="concurrency"), entry("ngram γ3", 4, 5, axis="concurrency"))
    by = {(e.configuration, e.axis): e for e in found.configurations}
    rate, closed = by["ngram γ3", "request_rate"], by["ngram γ3", "concurrency"]
    assert (rate.gain_vs_baseline, rate.verdict, rate.replicas_for_traffic) == (pytest.approx(0.5), "higher", 4)
    assert rate.replicas_range == (4, 4)  # 5 requests/s at 1.35 and at 1.65 requests/s a replica
    assert rate.usd_per_mtok_change_vs_baseline == pytest.approx(-0.2)
    assert (closed.gain_vs_baseline, closed.verdict, closed.replicas_for_traffic) == (0.0, "within", None)
    assert by["baseline", "request_rate"].replicas_range == (5, 6) and by["baseline", "request_rate"].verdict is None
    assert found.baseline_of(closed) == by["baseline", "concurrency"]


def test_the_sentence_for_each_case():
    found = document(entry("baseline", 1.0, 1.1, usd=0.5), entry("ngram γ3", 1.5, 1.6, usd=0.4),
                     entry("draft γ2", 1.05, 1.2, usd=0.48),
                     entry("self γ1", None, 0.5, status="not bracketed: misses the SLO at its lowest rate 0.5"),
                     entry("eagle γ2", 4.0, None, status="not bracketed: meets it at the highest rate probed 4",
                           interval=(4.0, None)))
    said = [capacity_sentence(e, found.baseline_of(e), usd_per_hour=found.usd_per_hour, traffic_rps=found.traffic_rps)
            for e in found.configurations]
    assert said == [
        "baseline holds the SLO up to 1.0 requests/s [0.9, 1.1]: $0.50 per 1M output tokens at capacity; 5 (5-6) "
        "replicas for 5.0 requests/s",
        "ngram γ3 holds the SLO up to 1.5 requests/s [1.35, 1.65] against the baseline's 1.0 [0.9, 1.1]: +50 % "
        "[+30 %, +73 %], measurably higher, $0.50 → $0.40 per 1M output tokens (-20 %); 4 replicas for 5.0 "
        "requests/s against 5 (5-6)",
        "draft γ2 holds the SLO up to 1.05 requests/s [0.95, 1.16] against the baseline's 1.0 [0.9, 1.1]: +5 % "
        "[-9 %, +21 %], not measurably different, $0.50 → $0.48 per 1M output tokens (-4 %); 5 (5-6) replicas for "
        "5.0 requests/s against 5 (5-6)",
        "self γ1: no request-rate capacity found (not bracketed: misses the SLO at its lowest rate 0.5)",
        "eagle γ2 holds the SLO up to at least 4.0 requests/s against the baseline's 1.0 [0.9, 1.1] (not bracketed: "
        "meets it at the highest rate probed 4)",
    ]
    alone = capacity_sentence(found.configurations[1], None, usd_per_hour=None, traffic_rps=None)
    assert alone == "ngram γ3 holds the SLO up to 1.5 requests/s [1.35, 1.65]; there is no baseline to compare with"

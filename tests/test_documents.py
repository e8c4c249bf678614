"""manifest.json (specbench.core.manifest) and recommendation.json (specbench.tune.document) as typed, versioned
documents: what is written reads back equal, older files without a version read as version 1, and a file that
cannot be used is one line naming the file and the key."""

from __future__ import annotations

import json

import pytest

from specbench.core.manifest import MANIFEST_FILE, Manifest, ManifestError, read_manifest, write_manifest
from specbench.tune.document import (RECOMMENDATION_FILE, Recommendation, RecommendationError, read_recommendation,
                                     write_recommendation)

MANIFEST = Manifest(run_key="abc", profile={"name": "p"}, profile_toml='name = "p"\n', started_at="2026-12-04T01:00:00",
                    specbench_version="0.1.0", models={"target": {"model": "builtin:x"}}, status="running",
                    workload={"prompt_ids": ["a", "b"]}, environment={"device": "cpu"})
RECOMMENDATION = Recommendation(objective={"name": "tokens_per_s", "columns": ["tokens_per_s"],
                                           "directions": ["maximize"]},
                                temperatures=[{"study": "p-t0", "temperature": 0.0, "speculate": True}], space_size=4)


def test_a_manifest_reads_back_equal_and_leaves_out_what_a_run_did_not_record(tmp_path):
    write_manifest(MANIFEST, tmp_path / MANIFEST_FILE)
    data = json.loads((tmp_path / MANIFEST_FILE).read_text())
    assert data["version"] == 1 and data["finished_at"] is None
    assert not {"server", "compile", "verify_ms_by_tokens", "conditions", "capacity"} & set(data)
    assert read_manifest(tmp_path / MANIFEST_FILE) == MANIFEST


def test_a_recommendation_reads_back_equal(tmp_path):
    path = write_recommendation(RECOMMENDATION, tmp_path)
    assert path.name == RECOMMENDATION_FILE and "load_levels" not in json.loads(path.read_text())
    assert read_recommendation(path) == RECOMMENDATION


@pytest.mark.parametrize("read, error, data", [(read_manifest, ManifestError, MANIFEST.to_dict()),
                                                 (read_recommendation, RecommendationError, RECOMMENDATION.to_dict())])
def test_files_written_before_the_version_field_read_as_version_1(tmp_path, read, error, data):
    path = tmp_path / "doc.json"
    path.write_text(json.dumps({key: value for key, value in data.items() if key != "version"}))
    assert read(path).version == 1
    path.write_text(json.dumps({**data, "version": 2}))
    with pytest.raises(error, match=r"^doc\.json: version 2: this specbench reads version 1 \("):
        read(path)


@pytest.mark.parametrize("text, message", [
    ("[1]", "unreadable doc.json: not a JSON object"),
    ('{"temperatures": []}', "doc.json lacks objective"),
    ('{"objective": {}, "temperatures": {"a": 1}}', "doc.json: `temperatures` is not a list of objects"),
    ("{", "unreadable doc.json: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
])
def test_an_unusable_recommendation_is_one_line_naming_the_file_and_the_key(tmp_path, text, message):
    (tmp_path / "doc.json").write_text(text)
    with pytest.raises(RecommendationError) as raised:
        read_recommendation(tmp_path / "doc.json")
    assert str(raised.value) == message


def test_a_manifest_whose_sections_are_not_objects_is_refused(tmp_path):
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({**MANIFEST.to_dict(), "workload": [1]}))
    with pytest.raises(ManifestError, match=r"^manifest\.json: `workload` is not an object$"):
        read_manifest(tmp_path / MANIFEST_FILE)

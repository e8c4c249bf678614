"""results.typed_frame: the points table built column by column is the frame a frame-wide astype made — same
values, same dtypes — for missing cells, NaN in an integer column, a number in a string column, lists in an
untyped column, and no rows at all."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from specbench.core.results import POINT_COLUMNS, POINT_DTYPES, typed_frame

COLUMNS = ("point_id", "gamma", "speedup", "outputs_match_baseline", "accepted_per_position", "engine_accepted_per_position")
DTYPES = {"point_id": "string", "gamma": "Int64", "speedup": "float64", "outputs_match_baseline": "boolean"}
ROWS = [
    {"point_id": "ngram-g3-t0-p1", "gamma": 3, "speedup": 1.4, "outputs_match_baseline": True,
     "accepted_per_position": [5, 2, 1], "engine_accepted_per_position": None},
    {"point_id": 7, "gamma": math.nan, "speedup": None, "accepted_per_position": None,  # a number for a string
     "engine_accepted_per_position": None},
    {"point_id": "baseline-t0-p1", "gamma": None, "speedup": 1, "outputs_match_baseline": None},
]


@pytest.mark.parametrize("rows", [ROWS, ROWS[:1], []], ids=["mixed", "one", "none"])
def test_the_frame_equals_a_frame_wide_astype(rows):
    expected = pd.DataFrame(rows, columns=list(COLUMNS)).astype(DTYPES)
    pd.testing.assert_frame_equal(typed_frame(rows, COLUMNS, DTYPES), expected)


def test_the_points_schema_with_every_cell_missing_but_the_id():
    rows = [{"point_id": "baseline-t0-p1"}, {"point_id": "ngram-g3-t0-p1", "accepted_per_position": [1, 0]}]
    expected = pd.DataFrame(rows, columns=list(POINT_COLUMNS)).astype(POINT_DTYPES)
    pd.testing.assert_frame_equal(typed_frame(rows, POINT_COLUMNS, POINT_DTYPES), expected)

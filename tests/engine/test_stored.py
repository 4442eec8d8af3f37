"""Reading a stored stage result whatever shape it has (`engine.stored`)."""

from __future__ import annotations

import math

from engine.stored import as_list, as_mapping, numbers


def test_a_field_of_another_shape_reads_as_empty():
    assert as_mapping([1, 2]) == {} and as_mapping({"a": 1}) == {"a": 1}
    assert as_list("ab") == [] and as_list((1, 2)) == [1, 2]


def test_numbers_are_the_finite_ones_by_key():
    result = {"step_time_s": 0.0164, "tokens_per_s": "fast", "comm_fraction": math.nan, "n": 3}
    assert numbers(result, "step_time_s", "tokens_per_s", "comm_fraction", "n", "absent") == {
        "step_time_s": 0.0164,
        "tokens_per_s": None,
        "comm_fraction": None,
        "n": 3.0,
        "absent": None,
    }
    assert numbers(None, "step_time_s") == {"step_time_s": None}

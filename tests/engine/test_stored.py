"""Reading a stored stage result whatever shape it has (`engine.stored`)."""

from __future__ import annotations

import math

import pytest

from engine.stored import (
    StageFailure,
    as_list,
    as_mapping,
    as_mappings,
    mapping_or_none,
    mappings,
    numbers,
    over,
    reasons_by_name,
    string,
    strings,
    texts,
    within,
)


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


def test_words_read_as_text_only_where_a_reader_asks_for_text():
    assert string("bfloat16") == "bfloat16" and string(16) is None and string(None) is None
    assert strings(["memory leak: ...", 3, None, "drift"]) == ("memory leak: ...", "drift")
    assert texts(["Killed", 3]) == ["Killed", "3"] and texts("Killed") == []
    assert reasons_by_name({"int8": "no int8 matmul", "fp8": ["why"], 4: "x"}) == {
        "int8": "no int8 matmul",
        "4": "x",
    }
    assert reasons_by_name(["int8"]) == {}


def test_mappings_are_kept_left_out_or_read_as_empty_as_the_reader_says():
    stored = [{"tp": 2}, 7, None]
    assert mappings(stored) == [{"tp": 2}]
    assert as_mappings(stored) == [{"tp": 2}, {}, {}]
    assert mapping_or_none({"weights_source": "real"}) == {"weights_source": "real"}
    assert mapping_or_none("seeded") is None and mapping_or_none(None) is None


@pytest.mark.parametrize(
    ("value", "limit", "above", "kept"),
    [
        (2.0, 1.0, True, False),
        (1.0, 1.0, False, True),
        (None, 1.0, None, None),
        (2.0, None, None, None),
    ],
)
def test_a_figure_over_its_limit_is_judged_only_when_both_are_known(value, limit, above, kept):
    assert over(value, limit) is above
    assert within(value, limit) is kept


def test_a_stage_failure_reads_from_any_stages_result():
    serve = {
        "failure": {
            "phase": "launch",
            "reason": "OOM",
            "engine_lines": ["Killed"],
            "culprit": "release",
        }
    }
    failure = StageFailure.of(serve)
    assert failure == StageFailure("launch", "OOM", ["Killed"], "release")
    assert failure.release_blamed and not failure.infrastructure_blamed
    assert failure.to_dict() == serve["failure"]
    budget_cut = StageFailure.of({"failure": {"culprit": "infrastructure", "reason": "time"}})
    assert budget_cut == StageFailure("", "time", [], "infrastructure")
    assert budget_cut.infrastructure_blamed
    for nothing in (None, "failed", {"failure": None}, {"failure": {}}, {"failure": "died"}):
        assert StageFailure.of(nothing) is None

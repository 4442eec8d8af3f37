"""The plan's split notation read back ("TP8 PP1 EP1 DP1" -> Split), hand-written cases: what
each spelling means, and a one-line PlanInputError for each thing it refuses."""

from __future__ import annotations

import pytest

from engine.stages.plan.errors import PlanInputError
from engine.stages.plan.split_notation import check_split_for, parse_split
from engine.stages.plan.validity import Split


@pytest.mark.parametrize(
    ("text", "split"),
    [
        ("TP8 PP1 EP1 DP1", Split(tp=8, pp=1, dp=1, ep=1)),
        ("TP2 PP2 EP8 DP4", Split(tp=2, pp=2, dp=4, ep=8)),
        ("tp8", Split(tp=8, pp=1, dp=1, ep=1)),
        ("TP8 EP8", Split(tp=8, pp=1, dp=1, ep=8)),
        ("DP8 EP8", Split(tp=1, pp=1, dp=8, ep=8)),
        ("ep16 dp4 tp4", Split(tp=4, pp=1, dp=4, ep=16)),
        ("PP2 TP4", Split(tp=4, pp=2, dp=1, ep=1)),
        ("TP 4, PP=2", Split(tp=4, pp=2, dp=1, ep=1)),
        ("  Tp2 Dp3  ", Split(tp=2, pp=1, dp=3, ep=1)),
        ("DP1", Split(tp=1, pp=1, dp=1, ep=1)),
    ],
)
def test_the_notation_reads_back_with_left_out_degrees_at_1(text, split):
    assert parse_split(text) == split


def test_a_plans_own_label_reads_back_to_its_split():
    for split in (Split(8, 1, 1, 8), Split(4, 2, 2, 1), Split(1, 4, 16, 16)):
        assert parse_split(split.label()) == split


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "a split is degrees like"),
        ("   ", "a split is degrees like"),
        ("garbage", "cannot read 'garbage'"),
        ("TP8 XP2", "cannot read 'XP2'"),
        ("TP PP2", "cannot read 'TP'"),
        ("TP8x", "cannot read 'x'"),
        ("TP-2", "cannot read 'TP-2'"),
        ("TP2.5", "cannot read '.5'"),
        ("TP8 tp4", "TP is given twice"),
        ("TP0", "TP must be at least 1, got 0"),
        ("PP00", "PP must be at least 1, got 0"),
        ("TP131072", "TP131072 is implausibly large (a split of at most 65,536 devices)"),
        ("DP" + "9" * 5000, "implausibly large"),
        ("TP512 PP256", "uses 131,072 devices (TP x PP x DP), implausibly many"),
        ("EP8", "EP 8 is neither 1 nor TP x DP = 1"),
        ("TP8 EP4", "EP 4 is neither 1 nor TP x DP = 8"),
        ("TP2 DP4 EP2", "with these TP and DP give EP8 or EP1"),
    ],
)
def test_bad_notation_is_refused_with_one_line(text, words):
    with pytest.raises(PlanInputError) as err:
        parse_split(text)
    assert words in str(err.value)
    assert "\n" not in str(err.value)


def test_a_split_not_a_string_is_refused():
    with pytest.raises(PlanInputError, match="a split is degrees like"):
        parse_split(8)  # type: ignore[arg-type]


def test_the_pool_and_the_model_bound_a_given_split():
    check_split_for(Split(4, 2, 1, 1), devices=8, moe=False)
    check_split_for(Split(8, 1, 1, 8), devices=8, moe=True)
    with pytest.raises(PlanInputError, match=r"uses 16 devices .* the pool has 8"):
        check_split_for(Split(8, 2, 1, 1), devices=8, moe=True)
    with pytest.raises(PlanInputError, match="has EP 8, but the model is dense"):
        check_split_for(Split(8, 1, 1, 8), devices=8, moe=False)

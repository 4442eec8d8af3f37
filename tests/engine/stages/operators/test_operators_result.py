"""The operators stage's typed result (`engine/stages/operators/result.py`): what the stage
writes reads back unchanged, a stored row of any shape reads without raising, and the
judgements (missing operators, counts, coverage, a dtype's gap, host-only operators) are made
once, for the findings, the notes, the release page and the board."""

from __future__ import annotations

import json

import pytest

from engine.stages.operators.result import (
    MISSING_COUNT_KEYS,
    ManifestRef,
    OperatorCounts,
    OperatorRow,
    OperatorsResult,
)

MM = OperatorRow(
    "aten::mm.default",
    "covered",
    dtypes=("bfloat16",),
    feature="attention projections",
    via="kernel",
    devices=("cuda",),
    calls=12,
    modules=4,
)
GROUPED = OperatorRow(
    "aten::_grouped_mm.default",
    "missing",
    dtypes=("bfloat16",),
    feature="MoE experts (grouped GEMM)",
    via="no kernel at run time (CPU); ran on the CPU",
    devices=("npu",),
    calls=2,
    modules=1,
    missing_dtypes=("bfloat16",),
    ran_on_cpu=True,
)
TOPK = OperatorRow(
    "aten::topk.default",
    "missing",
    dtypes=("bfloat16", "float32"),
    feature="MoE routing",
    via="manifest",
    devices=("npu",),
    missing_dtypes=("bfloat16",),
)
ADD = OperatorRow("aten::add.Tensor", "fallback", dtypes=("bfloat16",), via="backend fallback")


def _result(*rows: OperatorRow, **fields) -> OperatorsResult:
    fields.setdefault("counts", OperatorCounts.of(rows))
    return OperatorsResult(operators=rows, **fields)


def test_what_the_stage_writes_reads_back_unchanged():
    written = json.loads(
        json.dumps(
            _result(
                GROUPED,
                ADD,
                MM,
                missing=("aten::_grouped_mm.default",),
                notes=("MoE experts (grouped GEMM) needs aten::_grouped_mm.default",),
                device="npu:0",
                backend="manifest",
                checked_against="manifest",
                dispatch_key="PrivateUse1",
                dtype="bfloat16",
                decode_steps=2,
                twin={"architecture": "DeepseekV3ForCausalLM", "sizes": []},
                manifest=ManifestRef("Example NPU", "vendor docs", 120),
            ).to_dict()
        )
    )

    result = OperatorsResult.from_stored(written)

    assert result.to_dict() == written
    assert written["counts"] == {"covered": 1, "missing": 1, "fallback": 1}
    assert result.rows == (GROUPED, ADD, MM)


def test_the_board_reads_the_missing_count_where_the_result_writes_it():
    written = _result(GROUPED, TOPK, MM).to_dict()

    value = written
    for key in MISSING_COUNT_KEYS:
        value = value[key]
    assert value == 2


def test_missing_operators_counts_and_coverage():
    result = _result(GROUPED, ADD, MM, TOPK)

    assert result.missing_operators == [GROUPED, TOPK]
    assert result.fallback_operators == [ADD]
    assert result.status_counts == OperatorCounts(covered=1, missing=2, fallback=1)
    assert result.coverage_passed is False
    # a fallback covers its operator
    assert _result(ADD, MM).coverage_passed is True
    # counts not stored (an older row): counted from the operator list
    assert OperatorsResult(operators=(GROUPED, MM)).status_counts.missing == 1
    # neither counts nor operators: not judged
    assert OperatorsResult().coverage_passed is None


def test_a_dtype_gap_is_a_kernel_or_a_manifest_lacking_some_dtypes_only():
    kernel_lacks = OperatorRow(
        "aten::addmm.default",
        "missing",
        dtypes=("float16",),
        via="kernel lacks float16; ran in float32 on the CPU",
        missing_dtypes=("float16",),
    )
    manifest_lacks_all = OperatorRow(
        "aten::topk.default",
        "missing",
        dtypes=("bfloat16",),
        via="manifest",
        missing_dtypes=("bfloat16",),
    )

    assert kernel_lacks.dtype_gap
    assert TOPK.dtype_gap  # the manifest lists it for float32
    assert not manifest_lacks_all.dtype_gap  # every dtype it ran in is lacking
    assert not GROUPED.dtype_gap  # no kernel at all


def test_an_operator_seen_on_the_host_only_matters_on_a_device_pool():
    host = OperatorRow("aten::arange.default", "missing", devices=("cpu",))

    assert OperatorsResult(device="npu:0").host_only_on_device(host)
    assert not OperatorsResult(device="cpu").host_only_on_device(host)
    assert not OperatorsResult(device="npu:0").host_only_on_device(GROUPED)
    assert host.dispatcher_name == "aten::arange"
    assert OperatorRow("aten::add.Tensor", "covered").dispatcher_name == "aten::add.Tensor"
    assert OperatorRow("", "missing").dispatcher_name == "?"


def test_checked_against_the_manifest_or_the_dispatcher():
    assert OperatorsResult(checked_against="manifest").against_manifest
    assert OperatorsResult(manifest=ManifestRef()).against_manifest
    assert not OperatorsResult(checked_against="torch dispatcher (CUDA)").against_manifest


@pytest.mark.parametrize(
    "row",
    [
        None,
        "operators",
        {},
        {"operators": "all", "counts": [1, 2], "manifest": "npu"},
        {"operators": [None, 3, {"name": None, "status": 1, "dtypes": "bf16"}]},
        {"counts": {"missing": "2", "covered": 1.5}, "twin": [], "decode_steps": "2"},
        {"notes": {"a": 1}, "device": None, "missing": None},
    ],
)
def test_a_stored_row_of_any_shape_reads_without_raising(row):
    result = OperatorsResult.from_stored(row)

    assert isinstance(result.rows, tuple) and isinstance(result.notes, tuple)
    assert result.twin is None or isinstance(result.twin, dict)
    assert isinstance(result.status_counts, OperatorCounts)
    assert result.missing_operators == [r for r in result.rows if r.status == "missing"]
    assert result.coverage_passed in (None, True, False)
    assert OperatorsResult.from_stored(result.to_dict()) == result


def test_wrong_types_inside_a_row_are_ignored():
    result = OperatorsResult.from_stored(
        {
            "operators": [None, {"name": "aten::mm.default", "status": "covered", "calls": "3"}],
            "counts": {"missing": "2", "covered": 4},
        }
    )

    assert result.rows == (OperatorRow("aten::mm.default", "covered"),)
    assert result.counts == OperatorCounts(covered=4, missing=0, fallback=0)

"""Stage results for tests, built from the stages' own result types and written with their
`to_dict`, so a fixture has the keys the stage writes and its readers read
(`engine/stages/precision/result.py`; the serve stage's parts are built in
`tests/serve_results.py`)."""

from __future__ import annotations

from typing import Any

from engine.stages.precision.result import DtypeComparison, PrecisionStageResult


def precision_result(*compared: DtypeComparison, **fields: Any) -> dict[str, Any]:
    """A stored precision result comparing `compared` (in that order), with the other
    `PrecisionStageResult` fields given."""
    return PrecisionStageResult(dtypes={c.dtype: c for c in compared}, **fields).to_dict()

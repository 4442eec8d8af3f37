"""Fit the planner's constants on the repository's published rows and store them
(`fits.FITS_JSON`): run `python -m engine.stages.plan.refit` after changing the rows, their
configs or the step-time model; tests/engine/stages/plan/test_plan_fits.py checks the stored
constants are what a fresh fit gives.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from .fits import (
    FITS_JSON,
    MIN_GROUP_ROWS,
    RESULTS_CSV,
    Fit,
    FitTable,
    Observation,
    _fit_to_json,
    data_digest,
    fit_efficiency,
)
from .published_rows import PublishedRow, load_rows, plannable


def fits_from_rows(rows: Sequence[PublishedRow]) -> FitTable:
    """Every fit `rows` support: per (accelerator, engine family) with at least
    `MIN_GROUP_ROWS` rows, per ("*", engine family) and ("*", "*"). Rows the planner
    refuses (`published_rows.plannable`) are left out."""
    groups: dict[tuple[str, str], list[Observation]] = {}
    for row, obs in plannable(rows)[0]:
        for key in ((row.accelerator, row.engine_family), ("*", row.engine_family), ("*", "*")):
            groups.setdefault(key, []).append(obs)
    source = f"published serving results ({RESULTS_CSV.parent.name}/{RESULTS_CSV.name})"
    fits = {}
    for (acc, engine), obs in groups.items():
        if acc != "*" and len(obs) < MIN_GROUP_ROWS:
            continue
        eff, residual = fit_efficiency(obs)
        scope = "accelerator+engine" if acc != "*" else ("engine" if engine != "*" else "all")
        fits[(acc, engine)] = Fit(acc, engine, eff, len(obs), residual, scope, source)
    return fits


def write_published_fits(path: Path = FITS_JSON) -> FitTable:
    """Fit the repository's published rows and store the constants in `path` with the
    digest of the data they were fitted on (`python -m engine.stages.plan.refit`)."""
    fits = fits_from_rows(load_rows())
    document = {
        "data_sha256": data_digest(),
        "written_by": "python -m engine.stages.plan.refit",
        "fits": [_fit_to_json(fit) for fit in fits.values()],
    }
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return fits


if __name__ == "__main__":
    for fit in write_published_fits().values():
        print(fit.label(), fit.efficiency)

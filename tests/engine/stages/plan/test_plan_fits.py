"""The planner's fitted constants (engine/stages/plan/fits.py) and the published rows they are
fitted on (plain pytest)."""

from __future__ import annotations

import json
import math

import pytest

from engine.stages.plan import fits
from engine.stages.plan.fits import (
    CPU_PRIOR,
    FITS_JSON,
    PRIOR,
    Observation,
    data_digest,
    fit_efficiency,
    fit_for,
    pool_fit,
)
from engine.stages.plan.published_rows import load_rows, plannable
from engine.stages.plan.refit import fits_from_rows
from engine.stages.plan.step_time import Efficiency

TRUE = Efficiency(bandwidth=0.7, flops=0.45, step_s=0.004, layer_s=5e-5, moe=0.6)


def synthetic(n: int) -> list[Observation]:
    """Figures of a made-up device with known constants: a step of B sequences takes
    step_s + 30 x layer_s + bytes / (BW x bw) + FLOPs / (F x flops), so tokens/s over
    batches 1 to 2^(n-1) pins every constant; the MoE share scales a third term."""
    obs = []
    for i in range(n):
        batch = 2**i

        def tokens_per_s(eff: Efficiency, b: int = batch) -> float:
            t = eff.step_s + 30 * eff.layer_s
            t += 16e9 / (3e12 * eff.bandwidth) + 2 * 8e9 * b / (1e15 * eff.flops)
            t += 2e9 * b / (1e15 * eff.moe * eff.flops) + 1e9 / (3e12 * eff.moe)
            return b / t

        obs.append(Observation(tokens_per_s, tokens_per_s(TRUE)))
    return obs


def test_the_fit_finds_the_constants_that_made_the_figures():
    eff, residual = fit_efficiency(synthetic(12))
    assert residual == pytest.approx(1.0, abs=0.01)
    # A step is a + c x batch here: the fit pins a and c (not how each splits into
    # constants), so it predicts a batch it has not seen.
    unseen = synthetic(14)[-1]
    assert unseen.predict(eff) == pytest.approx(unseen.measured, rel=0.03)
    assert unseen.predict(PRIOR) != pytest.approx(unseen.measured, rel=0.1)


def test_no_observation_leaves_the_prior():
    assert fit_efficiency([]) == (PRIOR, None)


def test_a_fit_of_few_points_stays_near_its_prior():
    # One point cannot tell four constants apart: the prior keeps the others in place.
    eff, _ = fit_efficiency(synthetic(1))
    for value, prior in zip(eff.as_tuple(), PRIOR.as_tuple(), strict=True):
        assert abs(math.log(value / prior)) < 2.5


def test_the_committed_fits_are_those_of_the_committed_rows():
    """fits.json must be rewritten (python -m engine.stages.plan.refit) whenever the rows,
    their configs or the model change: a fresh fit gives the same constants."""
    document = json.loads(FITS_JSON.read_text())
    assert document["data_sha256"] == data_digest()
    fresh = fits_from_rows(load_rows())
    stored = {(e["accelerator"], e["engine"]): e for e in document["fits"]}
    assert set(stored) == set(fresh)
    for key, fit in fresh.items():
        assert stored[key]["points"] == fit.points
        assert stored[key]["efficiency"] == pytest.approx(list(fit.efficiency.as_tuple()), rel=1e-3)


def test_every_published_row_is_read_and_most_are_planned():
    rows = load_rows()
    kept, refused = plannable(rows)
    assert len(rows) >= 60
    assert len(kept) + len(refused) == len(rows)
    # The planner refuses only splits whose weights do not fit its memory budget.
    assert all("does not fit" in reason for _, reason in refused)
    assert len(refused) <= 3


def test_fit_for_falls_back_from_accelerator_to_engine_to_all():
    table = fits.published_fits()
    assert fit_for("h100", "tensorrt-llm", table).scope == "accelerator+engine"
    a100 = fit_for("a100-80gb", "tensorrt-llm", table)
    assert (a100.accelerator, a100.engine, a100.scope) == ("*", "tensorrt-llm", "engine")
    unknown = fit_for("mi300x", "some-engine", table)
    assert (unknown.accelerator, unknown.engine, unknown.scope) == ("*", "*", "all")
    assert unknown.points == len(plannable(load_rows())[0])


def test_a_cpu_pool_starts_from_its_probe():
    fit = fit_for("cpu", "vllm")
    assert fit.efficiency == CPU_PRIOR and fit.scope == "prior"


def test_a_pool_fit_moves_to_its_own_measurements():
    fit = pool_fit("cpu", "cpu", "vllm", synthetic(10))
    assert fit.scope == "pool" and fit.points == 10
    assert fit.residual == pytest.approx(1.0, abs=0.05)
    assert "pool cpu" in fit.source
    before = fits.geometric_mean_error(
        math.log(o.predict(CPU_PRIOR) / o.measured) for o in synthetic(10)
    )
    assert before > 1.1 > 1.05 > fit.residual

"""Steps 3 to 5 of the serve stage on an answering engine, launched or attached: precision
against transformers float32, the load sweep with vLLM's own benchmark module, and the engine's
Prometheus metrics scraped during the sweep. What is measured goes into the result at once, so a
later failure keeps it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from engine.contract import StageContext, raise_if_cancelled
from engine.stages.plan.result import PlanResult

from .options import (
    DEFAULT_INPUT_TOKENS,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PRECISION_TOKENS,
)
from .result import PrecisionCheck
from .verdict import Measured, knee


def plan_concurrency(plan: Mapping[str, Any] | None) -> int:
    """The top of the load sweep: how many sequences the stored plan holds at its context
    (`PlanResult.max_sequences_at_context`), else (no plan, or one that says none) the
    sweep's default cap."""
    held = PlanResult.from_stored(plan).max_sequences_at_context
    return held if held is not None and held > 0 else DEFAULT_MAX_CONCURRENCY


def measure(
    ctx: StageContext,
    measured: Measured,
    *,
    base_url: str,
    model: str,
    reference_dir: str | None,
    tokenizer_dir: str | None,
    dtype: str,
    options: Mapping[str, Any],
    python: str,
    version: str,
    alive: Callable[[], bool],
    headers: Mapping[str, str] | None,
    api_key: str | None = None,
) -> None:
    """Measure precision (against `reference_dir`, the checkpoint folder the engine serves),
    then the sweep and metrics, into `measured.result`. Raises `StageFailed` (via
    `measured.fail`) when the engine stops answering; a request error is the infrastructure's
    (the engine died, or an endpoint refuses what the check needs), never the release's."""
    from .metrics import Scraper
    from .precision import EngineRequestError, limits_for, measure_precision
    from .sweep import SweepError, levels_for, load_generator_name, run_sweep

    result = measured.result
    raise_if_cancelled(ctx.cancelled)
    try:
        limits_for(dtype)
    except ValueError:
        result["precision"] = PrecisionCheck(dtype, None, "no_limits_for_dtype").to_dict()
    else:
        if reference_dir is None:
            result["precision"] = PrecisionCheck(dtype, None, "no_reference").to_dict()
        else:
            try:
                result["precision"] = measure_precision(
                    base_url=base_url,
                    model=model,
                    checkpoint_dir=reference_dir,
                    dtype=dtype,
                    max_tokens=int(options.get("precision_tokens") or DEFAULT_PRECISION_TOKENS),
                    headers=headers,
                    log=ctx.log,
                )
            except EngineRequestError as exc:
                gone = "" if alive() else "the engine died: "
                raise measured.fail("precision", f"{gone}{exc}", culprit="infrastructure") from exc
    raise_if_cancelled(ctx.cancelled)
    cap = int(options.get("max_concurrency") or DEFAULT_MAX_CONCURRENCY)
    levels = levels_for(plan_concurrency(ctx.previous.get("plan")), cap)
    input_tokens = int(options.get("input_tokens") or DEFAULT_INPUT_TOKENS)
    output_tokens = int(options.get("output_tokens") or DEFAULT_OUTPUT_TOKENS)
    result["sweep_settings"] = {
        "levels": levels,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "max_concurrency": cap,
        "requests_per_level": options.get("requests_per_level"),
        "load_generator": load_generator_name(python, version=version),
    }
    if tokenizer_dir is None:
        raise measured.fail(
            "sweep", "no tokenizer to generate the sweep's prompts with", culprit="infrastructure"
        )
    scraper = Scraper(base_url, headers=dict(headers or {}))
    scraper.start()
    started = time.monotonic()
    try:
        result["sweep"] = run_sweep(
            python=python,
            base_url=base_url,
            model=model,
            tokenizer_dir=tokenizer_dir,
            levels=levels,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            requests_per_level=options.get("requests_per_level"),
            timeout_s=max(60.0, (ctx.soft_time_limit_s or 1500) / 2),
            log=ctx.log,
            cancelled=ctx.cancelled,
            api_key=api_key,
        )
    except SweepError as exc:
        result["sweep"] = list(exc.points)
        if alive():
            raise measured.fail("sweep", str(exc), culprit="infrastructure") from exc
        raise measured.fail(
            "sweep", f"the engine died during the sweep: {exc}", culprit="infrastructure"
        ) from exc
    finally:
        result["metrics"] = scraper.stop()
    result["sweep_settings"]["duration_s"] = round(time.monotonic() - started, 3)
    result["knee"] = knee(result["sweep"])

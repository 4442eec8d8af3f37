"""The ordered list of stages every adaptation job runs (see docs/extending.md, "Adding a
stage").

Each entry names its `run` function by import path, so reading the registry (the web process
does, for titles and time limits) does not import torch or transformers; the worker imports a
stage's module when it runs it. Its known-limitation rules (`findings`, `unjudged_keys`: the
stage folder's `findings.py`) are named the same way; `findings_for_stage` dispatches to
them. The option checkers and time limits (each stage folder's `options.py`) are plain Python
for the same reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.contract import StageDefinition, resolve_callable
from engine.findings import Finding
from engine.stages.distributed.options import distributed_time_limits
from engine.stages.performance.options import performance_time_limits
from engine.stages.serve.options import SERVE_SOFT_TIME_LIMIT_S, SERVE_TIME_LIMIT_S
from engine.stages.stability.options import stability_time_limits

_STABILITY_DEFAULT_LIMITS_S = stability_time_limits({})
_DISTRIBUTED_DEFAULT_LIMITS_S = distributed_time_limits({})
_PERFORMANCE_DEFAULT_LIMITS_S = performance_time_limits({})

STAGES: tuple[StageDefinition, ...] = (
    StageDefinition(
        name="fetch",
        title="Fetch & parse",
        run="engine.stages.fetch.run:run",
        description="Download config, generation config, safetensors index and README; parse them.",
        soft_time_limit_s=120,
        time_limit_s=180,
    ),
    StageDefinition(
        name="analyze",
        title="Architecture analysis",
        run="engine.stages.analyze.run:run",
        needs=("fetch",),
        reads_known_families=True,
        findings="engine.stages.analyze.findings:findings",
        notes="engine.stages.analyze.notes:section",
        description=(
            "Reads config.json and the safetensors summary: attention kind and layer pattern, "
            "RoPE, MoE layout, quantization, total/active parameters, checkpoint bytes, KV-cache "
            "bytes, and what is new against known families."
        ),
        soft_time_limit_s=60,
        time_limit_s=90,
    ),
    StageDefinition(
        name="operators",
        title="Operator coverage",
        run="engine.stages.operators.run:run",
        needs=("fetch",),
        findings="engine.stages.operators.findings:findings",
        notes="engine.stages.operators.notes:section",
        description=(
            "Runs a scaled twin's prefill and decode on the pool's device under a recording "
            "dispatch mode; checks every ATen operator and dtype against the pool's backend or "
            "operator manifest, and maps missing ones to model features."
        ),
        soft_time_limit_s=300,
        time_limit_s=360,
    ),
    StageDefinition(
        name="precision",
        title="Precision validation",
        run="engine.stages.precision.run:run",
        needs=("fetch",),
        findings="engine.stages.precision.findings:findings",
        notes="engine.stages.precision.notes:section",
        description=(
            "Compares a scaled twin on the pool's device in each serving dtype with the float32 "
            "CPU reference: logit errors, cosine, top-1 agreement, KL, and the first decoder "
            "module whose local error exceeds the dtype's limit."
        ),
        soft_time_limit_s=300,
        time_limit_s=360,
    ),
    StageDefinition(
        name="plan",
        title="Plan the split (predicted)",
        run="engine.stages.plan.run:run",
        needs=("analyze",),
        check_options="engine.stages.plan.options:plan_options",
        findings="engine.stages.plan.findings:findings",
        notes="engine.stages.plan.notes:section",
        findings_read_analysis=True,
        description=(
            "Chooses the TP/PP/EP/DP split that serves the release on the pool's accelerators "
            "with the fewest devices: memory per device by part, predicted decode tokens/s and "
            "TPOT, runners-up and launch commands. Fails with what would fit (more devices, a "
            "smaller context, a lower-precision dtype) when nothing does."
        ),
        # The planner answers in well under a second, even for 10-trillion-parameter configs.
        soft_time_limit_s=30,
        time_limit_s=60,
        # Calibrated predictions beside the raw roofline, and on a cpu pool the bandwidth and
        # FLOP/s its performance runs measured (the cpu kind has no datasheet).
        reads_pool_calibration=True,
    ),
    StageDefinition(
        name="distributed",
        title="Run the split (measured)",
        run="engine.stages.distributed.run:run",
        needs=("plan",),
        check_options="engine.stages.distributed.options:distributed_options",
        limits_for_options="engine.stages.distributed.options:distributed_time_limits",
        findings="engine.stages.distributed.findings:findings",
        notes="engine.stages.distributed.notes:section",
        unjudged_keys="engine.stages.distributed.findings:unjudged_keys",
        description=(
            "Runs the plan's split for real: the scaled twin across TP processes with "
            "torch.distributed (torchrun; gloo on a cpu pool, NCCL on CUDA), sharded by "
            "transformers' own tensor-parallel plan (and its expert-parallel plan for MoE). "
            "Every rank's logits against the single-process float32 reference, the first "
            "divergent module, step time, the share of time in collectives and the measured "
            "scaling efficiency against TP=1."
        ),
        soft_time_limit_s=_DISTRIBUTED_DEFAULT_LIMITS_S[0],
        time_limit_s=_DISTRIBUTED_DEFAULT_LIMITS_S[1],
    ),
    StageDefinition(
        name="serve",
        title="Serving engine",
        run="engine.stages.serve.run:run",
        needs=("fetch", "plan"),
        check_options="engine.stages.serve.options:serve_options",
        limits_for_options="engine.stages.serve.options:serve_time_limits",
        findings="engine.stages.serve.findings:findings",
        notes="engine.stages.serve.notes:section",
        unjudged_keys="engine.stages.serve.findings:unjudged_keys",
        findings_read_analysis=True,
        description=(
            "Saves the scaled twin (or the release's real weights) as a checkpoint with the "
            "release's tokenizer, launches the pool's serving engine (vLLM, SGLang) from the "
            "plan's own command, or attaches to an OpenAI-compatible endpoint, and measures "
            "through its API: load time and memory, greedy tokens and log-probabilities "
            "against transformers in float32, a load sweep of concurrent requests (TTFT, "
            "TPOT, end-to-end latency, tokens/s and requests/s per level, the knee), the "
            "engine's Prometheus metrics during the sweep, and the plan's TP against TP=1. "
            "Then launches the plan's command at full size with dummy weights (the config and "
            "tokenizer alone) and sweeps its workloads at the plan's TP and the smaller ones "
            "that fit. Does not run on a pool without an engine."
        ),
        # Two launches (the plan's TP and TP=1), the precision check and the sweep, then the
        # full-size run's budget (`serve_time_limits` follows the job's options).
        soft_time_limit_s=SERVE_SOFT_TIME_LIMIT_S,
        time_limit_s=SERVE_TIME_LIMIT_S,
    ),
    StageDefinition(
        name="performance",
        title="Performance",
        run="engine.stages.performance.run:run",
        needs=("fetch",),
        check_options="engine.stages.performance.options:performance_options",
        limits_for_options="engine.stages.performance.options:performance_time_limits",
        findings="engine.stages.performance.findings:findings",
        notes="engine.stages.performance.notes:section",
        description=(
            "Measures the scaled twin's prefill and decode on the pool's device for batch sizes "
            "1, 2, 4, ... and a few prompt lengths: TTFT, TPOT (median and p95), tokens/s and "
            "peak memory; finds the knee batch size; keeps the plan's full-size predictions "
            "beside the twin's measured points; predicts the twin's own figures with the "
            "roofline on the device's bandwidth and FLOP/s (measured on a cpu pool) and stores "
            "the efficiency, measured / predicted, that calibrates the pool's next plans."
        ),
        # The soft limit is the sweep's time budget and follows the job's time_budget_s: the
        # sweep plans itself to fit and stops, keeping its points, when it is spent. These
        # fixed ones are the default run's (180 s, 240 s; it measures in under 60 s on 2 idle
        # CPU cores, benchmarks/performance.py).
        soft_time_limit_s=_PERFORMANCE_DEFAULT_LIMITS_S[0],
        time_limit_s=_PERFORMANCE_DEFAULT_LIMITS_S[1],
    ),
    StageDefinition(
        name="stability",
        title="Stability run",
        run="engine.stages.stability.run:run",
        needs=("fetch",),
        check_options="engine.stages.stability.options:stability_options",
        limits_for_options="engine.stages.stability.options:stability_time_limits",
        findings="engine.stages.stability.findings:findings",
        notes="engine.stages.stability.notes:section",
        description=(
            "Serves the scaled twin back to back for duration_s (20 s by default; hours on a "
            "real pool), sampling memory and step time: fails on a memory leak (slope over "
            "steps), NaN/Inf outputs, exceptions or step-time drift, naming the threshold."
        ),
        # The limits follow the job's duration_s; these fixed ones are the default run's.
        soft_time_limit_s=_STABILITY_DEFAULT_LIMITS_S[0],
        time_limit_s=_STABILITY_DEFAULT_LIMITS_S[1],
    ),
    StageDefinition(
        name="release_notes",
        title="Release notes",
        run="engine.stages.release_notes.run:run",
        reads_limitations=True,
        # A job that ends failed gets its notes too, saying what blocked it.
        runs_after_failure=True,
        description=(
            "Writes the release notes from the earlier stages: configuration (pool, split, "
            "dtype, context, concurrency, the plan's launch commands), the multi-device "
            "validation (the split run on the twin against the plan's: logit error, step time "
            "at TP=N and TP=1, share in collectives, scaling efficiency), performance "
            "recommendations (the knee measured on the twin beside the full-size prediction), "
            "precision per dtype, the stability verdict, the open known limitations, and what "
            "was not validated. Stored as a new version of the release's notes on the pool."
        ),
        # Pure Python over the stored results: well under a second.
        soft_time_limit_s=30,
        time_limit_s=60,
    ),
)

_BY_NAME = {stage.name: stage for stage in STAGES}

# The stages whose results raise known limitations (`findings_for_stage`), in run order.
STAGES_WITH_FINDINGS: tuple[str, ...] = tuple(
    stage.name for stage in STAGES if stage.findings is not None
)


def stage_names() -> list[str]:
    """Names of the registered stages, in the order a job runs them."""
    return [stage.name for stage in STAGES]


def get_stage(name: str) -> StageDefinition:
    """The stage called `name`. Raises `LookupError` naming the known stages."""
    try:
        return _BY_NAME[name]
    except KeyError:
        known = ", ".join(_BY_NAME)
        raise LookupError(f"Unknown stage {name!r}; known stages: {known}.") from None


def stage_list_check(stages: list[str] | None) -> list[str]:
    """A job's stage list in the registry's order (None or empty: every stage). Raises
    `ValueError` with a one-line reason for an unknown or repeated stage, or a stage without
    one it needs (`StageDefinition.needs`): "analyze" alone could only fail for want of the
    config `fetch` reads, and that would be put down to the release."""
    if not stages:
        return stage_names()
    known = stage_names()
    unknown = [name for name in stages if name not in known]
    if unknown:
        raise ValueError(
            f"Unknown {'stage' if len(unknown) == 1 else 'stages'} "
            f"{', '.join(map(repr, unknown))}; known stages: {', '.join(known)}."
        )
    if len(set(stages)) != len(stages):
        raise ValueError(f"A stage is named twice in {', '.join(stages)}.")
    missing = [
        f"{name} needs {need}"
        for name in stages
        for need in get_stage(name).needs
        if need not in stages
    ]
    if missing:
        raise ValueError(
            f"{'; '.join(missing)}: add what it needs to the stage list, or leave the list out "
            "for every stage."
        )
    return [name for name in known if name in stages]


def job_options_check(
    *, options: dict[str, Any] | None, stages: list[str] | None = None
) -> dict[str, dict[str, Any]]:
    """Per-stage job options checked and normalised by each stage's `check_options`, as a
    job stores them (stages whose options come out empty are left out). `stages` defaults to
    every registered stage. Raises `ValueError` with a one-line reason for an unknown stage,
    options for a stage not in `stages`, or options a stage refuses."""
    names = stages or stage_names()
    try:
        definitions = {name: get_stage(name) for name in names}
    except LookupError as exc:
        raise ValueError(str(exc)) from exc
    if options is not None and not isinstance(options, dict):
        raise ValueError(f"Job options map stage names to their options, got {options!r}.")
    checked: dict[str, dict[str, Any]] = {}
    for name, value in (options or {}).items():
        if name not in definitions:
            raise ValueError(
                f"Options for stage {name!r}, which this job does not run "
                f"(stages: {', '.join(names)})."
            )
        try:
            stage_options = definitions[name].checked_options(value)
        except ValueError as exc:
            raise ValueError(f"{name} options: {exc}") from exc
        if stage_options:
            checked[name] = stage_options
    return checked


def findings_for_stage(
    stage: str,
    result: Mapping[str, Any] | None,
    *,
    pool: str,
    analysis: Mapping[str, Any] | None = None,
) -> list[Finding] | None:
    """The findings in a stage's stored result on pool `pool` (its name), by the stage's own
    rules (its registry entry's `findings`), deduplicated by key. `analysis` (the release's
    `analyze` result) reaches only a stage whose findings read it
    (`findings_read_analysis`: the plan says when its context is capped). None when the
    stage raises no notes (or is not registered) or the result holds nothing to judge (a
    stage that crashed before checking): its notes must then be left as they are."""
    definition = _BY_NAME.get(stage)
    if definition is None or definition.findings is None or not isinstance(result, Mapping):
        return None
    rules = resolve_callable(definition.findings)
    if definition.findings_read_analysis:
        found = rules(result, pool=pool, analysis=analysis)
    else:
        found = rules(result, pool=pool)
    if found is None:
        return None
    unique: dict[str, Finding] = {}
    for finding in found:
        unique.setdefault(finding.key, finding)
    return list(unique.values())


def unjudged_keys(stage: str, result: Mapping[str, Any] | None) -> frozenset[str]:
    """Keys of the stage's notes that `result` neither finds nor rules out (a run that could
    not check them), by its registry entry's `unjudged_keys`: a sync leaves those notes as
    they are instead of resolving them. Empty for a stage without one."""
    definition = _BY_NAME.get(stage)
    if definition is None or definition.unjudged_keys is None or not isinstance(result, Mapping):
        return frozenset()
    return frozenset(resolve_callable(definition.unjudged_keys)(result))

"""The ordered list of stages every adaptation job runs (see docs/extending.md, "Adding a
stage").

Each entry names its `run` function by import path, so reading the registry (the web process
does, for titles and time limits) does not import torch or transformers; the worker imports a
stage's module when it runs it.
"""

from __future__ import annotations

from workers.stages.base import StageDefinition

STAGES: tuple[StageDefinition, ...] = (
    StageDefinition(
        name="fetch",
        title="Fetch & parse",
        run="workers.stages.fetch:run",
        description="Download config, generation config, safetensors index and README; parse them.",
        soft_time_limit_s=120,
        time_limit_s=180,
    ),
    StageDefinition(
        name="analyze",
        title="Architecture analysis",
        run="workers.stages.analyze:run",
        reads_known_families=True,
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
        run="workers.stages.operators:run",
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
        run="workers.stages.precision:run",
        description=(
            "Compares a scaled twin on the pool's device in each serving dtype with the float32 "
            "CPU reference: logit errors, cosine, top-1 agreement, KL, and the first layer and "
            "sub-module where the error jumps."
        ),
        soft_time_limit_s=300,
        time_limit_s=360,
    ),
    StageDefinition(
        name="plan",
        title="Distributed plan",
        run="workers.stages.plan:run",
        check_options="workers.stages.plan:plan_options",
        description=(
            "Chooses the TP/PP/EP/DP split that serves the release on the pool's accelerators "
            "with the fewest devices: memory per device by part, predicted decode tokens/s and "
            "TPOT, runners-up and launch commands. Fails with what would fit (more devices, a "
            "smaller context, a lower-precision dtype) when nothing does."
        ),
        # The planner answers in well under a second, even for 10-trillion-parameter configs.
        soft_time_limit_s=30,
        time_limit_s=60,
    ),
)

_BY_NAME = {stage.name: stage for stage in STAGES}


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

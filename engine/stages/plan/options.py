"""The per-job options of the `plan` stage, checked (`plan_options`, the registry's
`check_options`): plain Python, so the web process checks them when a job is created.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import PlanInputError
from .model import normalize_dtype
from .planner import MAX_CONCURRENCY, MAX_CONTEXT_TOKENS
from .steady_state import normalize_kv_dtype

PLAN_OPTIONS = (
    "context_tokens",
    "concurrency",
    "dtype",
    "kv_dtype",
    "input_tokens",
    "output_tokens",
)


def plan_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The plan options of a job (`AdaptationJob.options["plan"]`), checked: `context_tokens`
    (tokens per sequence, 1 to 100,000,000), `concurrency` (sequences at once, 1 to
    1,000,000), `dtype` (serving dtype: "checkpoint", "bfloat16", "float16", "fp8", "int8",
    "fp4" or a torch/engine alias, stored normalised), `kv_dtype` ("auto", "bfloat16", "fp8"),
    `input_tokens` / `output_tokens` (the workload the full-size predictions serve, per
    request, 1 to 100,000,000 each). Unset or None values are left out (the planner's
    defaults apply). Raises `PlanInputError` naming the option for an unknown key or a bad
    value."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise PlanInputError(f"plan options must be an object, got {type(options).__name__}")
    unknown = sorted(str(key) for key in options if key not in PLAN_OPTIONS)
    if unknown:
        raise PlanInputError(
            f"unknown plan {'option' if len(unknown) == 1 else 'options'} {', '.join(unknown)}; "
            f"known: {', '.join(PLAN_OPTIONS)}"
        )
    checked: dict[str, Any] = {}
    for name, limit in (
        ("context_tokens", MAX_CONTEXT_TOKENS),
        ("concurrency", MAX_CONCURRENCY),
        ("input_tokens", MAX_CONTEXT_TOKENS),
        ("output_tokens", MAX_CONTEXT_TOKENS),
    ):
        value = options.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanInputError(f"{name} must be a positive integer, got {value!r}")
        if value > limit:
            raise PlanInputError(f"{name} = {value:,} is implausibly large (limit {limit:,})")
        checked[name] = value
    if options.get("dtype") is not None:
        checked["dtype"] = normalize_dtype(options["dtype"])
    if options.get("kv_dtype") is not None:
        kv = normalize_kv_dtype(options["kv_dtype"])
        if kv is not None:
            checked["kv_dtype"] = kv
    return checked

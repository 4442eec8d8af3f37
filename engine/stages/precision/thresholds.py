"""Pass/fail thresholds per serving dtype, derived from the format's unit roundoff.

Every limit is a multiple of the dtype's unit roundoff u (the largest relative error of one
rounding), so a twin's flat seeded logits and a real release's peaked logits are held to the
same scale-free standard:

- `max_relative_logit_error`: mean over logit rows of ‖t - r‖₂ / ‖r‖₂ on mean-centred logits
  (softmax ignores a constant shift, so the shift is removed first).
- `max_row_relative_logit_error`: the same for the worst row (one prompt position).
- `min_cosine_similarity`: mean cosine of the centred rows; a relative error e gives a cosine of
  about 1 - e²/2, so the limit is 1 - (mean limit)²/2.
- `max_local_relative_error`: a sub-module's LOCAL relative error (its output on the
  reference's own input, see `drift`) above this names the first divergent module and fails the
  dtype. It is `local_error_k`·u·sqrt(max(1, n / 256)), n the model's reduction width (the
  widest trailing dimension of its weights; `REFERENCE_WIDTH` = 256 is where k was set).
- `min_top1_agreement`, `max_kl_divergence`, `max_mean_abs_error`: reported always, enforced only
  when a pool sets them (None by default): on a seeded twin the logits are flat (RMS ≈ 0.3) so
  near-ties flip top-1 and KL is ~1e-6 whatever the device does; they are scale-dependent.

Sources. u = 2^-p, p significand bits including the implicit one (Higham, "Accuracy and
Stability of Numerical Algorithms", 2nd ed., 2002, §2.1). A length-n inner product computed in
floating point has a relative error bounded by gamma_n = nu/(1 - nu) in the worst case (Higham
§3.1) and by λ·sqrt(n)·u with high probability (Higham & Mary, "A New Approach to Probabilistic
Rounding Error Analysis", SIAM J. Sci. Comput. 41(5), 2019, Thm 3.1; λ ≈ 1-2). The twins'
reduction widths are 336-928 (sqrt(n) ≈ 18-30), real releases' 2048-18432. bfloat16/float16
matmuls on CPUs and GPUs accumulate in float32, so a module's local error is a few u (one
rounding of inputs, weights and output) and only the accumulation-order term grows with sqrt(n).

`LOCAL_ERROR_K` = 16: λ·sqrt(n) with λ = 1 at n = `REFERENCE_WIDTH` = 256, scaled by
sqrt(n / 256) for wider models (a real release's 8192 gives 90u); ~9x the largest local error
measured on the real-config twins x 4 seeds (`MEASURED`), so a named module is a bug, never
rounding. A change smaller than that (a norm epsilon of 1e-3 on a layer whose mean square is
~1e-2: a relative change of ~7u in bfloat16) is below what the format can tell apart and is not
named. A genuine bug (a norm epsilon 100x off, a wrong cast, a kernel that truncates) is tens to
thousands of u. The logit limits (16u mean, 32u worst row) leave ~7x and ~10x over the measured
2.4u and 3.1u for depth: a real release has 8-30x the twin's 4 layers, and independent rounding
errors add about as sqrt(depth).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from engine.contract import StageFailed

# Unit roundoff u = 2^-p of each format. int8 weight-only and float8 run with bfloat16
# activations, so their floor is bfloat16's; their weight rounding is coarser (below).
UNIT_ROUNDOFF: Mapping[str, float] = {
    "float32": 2.0**-24,
    "bfloat16": 2.0**-8,
    "float16": 2.0**-11,
    "int8": 2.0**-8,
    "float8_e4m3fn": 2.0**-4,
    "float8_e5m2": 2.0**-3,
}

# Multiples of u (see the module docstring for where they come from).
LOCAL_ERROR_K = 16.0
REFERENCE_WIDTH = 256
MEAN_LOGIT_ERROR_K = 16.0
ROW_LOGIT_ERROR_K = 32.0

# What was measured when the multiples were set
# (tests/engine/stages/precision/test_precision.py checks the defaults hold with no false
# positive over the same grid): twins of the six configs in
# tests/data/realconfigs, seeds 0-3, CPU, MoE routing teacher-forced.
MEASURED = (
    "Measured on the six real-config twins x seeds 0-3 (CPU): largest local error 1.7u "
    "(bfloat16, float16), 3.8u (int8), 1.2u (float8); mean relative logit error <= 2.4u "
    "(bfloat16, float16), 5.9u (int8), 1.6u (float8); worst row <= 3.1u, 7.4u, 1.9u. "
    "A norm epsilon 1e-3 instead of 1e-5 is a local error of ~100u in bfloat16."
)

_SOURCE_COMMON = (
    "Limits are multiples of u: local module error <= {local:g}u, mean relative logit error "
    "<= {mean:g}u, worst row <= {row:g}u (Higham, 'Accuracy and Stability of Numerical "
    "Algorithms', 2nd ed., §2.1 and §3.1; Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019: a "
    "length-n dot product's relative error is <= λ·sqrt(n)·u with high probability). " + MEASURED
)


def _limits(u: float, *, local_k: float, mean_k: float, row_k: float) -> dict[str, float]:
    mean = mean_k * u
    return {
        "local_error_k": local_k,
        "max_local_relative_error": local_k * u,
        "max_relative_logit_error": mean,
        "max_row_relative_logit_error": row_k * u,
        "min_cosine_similarity": 1.0 - mean * mean / 2.0,
    }


def _entry(dtype: str, why: str, **ks: float) -> dict[str, Any]:
    u = UNIT_ROUNDOFF[dtype]
    ks = {"local_k": LOCAL_ERROR_K, "mean_k": MEAN_LOGIT_ERROR_K, "row_k": ROW_LOGIT_ERROR_K} | ks
    return {
        **_limits(u, **ks),
        "min_top1_agreement": None,
        "max_kl_divergence": None,
        "max_mean_abs_error": None,
        "unit_roundoff": u,
        "source": why
        + " "
        + _SOURCE_COMMON.format(local=ks["local_k"], mean=ks["mean_k"], row=ks["row_k"]),
    }


DEFAULT_THRESHOLDS: Mapping[str, Mapping[str, Any]] = {
    "bfloat16": _entry(
        "bfloat16",
        "bfloat16 keeps 8 significant bits, u = 2^-8 ≈ 3.9e-3 (Kalamkar et al., 'A Study of "
        "BFLOAT16 for Deep Learning Training', arXiv:1905.12322).",
    ),
    "float16": _entry(
        "float16",
        "float16 (IEEE 754 binary16) keeps 11 significant bits, u = 2^-11 ≈ 4.9e-4; a range of "
        "only ±65504, so overflow shows as Inf.",
    ),
    "float32": _entry(
        "float32",
        "float32 (IEEE 754 binary32), u = 2^-24 ≈ 6e-8, against a float32 reference: another "
        "device sums in another order, an error of λ·sqrt(n)·u per dot product in both runs "
        "(n up to 8192: 90u), so the multiples are 8x-128x bfloat16's (limits ≈ 1.5e-5 local, "
        "6e-5 mean, 2.4e-4 worst row). A silent downcast still fails: TF32 matmuls "
        "(u = 2^-11 ≈ 4.9e-4) or bfloat16 give local errors of 5e-4 and more.",
        local_k=256.0,
        mean_k=1024.0,
        row_k=4096.0,
    ),
    "int8": _entry(
        "int8",
        "int8 weight-only, symmetric per output channel (torch's aten::_weight_int8pack_mm): "
        "a step of max|w|/127, a relative weight error of about 2u for Gaussian weights, with "
        "bfloat16 activations, so u is bfloat16's; the logit multiples are twice bfloat16's.",
        mean_k=32.0,
        row_k=64.0,
    ),
    "float8_e4m3fn": _entry(
        "float8_e4m3fn",
        "float8 e4m3 keeps 4 significant bits, u = 2^-4 (Micikevicius et al., 'FP8 Formats for "
        "Deep Learning', arXiv:2209.05433), weights and activations scaled per tensor; the "
        "multiples are smaller than bfloat16's since u itself is 16x larger.",
        local_k=8.0,
        mean_k=6.0,
        row_k=12.0,
    ),
}

THRESHOLD_KEYS = (
    "max_local_relative_error",
    "max_relative_logit_error",
    "max_row_relative_logit_error",
    "min_cosine_similarity",
    "min_top1_agreement",
    "max_kl_divergence",
    "max_mean_abs_error",
)
# Keys of the jump rule this stage used before local errors; a pool that still sets them gets
# them listed under "ignored" rather than a failed stage.
RETIRED_KEYS = ("min_divergence_relative_error", "divergence_jump_factor")
SUPPORTED_DTYPES = tuple(DEFAULT_THRESHOLDS)


def thresholds_for(
    dtype: str,
    overrides: Mapping[str, Mapping[str, float]],
    *,
    reduction_width: int = REFERENCE_WIDTH,
) -> dict[str, Any]:
    """The dtype's default thresholds for a model whose widest reduction is `reduction_width`
    elements, with the pool's overrides on top.

    Adds "reduction_width", "overridden" (keys the pool set) and "ignored" (retired keys it
    set). A dtype with no defaults (a quantized format this stage cannot build) gets
    bfloat16's. Raises `StageFailed` for an unknown key or a value that is not a number.
    """
    merged = dict(DEFAULT_THRESHOLDS.get(dtype, DEFAULT_THRESHOLDS["bfloat16"]))
    merged["reduction_width"] = int(reduction_width)
    merged["max_local_relative_error"] *= math.sqrt(max(1.0, reduction_width / REFERENCE_WIDTH))
    override = dict(overrides.get(dtype) or {})
    ignored = sorted(set(override) & set(RETIRED_KEYS))
    for key in ignored:
        override.pop(key)
    unknown = sorted(set(override) - set(THRESHOLD_KEYS))
    if unknown:
        raise StageFailed(
            f"precision_thresholds[{dtype!r}] has unknown keys {unknown}; known: "
            f"{', '.join(THRESHOLD_KEYS)}"
        )
    for key, value in override.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise StageFailed(f"precision_thresholds[{dtype!r}][{key!r}] must be a number")
        merged[key] = None if value is None else float(value)
    merged["overridden"] = sorted(override)
    merged["ignored"] = ignored
    return merged

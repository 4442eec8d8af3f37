"""RoPE: type, scaling factor and base frequency as transformers reads them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .config_reader import ConfigView, check_int
from .errors import AnalysisError

DEFAULT_ROPE_THETA = 10000.0  # transformers' default base when a config names none
# RoPE types whose parameters carry the pretraining context (`original_max_position_embeddings`).
_ORIGINAL_CONTEXT_TYPES = ("llama3", "yarn", "longrope")
# RoPE types transformers implements (modeling_rope_utils.ROPE_INIT_FUNCTIONS plus "default";
# Qwen2-VL's "mrope" is read as "default" by its config class). Another type only runs with
# the model's own code.
TRANSFORMERS_ROPE_TYPES = frozenset(
    {"default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional", "mrope"}
)


def _scaling_dict(view: ConfigView) -> tuple[Mapping[str, Any] | None, str]:
    """The RoPE parameters dict and the key it came from (`rope_scaling` or `rope_parameters`).

    With neither key, the scaling the family's config class applies by default (gpt-oss
    YaRN, Apertus llama3), if any.
    """
    for key in ("rope_parameters", "rope_scaling"):
        value = view.raw.get(key)
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise AnalysisError(f"{key} must be an object, got {value!r}")
        # Gemma 3 in transformers 5 keeps one dict per layer type; the full-attention one
        # carries the long-context scaling.
        if "full_attention" in value and isinstance(value["full_attention"], Mapping):
            return value["full_attention"], f"{key}.full_attention"
        return value, key
    if view.family is not None and "rope_parameters" not in view.raw:
        default = view.family.defaults.get("rope_parameters")
        if isinstance(default, Mapping):
            return default, f"{view.family.defaults.source} default rope_parameters"
    return None, ""


def rope_info(view: ConfigView) -> tuple[dict[str, Any], list[str]]:
    """`{"type", "factor", "theta", ...}` and notes.

    Type from `rope_type`, else the legacy `type` (transformers' `rope_config_validation`
    renames it), else "default" when there is no scaling. Theta from `rope_theta` (or
    `rope_parameters.rope_theta`), default 10000 as in transformers' RoPE init functions.

    llama3/yarn/longrope: `original_max_position_embeddings` as transformers'
    `standardize_rope_params` sets it (a top-level key wins, as Phi-3 stores it there; else the
    scaling dict's; else max_position_embeddings). longrope (and yarn without `factor`):
    `factor` = max_position_embeddings / original_max_position_embeddings when the dict has
    none, and longrope's `attention_factor` = sqrt(1 + ln factor / ln original) when absent
    (modeling_rope_utils.py `_compute_longrope_parameters`).
    """
    notes: list[str] = []
    params, source = _scaling_dict(view)
    rope_type = "default"
    factor: float | None = None
    extra: dict[str, Any] = {}
    theta_raw: Any = view.raw.get("rope_theta")
    if params:
        new, legacy = params.get("rope_type"), params.get("type")
        if new is not None and legacy is not None and new != legacy:
            notes.append(
                f"{source} has rope_type {new!r} and legacy type {legacy!r}: rope_type used"
            )
        rope_type = str(new or legacy or "default")
        if rope_type == "su":  # Phi-3's early name for longrope (transformers renames it)
            rope_type = "longrope"
        raw_factor = params.get("factor")
        if raw_factor is not None:
            if (
                isinstance(raw_factor, bool)
                or not isinstance(raw_factor, int | float)
                or raw_factor <= 0
            ):
                raise AnalysisError(
                    f"{source}.factor must be a positive number, got {raw_factor!r}"
                )
            factor = float(raw_factor)
        if theta_raw is None:
            theta_raw = params.get("rope_theta")
        for key in (
            "original_max_position_embeddings",
            "low_freq_factor",
            "high_freq_factor",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "partial_rotary_factor",
        ):
            if params.get(key) is not None:
                extra[key] = params[key]
    if theta_raw is None:
        theta = view.number("rope_theta", DEFAULT_ROPE_THETA)
    else:
        if isinstance(theta_raw, bool) or not isinstance(theta_raw, int | float) or theta_raw <= 0:
            raise AnalysisError(f"rope_theta must be a positive number, got {theta_raw!r}")
        theta = float(theta_raw)
    if rope_type not in TRANSFORMERS_ROPE_TYPES:
        notes.append(
            f"{source}.rope_type {rope_type!r} is not a RoPE type transformers implements "
            f"({', '.join(sorted(TRANSFORMERS_ROPE_TYPES))}): only the release's own modeling "
            "code can run it"
        )
    if rope_type in _ORIGINAL_CONTEXT_TYPES:
        factor = _original_context(view, params or {}, rope_type, factor, extra, notes)
    info: dict[str, Any] = {"type": rope_type, "factor": factor, "theta": theta}
    if rope_type == "default" and factor is None:
        info["factor"] = 1.0
    partial = view.raw.get("partial_rotary_factor", extra.pop("partial_rotary_factor", None))
    if partial is None and view.family is not None:
        partial = view.family.defaults.get("partial_rotary_factor")
    if partial is not None:
        info["partial_rotary_factor"] = partial
    local = view.value("rope_local_base_freq")
    if local is not None:
        info["local_theta"] = local  # Gemma 3's base for its sliding-window layers
    info.update(extra)
    return info, notes


def _original_context(
    view: ConfigView,
    params: Mapping[str, Any],
    rope_type: str,
    factor: float | None,
    extra: dict[str, Any],
    notes: list[str],
) -> float | None:
    """Fill `original_max_position_embeddings` (and longrope's derived factor) into `extra`;
    returns the factor transformers uses."""
    top = view.raw.get("original_max_position_embeddings")
    inner = params.get("original_max_position_embeddings")
    max_pos = view.int("max_position_embeddings", None)
    if top is not None:
        original = view.int("original_max_position_embeddings")
        if inner is not None and inner != top:
            notes.append(
                f"original_max_position_embeddings {top} (top level) and {inner} (RoPE "
                "parameters) differ: the top-level one is used, as transformers does"
            )
    elif inner is not None:
        original = check_int("original_max_position_embeddings", inner)
    else:
        original = max_pos
    if original is None:
        return factor
    extra["original_max_position_embeddings"] = original
    if factor is None and rope_type in ("longrope", "yarn") and max_pos:
        factor = max_pos / original
    if rope_type == "longrope" and factor is not None:
        attention = params.get("attention_factor")
        if attention is None:
            attention = (
                1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
            )
        extra["attention_factor"] = attention
    return factor

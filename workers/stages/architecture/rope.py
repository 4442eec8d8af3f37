"""RoPE: type, scaling factor and base frequency as transformers reads them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .config_reader import ConfigView
from .errors import AnalysisError

DEFAULT_ROPE_THETA = 10000.0  # transformers' default base when a config names none


def _scaling_dict(view: ConfigView) -> tuple[Mapping[str, Any] | None, str]:
    """The RoPE parameters dict and the key it came from (`rope_scaling` or `rope_parameters`)."""
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
    return None, ""


def rope_info(view: ConfigView) -> tuple[dict[str, Any], list[str]]:
    """`{"type", "factor", "theta", ...}` and notes.

    Type from `rope_type`, else the legacy `type` (transformers' `rope_config_validation`
    renames it), else "default" when there is no scaling. Theta from `rope_theta` (or
    `rope_parameters.rope_theta`), default 10000 as in transformers' RoPE init functions.
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

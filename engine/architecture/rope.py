"""RoPE: type, scaling factor and base frequency as transformers reads them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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


# Keys a nested `rope_parameters` may use for its main entry when it is not keyed by layer
# type (DeepSeek-V4 keeps "main" and "compress").
_MAIN_ENTRY_KEYS = ("full_attention", "main", "default")


def _nested_entries(value: Mapping[str, Any]) -> dict[str, Mapping[str, Any]] | None:
    """The entries of a per-layer-type `rope_parameters` (transformers v5: one dict per layer
    type, Gemma 3/4 `{"full_attention": {...}, "sliding_attention": {...}}`), else None."""
    if value and all(isinstance(v, Mapping) for v in value.values()):
        return {str(k): v for k, v in value.items()}
    return None


def _scaling_dict(
    view: ConfigView,
) -> tuple[Mapping[str, Any] | None, str, dict[str, Mapping[str, Any]] | None]:
    """The main RoPE parameters dict, the key it came from (`rope_scaling` or
    `rope_parameters`), and every entry when the dict is keyed by layer type.

    The main entry of a per-layer-type dict is the full-attention one (it carries the
    long-context scaling), else "main", else the first. With neither key, the scaling the
    family's config class applies by default (gpt-oss YaRN, Apertus llama3), if any.
    """
    for key in ("rope_parameters", "rope_scaling"):
        value = view.raw.get(key)
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise AnalysisError(f"{key} must be an object, got {value!r}")
        entries = _nested_entries(value)
        if entries:
            name = next((k for k in _MAIN_ENTRY_KEYS if k in entries), next(iter(entries)))
            return entries[name], f"{key}.{name}", entries
        return value, key, None
    if view.family is not None and "rope_parameters" not in view.raw:
        default = view.family.defaults.get("rope_parameters")
        if isinstance(default, Mapping):
            return default, f"{view.family.defaults.source} default rope_parameters", None
    return None, "", None


def _theta(raw: Any, key: str = "rope_theta") -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw <= 0:
        raise AnalysisError(f"{key} must be a positive number, got {raw!r}")
    return float(raw)


def rope_info(
    view: ConfigView, layer_types: Sequence[str] | None = None
) -> tuple[dict[str, Any], list[str]]:
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

    Per layer type: when `rope_parameters` holds one dict per layer type (transformers v5),
    every entry is read into `per_layer_type[name]` (its own type, theta, factor; `layers`: how
    many of `layer_types` have that type); a v4 config with `rope_local_base_freq` (Gemma 3)
    gets the same for its sliding layers. The top-level fields are the main entry's.
    """
    notes: list[str] = []
    params, source, entries = _scaling_dict(view)
    top_theta: Any = view.raw.get("rope_theta")
    info = _entry_info(view, params, source, top_theta, notes, main=True)
    partial = view.raw.get("partial_rotary_factor", info.pop("partial_rotary_factor", None))
    if partial is None and view.family is not None:
        partial = view.family.defaults.get("partial_rotary_factor")
    if partial is not None:
        info["partial_rotary_factor"] = partial
    per_type: dict[str, dict[str, Any]] = {}
    main_key = source.rsplit(".", 1)[0]
    for name, entry in (entries or {}).items():
        if f"{main_key}.{name}" == source:
            per_type[name] = dict(info)
        else:
            per_type[name] = _entry_info(view, entry, f"{main_key}.{name}", None, notes, main=False)
    # Gemma 3's base for its sliding-window layers: the config's own per-type entry, else its
    # v4 `rope_local_base_freq` (or the family default for it).
    local = view.value("rope_local_base_freq")
    if "sliding_attention" in per_type and not view.has("rope_local_base_freq"):
        local = per_type["sliding_attention"]["theta"]
    if local is not None:
        info["local_theta"] = local
        if not per_type and layer_types and "sliding_attention" in layer_types:
            per_type = {
                "full_attention": {k: v for k, v in info.items() if k != "local_theta"},
                "sliding_attention": {"type": "default", "factor": 1.0, "theta": float(local)},
            }
    if per_type:
        for name, entry in per_type.items():
            if layer_types is not None and name in layer_types:
                entry["layers"] = sum(1 for t in layer_types if t == name)
        info["per_layer_type"] = per_type
    return info, notes


def _entry_info(
    view: ConfigView,
    params: Mapping[str, Any] | None,
    source: str,
    top_theta: Any,
    notes: list[str],
    *,
    main: bool,
) -> dict[str, Any]:
    """Type, factor, theta and the scaling's own fields of one RoPE parameters dict.

    `top_theta` (the config's top-level `rope_theta`) wins over the dict's own; only the main
    entry falls back to the family default theta and reads the top-level
    `original_max_position_embeddings`.
    """
    rope_type = "default"
    factor: float | None = None
    extra: dict[str, Any] = {}
    theta_raw: Any = top_theta
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
        theta = view.number("rope_theta", DEFAULT_ROPE_THETA) if main else DEFAULT_ROPE_THETA
    else:
        theta = _theta(theta_raw, f"{source}.rope_theta" if not main else "rope_theta")
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
    info.update(extra)
    return info


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

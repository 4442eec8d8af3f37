"""Read a `config.json` the way transformers does: aliases, nested `text_config`, defaults.

Every value the analysis uses goes through `ConfigView`, which checks its type and range and
falls back to the family's transformers default (recording a note when a structural default is
used), so a bad config fails with one clear `AnalysisError` instead of a wrong number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import AnalysisError
from .families import family_for
from .family_spec import FamilySpec
from .meta_build import MetaBuildError, resolved_text_config, transformers_knows

# Upper bounds that no real checkpoint comes near: a value above one is a typo or a unit error.
LIMITS: Mapping[str, int] = {
    "hidden_size": 1 << 20,
    "num_hidden_layers": 10_000,
    "num_attention_heads": 1 << 16,
    "num_key_value_heads": 1 << 16,
    "head_dim": 1 << 14,
    "vocab_size": 1 << 24,
    "intermediate_size": 1 << 22,
    "max_position_embeddings": 1 << 32,
}
DEFAULT_LIMIT = 1 << 24

# Alternative spellings of the standard keys (transformers `attribute_map`s of older families).
KEY_ALIASES: Mapping[str, tuple[str, ...]] = {
    "hidden_size": ("d_model", "n_embd", "model_dim"),
    "num_hidden_layers": ("n_layer", "n_layers", "num_layers"),
    "num_attention_heads": ("n_head", "n_heads", "num_heads"),
    "num_key_value_heads": ("num_kv_heads", "n_head_kv", "n_kv_heads"),
    "intermediate_size": ("ffn_hidden_size", "d_ff", "n_inner", "ffn_dim"),
    "max_position_embeddings": (
        "n_positions",
        "max_sequence_length",
        "seq_length",
        "model_max_length",  # Kimi Linear
    ),
    "vocab_size": ("padded_vocab_size", "n_vocab"),
    # Kimi Linear's attribute_map spellings of the MoE router keys.
    "n_group": ("num_expert_group",),
    "norm_topk_prob": ("moe_renormalize",),
}

# Keys a multimodal wrapper keeps at the top level that also describe its text model.
_INHERITED_FROM_WRAPPER = ("quantization_config", "torch_dtype", "dtype", "tie_word_embeddings")

_MISSING = object()


@dataclass
class ConfigView:
    """A config dict (text model already unwrapped) plus its family's defaults.

    `notes` collects what a reader of the analysis should know about how values were read;
    `assumptions` what an estimate of an unknown family took for granted.
    """

    raw: Mapping[str, Any]
    family: FamilySpec | None
    notes: list[str] = field(default_factory=list)
    used_defaults: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)

    def has(self, key: str) -> bool:
        """True when the config itself sets `key` to a non-null value."""
        return self.raw.get(key) is not None

    def value(self, key: str, default: Any = None) -> Any:
        """The config's value for `key` (or an alias), else the family default, else `default`.

        The family's defaults and its own spellings of `key` come from transformers' config
        class (family_spec.py), loaded on the first look-up that needs them.
        """
        # A key the config sets, even to null, wins over the family default: transformers
        # keeps an explicit `"sliding_window": null`.
        found = self._raw_value(key, KEY_ALIASES.get(key, ()))
        if found is not _MISSING:
            return default if found is None else found
        if self.family is None:
            return default
        defaults = self.family.defaults
        # The family's attribute_map spellings (Kimi Linear's `num_experts` for
        # `num_local_experts`) are the same key to transformers: they win over its default.
        found = self._raw_value(key, defaults.spellings(key))
        if found is not _MISSING:
            return default if found is None else found
        fallback = defaults.get(key)
        if fallback is None:
            return default
        if key in LIMITS and key not in self.used_defaults:
            self.used_defaults.append(key)
        return fallback

    def _raw_value(self, key: str, aliases: Sequence[str]) -> Any:
        """The config's value under `key` or an alias (None when set to null), else _MISSING."""
        for name in (key, *aliases):
            if name in self.raw:
                return self.raw[name]
        return _MISSING

    def source_key(self, key: str) -> str | None:
        """Which spelling of `key` the config uses, or None when it is absent."""
        for name in (key, *KEY_ALIASES.get(key, ())):
            if self.raw.get(name) is not None:
                return name
        return None

    def spelling(self, key: str) -> str:
        """The name the config itself uses for `key` (an alias or the family's own spelling,
        Hunyuan's `moe_topk` for `num_experts_per_tok`), else `key`."""
        names = (key, *KEY_ALIASES.get(key, ()))
        if self.family is not None:
            names += self.family.defaults.spellings(key)
        return next((name for name in names if name in self.raw), key)

    def int(self, key: str, default: Any = _MISSING, *, minimum: int = 1) -> int | None:
        """An integer in [minimum, limit]; None when absent and `default` is None.

        Raises `AnalysisError` for a wrong type, a value out of range, or (with no default)
        a missing key.
        """
        raw = self.value(key, None)
        if raw is None:
            if default is _MISSING:
                raise AnalysisError(f"config.json is missing required key: {key}")
            return default
        return check_int(key, raw, minimum=minimum)

    def bool(self, key: str, default: bool) -> bool:
        """A boolean flag; `AnalysisError` when the config holds something else."""
        raw = self.value(key, None)
        if raw is None:
            return default
        if not isinstance(raw, bool):
            raise AnalysisError(f"{key} must be true or false, got {raw!r}")
        return raw

    def number(self, key: str, default: float | None = None) -> float | None:
        """A positive real number (RoPE theta, scaling factors)."""
        raw = self.value(key, None)
        if raw is None:
            return default
        if isinstance(raw, bool) or not isinstance(raw, int | float) or raw <= 0:
            raise AnalysisError(f"{key} must be a positive number, got {raw!r}")
        return float(raw)

    def int_list(self, key: str) -> list[int] | None:
        """A list of non-negative integers (layer indices), or None when absent."""
        raw = self.value(key, None)
        if raw is None:
            return None
        if not isinstance(raw, list):
            raise AnalysisError(f"{key} must be a list of integers, got {raw!r}")
        return [check_int(key, item, minimum=0) for item in raw]


def check_int(key: str, raw: Any, *, minimum: int = 1) -> int:
    """`raw` as an int within [minimum, LIMITS[key]]; `AnalysisError` with the reason if not."""
    if isinstance(raw, bool) or not isinstance(raw, int):
        if isinstance(raw, float) and raw.is_integer():
            raw = int(raw)
        else:
            raise AnalysisError(f"{key} must be an integer, got {raw!r}")
    limit = LIMITS.get(key, DEFAULT_LIMIT)
    if raw < minimum:
        raise AnalysisError(f"{key} must be at least {minimum}, got {raw}")
    if raw > limit:
        raise AnalysisError(f"{key} = {raw} is implausibly large (limit {limit})")
    return raw


# Where the parameter counts of an analysis come from.
FAMILY_TABLE = "family table"  # day0's own module list for the family (families.py)
TRANSFORMERS_BUILD = "transformers meta-device build"  # model type only transformers knows
ESTIMATED = "estimated"  # neither knows it: Llama-style modules from the standard keys


@dataclass(frozen=True)
class ModelConfig:
    """The standard shape of a decoder-only transformer, normalised across families.

    Sizes are counts (layers, heads) or widths in elements (hidden size, head_dim).
    `intermediate_by_layer`: the dense MLP width of each layer when the config lists them per
    layer and they differ (Gemma 3n); `intermediate_size` is then the largest.
    `source` is one of FAMILY_TABLE, TRANSFORMERS_BUILD, ESTIMATED; for TRANSFORMERS_BUILD
    `build_config`/`build_model_type` are what transformers builds (the whole multimodal
    wrapper when transformers knows it, else the text model).
    """

    view: ConfigView
    model_type: str | None
    architecture: str | None
    family: FamilySpec | None
    config_keys: tuple[str, ...]
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int | None
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    lm_head_bias: bool
    torch_dtype: str | None
    is_mla: bool
    source: str = FAMILY_TABLE
    intermediate_by_layer: tuple[int, ...] | None = None
    build_config: Mapping[str, Any] | None = None
    build_model_type: str | None = None


def unwrap_text_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The text model's config: `text_config` of a multimodal wrapper, else `config` itself.

    Returns the merged dict and a note when a wrapper was unwrapped. Wrapper keys that also
    apply to the text model (quantization, dtype, tied embeddings, architectures) are kept.
    """
    text = config.get("text_config")
    has_own_width = any(
        config.get(k) is not None for k in ("hidden_size", *KEY_ALIASES["hidden_size"])
    )
    if not isinstance(text, Mapping) or has_own_width:
        return dict(config), None
    merged = dict(text)
    for key in _INHERITED_FROM_WRAPPER:
        if config.get(key) is not None and merged.get(key) is None:
            merged[key] = config[key]
    merged["architectures"] = config.get("architectures") or text.get("architectures")
    if not merged.get("model_type"):
        merged["model_type"] = config.get("model_type")
    wrapper = config.get("model_type") or "multimodal"
    note = (
        f"multimodal config ({wrapper}): the text model in text_config is analysed; "
        "vision/audio towers and projectors are not in total_params"
    )
    return merged, note


def reject_non_finite(value: Any, path: str = "") -> None:
    """`AnalysisError` naming the key of the first NaN or infinity anywhere in `value`.

    Python's `json` module accepts the non-standard `NaN`, `Infinity` and `-Infinity`
    literals, so a parsed config.json can hold them; no config value means either.
    """
    if isinstance(value, float):
        if not math.isfinite(value):
            raise AnalysisError(f"{path or 'config'} must be a finite number, got {value!r}")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            reject_non_finite(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            reject_non_finite(item, f"{path}[{i}]")


def read_config(config: Mapping[str, Any]) -> ModelConfig:
    """Normalise a parsed `config.json` into `ModelConfig`.

    Raises `AnalysisError` naming every missing required key at once, or the first invalid
    value with the reason.
    """
    if not isinstance(config, Mapping):
        raise AnalysisError(f"config must be a JSON object, got {type(config).__name__}")
    reject_non_finite(config)
    merged, wrapper_note = unwrap_text_config(config)
    model_type = merged.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise AnalysisError(f"model_type must be a string, got {model_type!r}")
    architectures = merged.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise AnalysisError(f"architectures must be a list of class names, got {architectures!r}")
    config_keys = tuple(sorted(set(config) | set(merged)))
    family, via = family_for(model_type, architectures)
    source, build_config, build_type = FAMILY_TABLE, None, None
    build_note = None
    if (family is None or via.startswith("architectures")) and transformers_knows(model_type):
        # transformers has the model type and day0's table does not: its class resolves the
        # config and its meta-device build gives the parameters (meta_build.py).
        build_config, build_type = _build_target(
            config, merged, model_type, wrapped=wrapper_note is not None
        )
        try:
            resolved = resolved_text_config(build_config, build_type)
        except MetaBuildError as err:
            build_note = f"{err}; analysed without transformers' build"
        else:
            family, via, source = (
                FamilySpec(name=str(model_type)),
                "transformers",
                TRANSFORMERS_BUILD,
            )
            for key, value in resolved.items():
                if key not in merged and value is not None:
                    merged[key] = value
    if family is None:
        source, build_config, build_type = ESTIMATED, None, None
    view = ConfigView(raw=merged, family=family)
    if wrapper_note:
        view.notes.append(wrapper_note)
    if build_note:
        view.notes.append(build_note)
    if family is None:
        view.notes.append(
            f"unknown model_type {model_type!r}: neither day0's family table nor transformers "
            "knows it; estimated from the standard keys with Llama-style modules (see "
            "assumptions)"
        )
        view.assumptions.append(
            "decoder layer: q/k/v/o projections, a gated MLP (gate/up/down) and two RMSNorms; "
            "a final RMSNorm; no other modules"
        )
    elif source == TRANSFORMERS_BUILD:
        view.notes.append(
            f"model_type {model_type!r} is not in day0's family table: the config is resolved "
            f"by transformers {family.defaults.transformers_version}'s own config class and "
            "the parameters counted from its meta-device build"
        )
    else:
        if via != "model_type":
            view.notes.append(f"family {family.name} recognised from {via}")
        if not family.defaults.known:
            view.notes.append(
                f"transformers {family.defaults.transformers_version} has no config class for "
                f"{family.name!r} (a family newer than it): keys the config leaves out get no "
                "family default; analysed from what the config says"
            )

    is_mla = view.has("kv_lora_rank") or (
        family is not None and family.defaults.get("kv_lora_rank") is not None
    )
    required = ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"]
    missing = [key for key in required if view.value(key) is None]
    if missing:
        what = f"model_type {model_type!r}" if model_type else "config"
        raise AnalysisError(f"{what} is missing required keys: {', '.join(missing)}")

    hidden_size = view.int("hidden_size")
    num_layers = view.int("num_hidden_layers")
    heads = view.int("num_attention_heads")
    vocab_size = view.int("vocab_size")
    assert hidden_size and num_layers and heads and vocab_size  # required above

    kv_heads = view.int("num_key_value_heads", None) or heads
    if family is None and not view.has("num_key_value_heads"):
        view.assumptions.append("num_key_value_heads absent: one K/V head per attention head (MHA)")
    if heads % kv_heads:
        raise AnalysisError(
            f"num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads})"
        )
    if is_mla:
        # MLA: q/k heads are nope + rope wide (DeepSeek-V2 paper §2.1); transformers reports
        # head_dim = qk_rope_head_dim, which is not the width of a head (so its class default,
        # DeepSeek-V3.2's 64, is not read; a config's own value is only checked).
        # transformers' own resolution (a model type only it knows) may set it to
        # qk_rope_head_dim = 0 (GLM-5-Next's NoPE MLA).
        if view.has("head_dim") and source != TRANSFORMERS_BUILD:
            view.int("head_dim")
        head_dim = view.int("qk_nope_head_dim") + view.int("qk_rope_head_dim", minimum=0)  # type: ignore[operator]
    else:
        # An explicit head_dim wins (Qwen3, Gemma, gpt-oss set it apart from hidden/heads).
        head_dim = view.int("head_dim", None)
        if head_dim is None:
            if hidden_size % heads and source == TRANSFORMERS_BUILD:
                # transformers' own modules take hidden_size // heads (GLM-4.5V's text model);
                # the KV figures use each layer's built k_proj instead.
                view.notes.append(
                    f"head_dim absent and hidden_size ({hidden_size}) not divisible by "
                    f"num_attention_heads ({heads}): {hidden_size // heads}, as transformers "
                    "takes it"
                )
            elif hidden_size % heads:
                raise AnalysisError(
                    f"hidden_size ({hidden_size}) is not divisible by num_attention_heads "
                    f"({heads}) and no head_dim is given"
                )
            head_dim = hidden_size // heads
            if family is None:
                view.assumptions.append("head_dim absent: hidden_size / num_attention_heads")

    torch_dtype = merged.get("torch_dtype") or merged.get("dtype")
    if torch_dtype is not None and not isinstance(torch_dtype, str):
        raise AnalysisError(f"torch_dtype must be a string, got {torch_dtype!r}")
    # transformers' PreTrainedConfig ties embeddings unless the family's config says otherwise.
    tie = view.bool("tie_word_embeddings", True)
    if family is None and not view.has("tie_word_embeddings"):
        view.notes.append(
            "tie_word_embeddings absent: transformers' default (tied) assumed for an unknown family"
        )
        view.assumptions.append("tie_word_embeddings absent: tied (transformers' default)")
    if family is None:
        for key in ("attention_bias", "mlp_bias"):
            if not view.has(key):
                view.assumptions.append(f"{key} absent: no biases")
    max_pos = view.int("max_position_embeddings", None)
    if max_pos is None:
        view.notes.append("max_position_embeddings absent: KV cache at max context unknown")
    intermediate_by_layer = _per_layer_widths(view, "intermediate_size", num_layers)
    if intermediate_by_layer is not None:
        intermediate: int | None = max(intermediate_by_layer)
        if len(set(intermediate_by_layer)) == 1:
            intermediate_by_layer = None
    else:
        intermediate = view.int("intermediate_size", None)
    # Ernie 4.5: one `use_bias` flag for every projection, the MLP and the LM head.
    bias_key = family.bias_key if family is not None else None
    all_bias = view.bool(bias_key, False) if bias_key else None

    return ModelConfig(
        view=view,
        model_type=model_type,
        architecture=architectures[0] if architectures else None,
        family=family,
        config_keys=config_keys,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_attention_heads=heads,
        num_kv_heads=heads if is_mla else kv_heads,
        head_dim=head_dim,
        vocab_size=vocab_size,
        intermediate_size=intermediate,
        intermediate_by_layer=intermediate_by_layer,
        max_position_embeddings=max_pos,
        tie_word_embeddings=tie,
        attention_bias=all_bias if all_bias is not None else view.bool("attention_bias", False),
        mlp_bias=all_bias if all_bias is not None else view.bool("mlp_bias", False),
        lm_head_bias=bool(all_bias and family is not None and family.lm_head_follows_bias_key),
        torch_dtype=torch_dtype,
        is_mla=is_mla,
        source=source,
        build_config=build_config,
        build_model_type=build_type,
    )


def _per_layer_widths(view: ConfigView, key: str, layers: int) -> tuple[int, ...] | None:
    """`key` as one width per layer when the config gives a list, else None."""
    raw = view.value(key, None)
    if not isinstance(raw, list | tuple):
        return None
    if len(raw) != layers:
        raise AnalysisError(
            f"{key} must be an integer or a list of one integer per layer ({layers}), "
            f"got a list of {len(raw)}"
        )
    return tuple(check_int(f"{key}[{i}]", item) for i, item in enumerate(raw))


def _build_target(
    config: Mapping[str, Any], merged: Mapping[str, Any], model_type: Any, wrapped: bool
) -> tuple[Mapping[str, Any], str]:
    """What transformers builds: a multimodal wrapper (`wrapped`) whole when it knows the
    top-level model type (its towers then show apart), else the text model alone."""
    top = config.get("model_type")
    if wrapped and isinstance(top, str) and transformers_knows(top):
        return dict(config), top
    return dict(merged), str(model_type)


def structural_default_notes(view: ConfigView) -> list[str]:
    """Notes for structural keys filled from the family's transformers defaults."""
    if not view.used_defaults or view.family is None:
        return []
    defaults = view.family.defaults
    filled = ", ".join(f"{k}={defaults[k]}" for k in view.used_defaults)
    return [f"absent keys filled with {defaults.source} defaults ({view.family.name}): {filled}"]


def as_sequence(value: Any) -> Sequence[Any]:
    """`value` as a list (a single string or number becomes a one-item list)."""
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return value
    return [value]

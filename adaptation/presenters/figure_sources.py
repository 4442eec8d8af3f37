"""Where each figure of the analysis comes from: read from the release's `config.json`, computed
from it by the engine, published in the weight index, or counted from the checkpoint's
safetensors headers. The analysis table says which beside
every figure (`adaptation.presenters.analysis`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.architecture.config_reader import KEY_ALIASES
from engine.architecture.moe import EXPERT_COUNT_KEYS, SHARED_COUNT_KEYS, TOP_K_KEYS

# A figure's source, as a state the template words: the config holds it with this value; the
# engine computed it from the config; the weight index publishes it.
READ_FROM_CONFIG = "config"
COMPUTED = "computed"
FROM_INDEX = "index"
# Counted from the checkpoint's own safetensors headers.
FROM_HEADERS = "headers"

# The config key(s) each analysis figure is read from, as dotted paths into `config.json`
# (a number indexes a list); a figure is "read from config" only when the config itself holds
# one of these keys with the value shown. An empty tuple marks a figure the engine always
# computes (counts, summaries, layer patterns). Figures not listed fall back to the key of
# the same name (`attention.X`, `moe.X`: `X`; `rope.X`: `rope_scaling.X`; `quantization.X`:
# `quantization_config.X`), which is safe because the value must match too. Alternative
# spellings come from the engine's own readers (`KEY_ALIASES`, the MoE key lists), so a
# spelling the engine learns is recognised here too.
_ROPE_DICTS = ("rope_scaling", "rope_parameters", "rope_parameters.full_attention")
_QUANT_DICTS = ("quantization_config", "compression_config")


def _in_dicts(dicts: tuple[str, ...], *keys: str) -> tuple[str, ...]:
    return tuple(f"{prefix}.{key}" for key in keys for prefix in dicts)


def _spellings(key: str) -> tuple[str, ...]:
    """A standard config key and the aliases the engine's config reader accepts for it."""
    return (key, *KEY_ALIASES.get(key, ()))


FIGURE_CONFIG_KEYS: Mapping[str, tuple[str, ...]] = {
    # model
    "architecture": ("architectures.0",),
    "model_type": ("model_type",),
    "family": (),
    "torch_dtype": ("torch_dtype", "dtype"),
    "quantization_summary": (),
    "tie_word_embeddings": ("tie_word_embeddings",),
    # shape
    "num_layers": _spellings("num_hidden_layers"),
    "hidden_size": _spellings("hidden_size"),
    "num_attention_heads": _spellings("num_attention_heads"),
    "num_kv_heads": _spellings("num_key_value_heads"),
    "head_dim": ("head_dim",),
    "intermediate_size": _spellings("intermediate_size"),
    "vocab_size": _spellings("vocab_size"),
    "max_position_embeddings": _spellings("max_position_embeddings"),
    # attention
    "attention.kind": (),
    "attention.layer_pattern": (),
    "attention.full_layers": (),
    "attention.sliding_layers": (),
    "attention.chunked_layers": (),
    "attention.linear_attention_layers": (),
    "attention.ssm_layers": (),
    "attention.kv_cache_layers": (),
    "attention.layer_types": ("layer_types",),
    # position encoding
    "rope.type": _in_dicts(_ROPE_DICTS, "rope_type", "type"),
    "rope.factor": _in_dicts(_ROPE_DICTS, "factor"),
    "rope.theta": ("rope_theta", *_in_dicts(_ROPE_DICTS, "rope_theta")),
    "rope.partial_rotary_factor": (
        "partial_rotary_factor",
        *_in_dicts(_ROPE_DICTS, "partial_rotary_factor"),
    ),
    "rope.local_theta": ("rope_local_base_freq",),
    # experts
    "moe.num_experts": EXPERT_COUNT_KEYS,
    "moe.experts_per_token": TOP_K_KEYS,
    "moe.num_shared_experts": SHARED_COUNT_KEYS,
    "moe.moe_layers": (),
    "moe.dense_layers": (),
    "moe.dense_layer_indices": (),
    "moe.expert_intermediate_size": ("moe_intermediate_size", *_spellings("intermediate_size")),
    "moe.shared_expert_intermediate_size": ("shared_expert_intermediate_size",),
    "moe.dense_intermediate_size": (
        "dense_intermediate_size",
        "intermediate_size_mlp",
        *_spellings("intermediate_size"),
    ),
    "moe.scoring": ("scoring_func",),
    # quantization
    "quantization.method": _in_dicts(_QUANT_DICTS, "quant_method"),
    "quantization.format": _in_dicts(_QUANT_DICTS, "fmt", "format", "bnb_4bit_quant_type"),
    "quantization.bits": _in_dicts(_QUANT_DICTS, "bits", "w_bit"),
    "quantization.group_size": _in_dicts(_QUANT_DICTS, "group_size", "q_group_size"),
    "quantization.modules_not_converted": _in_dicts(
        _QUANT_DICTS, "modules_to_not_convert", "modules_not_converted", "ignore"
    ),
    "quantization.quantized_params": (),
    "quantization.unquantized_params": (),
    "quantization.scale_bytes": (),
    "quantization.scale_format": (),
    # size and memory: all computed, except the checkpoint size (see FIGURE_SOURCES)
    "total_params": (),
    "active_params": (),
    "extra_params": (),
    "embedding_params": (),
    "weight_bytes": (),
    "weight_bytes_by_dtype": (),
    "kv_cache_bytes_per_token": (),
    "kv_cache_bytes_at_max_context": (),
    "kv_cache_bytes_at_max_context_kept": (),
    "params_source": (),
    "assumptions": (),
}
# Figures whose source is neither the config nor the engine's arithmetic.
FIGURE_SOURCES: Mapping[str, str] = {"checkpoint_total_size_bytes": FROM_INDEX}
# Figures the checkpoint's headers give when the fetch stage read them (the analysis's
# `params_counted_from` is "checkpoint").
HEADER_FIGURES = frozenset(
    {
        "total_params",
        "active_params",
        "extra_params",
        "embedding_params",
        "weight_bytes",
        "weight_bytes_by_dtype",
    }
)

_DEFAULT_PREFIXES: Mapping[str, tuple[str, ...]] = {
    "attention": ("",),
    "moe": ("",),
    "rope": tuple(f"{name}." for name in _ROPE_DICTS),
    "quantization": tuple(f"{name}." for name in _QUANT_DICTS),
}


def figure_config_keys(figure: str) -> tuple[str, ...]:
    """The config paths `figure` may be read from (see `FIGURE_CONFIG_KEYS`)."""
    if figure in FIGURE_CONFIG_KEYS:
        return FIGURE_CONFIG_KEYS[figure]
    section, _, key = figure.rpartition(".")
    if not section:
        return (figure,)
    return tuple(prefix + key for prefix in _DEFAULT_PREFIXES.get(section, ()))


_ABSENT = object()


def _dig(config: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path ("rope_scaling.factor", "architectures.0"), or _ABSENT."""
    value: Any = config
    for part in path.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _ABSENT
    return value


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values: 10000 and 10000.0 are the same, True and 1 are not."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@dataclass(frozen=True)
class FigureSources:
    """Says where each figure comes from, against the config the analysis read.

    A multimodal config is searched in its `text_config` first (the text model the engine
    analyses), then at its top level (quantization, dtype and architectures live there).
    """

    scopes: tuple[Mapping[str, Any], ...]
    from_headers: bool = False

    @classmethod
    def of_config(cls, config: Any, *, from_headers: bool = False) -> FigureSources:
        """Sources against `config`; `from_headers`: the counts (`HEADER_FIGURES`) are the
        checkpoint's headers'."""
        if not isinstance(config, Mapping):
            return cls(scopes=(), from_headers=from_headers)
        text = config.get("text_config")
        scopes = (text, config) if isinstance(text, Mapping) else (config,)
        return cls(scopes=scopes, from_headers=from_headers)

    def source(self, figure: str, value: Any) -> str:
        """`READ_FROM_CONFIG` when the config holds one of the figure's keys with `value`, the
        fixed source of an index figure, `FROM_HEADERS` for a count the headers gave, else
        `COMPUTED`."""
        if figure in FIGURE_SOURCES:
            return FIGURE_SOURCES[figure]
        if self.from_headers and figure in HEADER_FIGURES:
            return FROM_HEADERS
        for path in figure_config_keys(figure):
            for scope in self.scopes:
                found = _dig(scope, path)
                if found is not _ABSENT and found is not None and _same(found, value):
                    return READ_FROM_CONFIG
        return COMPUTED

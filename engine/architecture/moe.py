"""Mixture-of-experts layout and the feed-forward parameters of each decoder layer."""

from __future__ import annotations

from dataclasses import dataclass
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
class MoeLayout:
    """Routed/shared experts and which layers are MoE.

    `expert_intermediate_size`: FFN width of one routed expert. Shared experts: either
    `num_shared_experts` experts of the routed width (DeepSeek `n_shared_experts`, fused into one
    MLP of width n x moe_intermediate_size) or one of `shared_expert_intermediate_size` (Qwen2-MoE,
    with a sigmoid `shared_expert_gate`).
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary; layer lists are indices, sizes are FFN widths in elements."""
        return {
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


def _first_int(
    cfg: ModelConfig, keys: tuple[str, ...], minimum: int
) -> tuple[int | None, str | None]:
    for key in keys:
        value = cfg.view.value(key)
        if value is not None:
            return check_int(key, value, minimum=minimum), key
    return None, None


def moe_layout(cfg: ModelConfig) -> tuple[MoeLayout | None, list[str]]:
    """The MoE layout of `cfg`, or None for a dense model; with notes.

    Which layers are MoE follows each family's modeling code: DeepSeek
    (`first_k_dense_replace`, `moe_layer_freq`: modeling_deepseek.py), Qwen-MoE
    (`decoder_sparse_step`, `mlp_only_layers`), Llama 4 (`moe_layers` /
    `interleave_moe_layer_step`), Jamba (`expert_layer_period`/`offset`), Ernie 4.5
    (`moe_layer_start_index`/`end_index`/`interval`); otherwise every layer.
    """
    notes: list[str] = []
    view = cfg.view
    fam = cfg.family.name if cfg.family else None
    experts, experts_key = _first_int(cfg, EXPERT_COUNT_KEYS, minimum=0)
    if not experts:
        return None, notes
    top_k, top_k_key = _first_int(cfg, TOP_K_KEYS, minimum=1)
    if top_k is None:
        raise AnalysisError(
            f"{experts_key} = {experts} but no experts-per-token key ({', '.join(TOP_K_KEYS)})"
        )
    if top_k > experts:
        raise AnalysisError(f"{top_k_key} ({top_k}) exceeds the number of experts ({experts})")
    for key in TOP_K_KEYS:
        other = view.raw.get(key)
        if key != top_k_key and other is not None and other != top_k:
            notes.append(f"{key} = {other} disagrees with {top_k_key} = {top_k}: {top_k_key} used")

    n = cfg.num_layers
    dense_width = cfg.intermediate_size
    mlp_types = view.raw.get("mlp_layer_types")
    if mlp_types is not None:
        # DeepSeek-V3.2, GLM-4.7-Flash, Kimi Linear, EXAONE-MoE: "dense"/"sparse" per layer.
        if not isinstance(mlp_types, list) or len(mlp_types) != n:
            raise AnalysisError(f"mlp_layer_types must list one entry per layer ({n})")
        if set(mlp_types) - {"dense", "sparse"}:
            raise AnalysisError(f"mlp_layer_types entries must be 'dense' or 'sparse': {mlp_types}")
        is_moe = [t == "sparse" for t in mlp_types]
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
    moe_layers = tuple(i for i in range(n) if is_moe[i])
    dense_layers = tuple(i for i in range(n) if not is_moe[i])

    expert_width = view.int("moe_intermediate_size", None)
    if expert_width is None:
        # Mixtral, gpt-oss, Llama 4, Jamba: the expert FFN width is intermediate_size.
        expert_width = cfg.intermediate_size
    if expert_width is None:
        raise AnalysisError("MoE config has neither moe_intermediate_size nor intermediate_size")
    if dense_layers and dense_width is None:
        raise AnalysisError("dense layers need intermediate_size, which is missing")

    shared_count = 0
    for key in SHARED_COUNT_KEYS:
        if view.value(key) is not None:
            shared_count = view.int(key, 0, minimum=0) or 0
            break
    shared_width: int | None = None
    shared_gate = False
    always_shared = cfg.family.always_shared_expert if cfg.family else None
    if always_shared == "intermediate_size":
        # Hunyuan: one shared MLP of intermediate_size, whatever num_shared_expert says.
        shared_count, shared_width = 1, cfg.intermediate_size
    elif shared_count:
        shared_width = shared_count * expert_width
    elif view.value("shared_expert_intermediate_size"):
        shared_count, shared_gate = 1, True
        shared_width = view.int("shared_expert_intermediate_size")
    elif always_shared == "expert":
        # Llama 4 always adds one shared expert of the routed width (modeling_llama4.py).
        shared_count, shared_width = 1, expert_width

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
            num_experts=experts,
            experts_per_token=top_k,
            num_shared_experts=shared_count,
            shared_expert_intermediate_size=shared_width,
            shared_expert_gate=shared_gate,
            expert_intermediate_size=expert_width,
            moe_layers=moe_layers,
            dense_layers=dense_layers,
            dense_intermediate_size=dense_width if dense_layers else None,
            scoring=scoring,
            topk_method=view.value("topk_method"),
            n_group=n_group,
            topk_group=topk_group,
            norm_topk_prob=norm_topk if isinstance(norm_topk, bool) else None,
            routed_scaling_factor=float(scale) if isinstance(scale, int | float) else None,
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
    """Router, routed experts and shared experts of the MoE `layers`.

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
        moe.num_experts,
        moe.experts_per_token,
        moe.expert_intermediate_size,
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
    if moe.num_shared_experts and moe.shared_expert_intermediate_size:
        sw = moe.shared_expert_intermediate_size
        sp = mlp + (fam.shared_expert_name if fam else "shared_experts") + "."
        # Shared experts carry biases only where one flag biases every MLP (Ernie use_bias).
        sb = bool(fam and fam.bias_key and cfg.mlp_bias)
        groups += linear(sp + "gate_proj", sw, h, SHARED_EXPERT, layers, bias=sb, mtp=mtp)
        groups += linear(sp + "up_proj", sw, h, SHARED_EXPERT, layers, bias=sb, mtp=mtp)
        groups += linear(sp + "down_proj", h, sw, SHARED_EXPERT, layers, bias=sb, mtp=mtp)
        if moe.shared_expert_gate:
            groups += linear(mlp + "shared_expert_gate", 1, h, ROUTER, layers, mtp=mtp)
    return groups

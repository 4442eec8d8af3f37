"""Which model feature an operator served: RoPE type, MoE routing and experts, MLA projections,
sliding-window masks, attention sinks, norms.

The `operators` stage records, for every dispatched operator, the module that was running
(`ModuleTracker`, forward pre/post hooks); `features_of` turns those module names into the
features they implement, in the field's words, so a missing operator reads as a limitation of a
feature ("yarn RoPE needs aten::X, missing on pool P").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

MLA_MODULES = frozenset(
    {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "q_a_layernorm", "kv_a_layernorm"}
)

# Features in the order a note names them: the specific (what a release adds) before the
# generic (what every transformer has).
FEATURE_PRIORITY = (
    "attention sinks",
    "MLA projections",
    "MoE routing",
    "MoE experts",
    "shared experts",
    "RoPE",
    "sliding-window",
    "QK norm",
    "attention",
    "MLP",
    "norm",
    "LM head",
    "token embedding",
    "masks and positions",
)


class ModuleTracker:
    """Keeps the qualified name of the innermost module running (forward hooks)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.stack: list[str] = [""]
        self.handles = []
        for name, module in model.named_modules():
            self.handles.append(module.register_forward_pre_hook(self._push(name)))
            self.handles.append(module.register_forward_hook(self._pop, always_call=True))

    def _push(self, name: str):
        def hook(_module: Any, _args: Any) -> None:
            self.stack.append(name)

        return hook

    def _pop(self, _module: Any, _args: Any, _out: Any) -> None:
        if len(self.stack) > 1:
            self.stack.pop()

    @property
    def inside_model(self) -> bool:
        return len(self.stack) > 1

    @property
    def current(self) -> str:
        return self.stack[-1]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def feature_for_module(name: str, model: torch.nn.Module, analysis: Mapping[str, Any]) -> str:
    """The model feature a module implements, in the field's words.

    From the module's qualified name and class and the release's analysis (RoPE type,
    attention kind, MoE scoring and grouped top-k, layer types). A module with no feature of
    its own (a q_proj, an activation) takes its parent's; the top-level model's own operators
    build the masks and positions.
    """
    while name:
        feature = _own_feature(name, model, analysis)
        if feature is not None:
            return feature
        name = name.rsplit(".", 1)[0] if "." in name else ""
    attn = analysis.get("attention") or {}
    sliding = attn.get("sliding_layers") or attn.get("chunked_layers")
    return (
        "masks and positions (causal and sliding-window masks)"
        if sliding
        else "masks and positions"
    )


def _own_feature(name: str, model: torch.nn.Module, analysis: Mapping[str, Any]) -> str | None:
    rope = analysis.get("rope") or {}
    attn = analysis.get("attention") or {}
    moe = analysis.get("moe") or None
    parts = name.split(".")
    leaf = parts[-1]
    try:
        module = model.get_submodule(name)
    except AttributeError:
        return None
    cls = type(module).__name__
    layer = next((int(p) for p in parts if p.isdigit()), None)
    types = attn.get("layer_types") or []
    layer_type = types[layer] if layer is not None and layer < len(types) else None
    if leaf == "rotary_emb" or "Rotary" in cls:
        kind = rope.get("type") or "default"
        return "RoPE" if kind == "default" else f"{kind} RoPE"
    if leaf in MLA_MODULES:
        return "MLA projections"
    if leaf in ("q_norm", "k_norm"):
        return "QK norm"
    if leaf == "embed_tokens":
        return "token embedding"
    if leaf == "lm_head":
        return "LM head"
    if leaf == "experts":
        return "MoE experts (grouped GEMM)"
    if leaf in ("shared_experts", "shared_expert", "shared_expert_gate"):
        return "shared experts"
    if moe and leaf in ("gate", "router") and "mlp" in parts:
        grouped = ", grouped top-k" if (moe.get("n_group") or 1) > 1 else ""
        method = f", {moe['topk_method']}" if moe.get("topk_method") else ""
        return (
            f"MoE routing ({moe['scoring']} scores, "
            f"top-{moe['experts_per_token']}{grouped}{method})"
        )
    if leaf == "self_attn" or "Attention" in cls:
        desc = "MLA attention" if attn.get("kind") == "MLA" else f"attention ({attn.get('kind')})"
        if hasattr(module, "sinks"):
            desc = f"{desc} with attention sinks"
        if layer_type == "sliding_attention":
            desc = f"sliding-window {desc}"
        return desc
    if leaf == "mlp" or "MLP" in cls or "Moe" in cls or "MoE" in cls:
        if moe and hasattr(module, "experts"):
            return "MoE layer (combine)"
        return f"MLP ({analysis.get('hidden_act') or 'gated'})"
    if "norm" in leaf.lower() or "Norm" in cls:
        return "norm (RMSNorm)" if "RMS" in cls else f"norm ({cls})"
    return None


def _priority(feature: str) -> int:
    for i, key in enumerate(FEATURE_PRIORITY):
        if key in feature:
            return i
    return len(FEATURE_PRIORITY)


def features_of(
    modules: set[str], model: torch.nn.Module, analysis: Mapping[str, Any]
) -> str | None:
    """The features an operator served, most specific first, joined with ", "."""
    found = {feature_for_module(m, model, analysis) for m in modules}
    if not found:
        return None
    return ", ".join(sorted(found, key=lambda f: (_priority(f), f)))

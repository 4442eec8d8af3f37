"""What a tensor-parallel plan actually splits, from the parameter names each rank holds only
a part of (`rank.sharded_parameters`) and the decoder's hook points.

transformers' plans differ by architecture: Llama's splits attention and MLP, DeepSeek-V3's
only the MLPs and experts (MLA attention stays whole on every rank), gpt-oss's only the
embedding and the LM head. A "split" that leaves every decoder layer whole validates nothing,
so the stage says so instead of reporting a pass. Torch-free.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any


def decoder_prefix(points: Sequence[Sequence[Any]]) -> str:
    """The decoder layers' module path ("model.layers") from hook points [name, layer, kind]."""
    for name, _layer, kind in points:
        if kind == "output":
            return name.rsplit(".", 1)[0]
    return ""


def plan_touches_decoder(rules: Iterable[str], prefix: str) -> bool:
    """Whether any rule of a tp_plan/ep_plan ("model.layers.*.mlp.up_proj") names a module or
    weight inside the decoder layers at `prefix`."""
    pattern = re.compile(re.escape(prefix) + r"\.(\*|\d+)\.")
    return bool(prefix) and any(pattern.match(rule) for rule in rules)


def split_blocks(sharded: Iterable[str], points: Sequence[Sequence[Any]]) -> dict[str, bool]:
    """{block kind ("attention", "mlp", "moe", ...): whether any of its weights is split in
    any layer}, for the kinds of the decoder's hook points (outputs and norms left out)."""
    names = list(sharded)
    out: dict[str, bool] = {}
    for name, _layer, kind in points:
        if kind in ("output", "norm"):
            continue
        hit = any(param.startswith(name + ".") for param in names)
        out[kind] = out.get(kind, False) or hit
    return out


def outside_decoder(sharded: Iterable[str], prefix: str) -> list[str]:
    """The split weights outside the decoder layers ("lm_head.weight", ...)."""
    return [name for name in sharded if not name.startswith(prefix + ".")]

"""The plan panel's tables as values: the predicted scaling curve, the runners-up, the
communication per generated token, the deployment artifacts, and when a planned job can start
on its pool."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from adaptation.presenters.plan_figures import Split
from engine.formatting import finite
from engine.stored import as_count


@dataclass(frozen=True)
class ScalingRow:
    """One device count of the predicted scaling curve: its best split, the decode tokens/s
    in all and per device, the efficiency per device against the first count, whether the
    pool has that many devices, and whether the efficiency (to two decimals) is above 1."""

    devices: int
    nodes: Any
    split: Split
    tokens_per_s: float | None
    tokens_per_s_per_device: float | None
    efficiency: float | None
    within_pool: bool
    above_one: bool


def scaling_rows(points: Iterable[Mapping[str, Any]]) -> list[ScalingRow]:
    rows = []
    for point in points:
        if not point.get("devices"):
            continue
        efficiency = finite(point.get("efficiency_per_device"))
        rows.append(
            ScalingRow(
                devices=point["devices"],
                nodes=as_count(point.get("nodes")),
                split=Split.of(point),
                tokens_per_s=finite(point.get("decode_tokens_per_s")),
                tokens_per_s_per_device=finite(point.get("decode_tokens_per_s_per_device")),
                efficiency=efficiency,
                within_pool=bool(point.get("within_pool", True)),
                above_one=efficiency is not None and round(efficiency, 2) > 1,
            )
        )
    return rows


@dataclass(frozen=True)
class RunnerUp:
    """A split the planner did not choose, with its predicted memory per device and decode
    tokens/s at its largest batch, and why it lost (the planner's words)."""

    split: Split
    devices: Any
    fits: bool
    memory_bytes: float | None
    tokens_per_s: float | None
    why_lost: str


@dataclass(frozen=True)
class CommRow:
    """One collective per generated token of the chosen split: `kind` ("tp": all-reduce,
    "ep": all-to-all, "pp": point-to-point), bytes per token per device, whether it crosses
    nodes, and whether the split uses it at all."""

    kind: str
    bytes_per_token: float | None
    crosses_nodes: bool
    used: bool


@dataclass(frozen=True)
class Communication:
    """The chosen split's communication per generated token."""

    rows: list[CommRow]
    crosses_nodes: bool
    collectives_per_step: Any
    formula: str


def communication(comm: Mapping[str, Any]) -> Communication | None:
    if not comm:
        return None
    rows = [
        CommRow(
            kind=kind,
            bytes_per_token=finite(comm.get(f"{key}_bytes_per_token")),
            crosses_nodes=bool(comm.get(f"{kind}_crosses_nodes")),
            used=bool(finite(comm.get(f"{key}_bytes_per_token"))),
        )
        for kind, key in (("tp", "tp_allreduce"), ("ep", "ep_alltoall"), ("pp", "pp_p2p"))
    ]
    return Communication(
        rows=rows,
        crosses_nodes=bool(comm.get("crosses_nodes")),
        collectives_per_step=comm.get("collectives_per_step"),
        formula=str(comm.get("formula") or ""),
    )


@dataclass(frozen=True)
class Artifact:
    """A deployment artifact to copy (`kind`: "vllm", "sglang", "kubernetes_deployment") and
    the id of the element that holds its text."""

    kind: str
    text: str
    element_id: str


ARTIFACT_KINDS = ("vllm", "sglang", "kubernetes_deployment")

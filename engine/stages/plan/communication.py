"""Communication per token of a split, and its time on the pool's links.

Volumes are bytes per generated token (bf16 activations, 2 bytes per element):

- TP all-reduce: two per decoder layer (after attention and after the MLP; Megatron-LM,
  Shoeybi et al. 2019, §3), each of `hidden` elements. A ring all-reduce moves
  2 (TP - 1) / TP of the buffer through every rank's link (Patarasuk & Yuan 2009; NCCL
  docs "Collective operations"), so the time is that many bytes over the group's link.
- EP all-to-all: per MoE layer a token goes to `experts_per_token` experts and comes back
  (dispatch + combine, DeepSeek-V3 report §3.2 / DeepEP): 2 x k x hidden elements, of which
  (EP - 1) / EP leave the device on average under uniform routing.
- PP point-to-point: `hidden` elements per stage boundary (PP - 1 boundaries).

A group crosses nodes when it is larger than a node (or, for PP, when the split is): its
bandwidth is then the inter-node figure. Each collective also pays a fixed latency
`COLLECTIVE_LATENCY_S` (an assumption of the order NCCL small-message all-reduces take).
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import BF16_BYTES, ModelShape
from .validity import Split

COLLECTIVE_LATENCY_S = 10e-6  # seconds per collective call (assumption)


@dataclass(frozen=True)
class Links:
    """Per-direction bandwidths of the pool (bytes/s); None where unknown."""

    devices_per_node: int
    intra_node_bytes_per_s: float | None
    inter_node_bytes_per_s: float | None

    def bandwidth(self, group_size: int) -> float | None:
        """The bottleneck link of a group of `group_size` consecutive devices (bytes/s)."""
        if group_size <= self.devices_per_node:
            return self.intra_node_bytes_per_s
        return self.inter_node_bytes_per_s


@dataclass(frozen=True)
class Communication:
    """Per-token volumes (bytes/token), node crossings, and the time per decode step."""

    tp_allreduce_bytes_per_token: float
    ep_alltoall_bytes_per_token: float
    pp_p2p_bytes_per_token: float
    tp_crosses_nodes: bool
    ep_crosses_nodes: bool
    pp_crosses_nodes: bool
    collectives_per_step: int
    tp_group_bytes_per_s: float | None
    ep_group_bytes_per_s: float | None
    pp_link_bytes_per_s: float | None

    @property
    def crosses_nodes(self) -> bool:
        return self.tp_crosses_nodes or self.ep_crosses_nodes or self.pp_crosses_nodes

    def step_time_s(self, tokens: int) -> float | None:
        """Seconds of communication in one forward step over `tokens` tokens (per replica).

        t = sum over kinds of (bytes/token x tokens / link bytes/s) + collectives x latency.
        None when a needed link bandwidth is unknown.
        """
        total = self.collectives_per_step * COLLECTIVE_LATENCY_S
        for volume, bandwidth in (
            (self.tp_allreduce_bytes_per_token, self.tp_group_bytes_per_s),
            (self.ep_alltoall_bytes_per_token, self.ep_group_bytes_per_s),
            (self.pp_p2p_bytes_per_token, self.pp_link_bytes_per_s),
        ):
            if volume == 0:
                continue
            if bandwidth is None:
                return None
            total += volume * tokens / bandwidth
        return total

    def to_dict(self) -> dict:
        return {
            "tp_allreduce_bytes_per_token": round(self.tp_allreduce_bytes_per_token),
            "ep_alltoall_bytes_per_token": round(self.ep_alltoall_bytes_per_token),
            "pp_p2p_bytes_per_token": round(self.pp_p2p_bytes_per_token),
            "crosses_nodes": self.crosses_nodes,
            "tp_crosses_nodes": self.tp_crosses_nodes,
            "ep_crosses_nodes": self.ep_crosses_nodes,
            "pp_crosses_nodes": self.pp_crosses_nodes,
            "collectives_per_step": self.collectives_per_step,
            "formula": (
                "TP: 2 all-reduces/layer x hidden x 2 B x 2(TP-1)/TP; EP: MoE layers x "
                "2 x experts_per_token x hidden x 2 B x (EP-1)/EP; PP: (PP-1) x hidden x 2 B"
            ),
        }


def communication(shape: ModelShape, split: Split, links: Links) -> Communication:
    """Per-token communication of `split` on `links` (see the module docstring).

    Volumes count what one device sends for the layers it holds: TP over the ceil(L/PP)
    layers of a stage (stages run one after another, so every stage's all-reduces add up
    to the whole model's L layers per token), EP over the MoE layers, PP per boundary.
    """
    tp, pp = split.tp, split.pp
    h_bytes = shape.hidden_size * BF16_BYTES
    tp_bytes = 0.0
    collectives = 0
    if tp > 1:
        tp_bytes = 2 * shape.num_layers * h_bytes * 2 * (tp - 1) / tp
        collectives += 2 * shape.num_layers
    ep_bytes = 0.0
    if shape.is_moe and split.ep > 1:
        ep = split.ep
        ep_bytes = shape.moe_layers * 2 * shape.experts_per_token * h_bytes * (ep - 1) / ep
        collectives += 2 * shape.moe_layers
    pp_bytes = float((pp - 1) * h_bytes)
    collectives += pp - 1
    devices_per_node = links.devices_per_node
    ep_group = split.ep if split.ep > 1 else 1
    return Communication(
        tp_allreduce_bytes_per_token=tp_bytes,
        ep_alltoall_bytes_per_token=ep_bytes,
        pp_p2p_bytes_per_token=pp_bytes,
        tp_crosses_nodes=tp > devices_per_node,
        ep_crosses_nodes=ep_group > devices_per_node,
        pp_crosses_nodes=pp > 1 and split.devices > devices_per_node,
        collectives_per_step=collectives,
        tp_group_bytes_per_s=links.bandwidth(tp),
        ep_group_bytes_per_s=links.bandwidth(ep_group),
        pp_link_bytes_per_s=links.bandwidth(split.devices),
    )

"""What the planner searches over: a pool's layout (`PoolLayout`) and one split sized and
predicted on it (`Candidate`)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.catalog import Accelerator

from .communication import Communication, Links
from .errors import PlanInputError
from .memory import MemoryPerDevice
from .predictor import FullSizePredictor
from .validity import Split, Validity

MAX_NODES = 100_000
MAX_DEVICES_PER_NODE = 1_024
SEARCH_LIMIT_DEVICES = 65_536  # how far the planner's "more devices would fit" looks


@dataclass(frozen=True)
class PoolLayout:
    """An accelerator pool: `accelerator` is a catalog kind; bandwidths in bytes/s per
    direction (None: the catalog's default for the kind)."""

    accelerator: str
    devices_per_node: int
    nodes: int = 1
    intra_node_bandwidth_bytes_per_s: float | None = None
    inter_node_bandwidth_bytes_per_s: float | None = None

    @property
    def devices(self) -> int:
        return self.devices_per_node * self.nodes

    def links(self, accelerator: Accelerator) -> Links:
        """The pool's links: its own bandwidths where set, else the catalog's for the kind."""
        return Links(
            devices_per_node=self.devices_per_node,
            intra_node_bytes_per_s=self.intra_node_bandwidth_bytes_per_s
            or accelerator.intra_node_bandwidth_bytes_per_s,
            inter_node_bytes_per_s=self.inter_node_bandwidth_bytes_per_s
            or accelerator.inter_node_bandwidth_bytes_per_s,
        )

    def check(self) -> None:
        """Raise `PlanInputError` for a pool with no devices or absurd sizes."""
        for name, value, limit in (
            ("devices_per_node", self.devices_per_node, MAX_DEVICES_PER_NODE),
            ("nodes", self.nodes, MAX_NODES),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanInputError(f"pool {name} must be a positive integer, got {value!r}")
            if value > limit:
                raise PlanInputError(f"pool {name} = {value} is implausibly large (limit {limit})")
        for name in ("intra_node_bandwidth_bytes_per_s", "inter_node_bandwidth_bytes_per_s"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not value > 0):
                raise PlanInputError(f"pool {name} must be positive, got {value!r}")


@dataclass(frozen=True)
class Candidate:
    """One split, checked, sized and (when it fits) predicted."""

    split: Split
    validity: Validity
    memory: MemoryPerDevice | None
    predictor: FullSizePredictor | None
    comm: Communication | None

    @property
    def fits(self) -> bool:
        return self.validity.valid and self.memory is not None and self.memory.fits

    @property
    def decode_tokens_per_s(self) -> float | None:
        return self.predictor.best_decode_tokens_per_s() if self.predictor else None

    def sort_key(self) -> tuple:
        tput = self.decode_tokens_per_s
        used = self.memory.used if self.memory else float("inf")
        return (-(tput or 0.0), used, self.split.pp, self.split.tp)

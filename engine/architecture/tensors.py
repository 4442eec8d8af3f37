"""The tensor inventory: every parameter tensor of the checkpoint, grouped across layers."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

# Roles of tensors; quantization methods and the active-parameter count select by role.
EMBEDDING = "embedding"
LM_HEAD = "lm_head"
ATTENTION = "attention"
NORM = "norm"
DENSE_MLP = "dense_mlp"
ROUTED_EXPERT = "routed_expert"
SHARED_EXPERT = "shared_expert"
ROUTER = "router"
LINEAR_MIXER = "linear_mixer"
MTP_PROJ = "mtp_proj"
# Roles only transformers' meta-device builds produce (meta_build.py): input embedding tables
# other than the main one (Gemma 3n/4 per-layer inputs), multimodal towers and projectors
# (outside `total_params`), and parameters no other role describes (DeepSeek-V4
# hyper-connections).
PER_LAYER_EMBEDDING = "per_layer_embedding"
TOWER = "multimodal_tower"
OTHER = "other"


@dataclass(frozen=True)
class TensorGroup:
    """One parameter tensor repeated over a set of layers (and experts).

    `module` is the checkpoint module path with `{layer}` (and `{expert}`) placeholders, e.g.
    `model.layers.{layer}.self_attn.q_proj`. `shape` is one instance's shape; for Linear weights
    it is `(out_features, in_features)`, the orientation quantization blocks and groups follow.
    `experts` instances per layer (routed experts), `active_experts` of them used per token.
    `linear`: a matmul weight that weight quantization may convert. `buffer`: stored in the
    checkpoint but a buffer, not a parameter, in transformers (DeepSeek's
    `e_score_correction_bias`). `mtp`: part of a multi-token-prediction module, outside the
    main model. `dtype`: stored dtype when it is not the model's (safetensors name).
    """

    module: str
    param: str
    shape: tuple[int, ...]
    role: str
    layers: tuple[int, ...] = ()
    experts: int = 1
    active_experts: int = 1
    linear: bool = False
    buffer: bool = False
    mtp: bool = False
    dtype: str | None = None

    @property
    def numel_each(self) -> int:
        """Elements of one instance (one layer, one expert)."""
        return prod(self.shape)

    @property
    def instances(self) -> int:
        """Instances over all layers and experts."""
        return max(1, len(self.layers)) * self.experts

    @property
    def numel(self) -> int:
        """Elements over all layers and experts (params)."""
        return self.numel_each * self.instances

    @property
    def active_numel(self) -> int:
        """Elements a token runs through: only `active_experts` of the routed experts (params)."""
        return self.numel_each * max(1, len(self.layers)) * self.active_experts


def linear(
    module: str,
    out_features: int,
    in_features: int,
    role: str,
    layers: tuple[int, ...] = (),
    *,
    bias: bool = False,
    experts: int = 1,
    active_experts: int = 1,
    mtp: bool = False,
) -> list[TensorGroup]:
    """The weight (and bias) of an `nn.Linear(in_features, out_features)`."""
    groups = [
        TensorGroup(
            module,
            "weight",
            (out_features, in_features),
            role,
            layers,
            experts,
            active_experts,
            linear=True,
            mtp=mtp,
        )
    ]
    if bias:
        groups.append(
            TensorGroup(
                module, "bias", (out_features,), role, layers, experts, active_experts, mtp=mtp
            )
        )
    return groups


def vector(
    module: str,
    size: int,
    role: str,
    layers: tuple[int, ...] = (),
    *,
    param: str = "weight",
    mtp: bool = False,
) -> TensorGroup:
    """A 1-D parameter: a norm weight, a bias, attention sinks."""
    return TensorGroup(module, param, (size,), role, layers, mtp=mtp)

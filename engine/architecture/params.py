"""The full tensor inventory of a checkpoint and the parameter counts drawn from it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .attention import FULL, LINEAR, MAMBA, AttentionLayout, attention_tensors
from .config_reader import ModelConfig
from .layer_kinds import guessed_indexer_tensors
from .linear_mixers import linear_mixer_tensors, mamba_tensors
from .meta_build import MetaBuild, MetaBuildError, meta_build, transformers_knows
from .moe import MoeLayout, dense_mlp_tensors, moe_tensors
from .tensors import (
    EMBEDDING,
    LM_HEAD,
    MTP_PROJ,
    NORM,
    PER_LAYER_EMBEDDING,
    TOWER,
    TensorGroup,
    linear,
    vector,
)

# Hidden-size norms of a decoder layer, in the order families add them (Gemma 2/3 use all four).
_LAYER_NORM_NAMES = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts (params), all from the same inventory.

    `total`: parameters of the main model as transformers instantiates it (buffers and MTP
    modules excluded). `active`: per token, excluding the input embedding table. `extra`:
    parameters stored in the checkpoint outside the main model (MTP modules, including their
    stored copies of the embedding and LM head). `buffers`: stored tensors that are buffers in
    transformers (router score-correction bias). `embedding`: the input embedding tables (the
    main one and any per-layer ones). `towers`: multimodal towers and projectors, outside
    `total`. `by_group`: `total` split by tensor role (embedding, attention, dense_mlp,
    routed_expert, ...), towers under "multimodal_tower".
    """

    total: int
    active: int
    extra: int
    buffers: int
    embedding: int
    towers: int = 0
    by_group: dict[str, int] = field(default_factory=dict)


def _layer_tensors(
    cfg: ModelConfig,
    layout: AttentionLayout,
    moe: MoeLayout | None,
    layers: tuple[int, ...],
    types: dict[int, str],
    *,
    mtp: bool = False,
) -> list[TensorGroup]:
    """Mixer, feed-forward and norms of the decoder `layers`."""
    fam = cfg.family
    attn_layers = tuple(i for i in layers if types[i] not in (LINEAR, MAMBA))
    groups = attention_tensors(cfg, layout, attn_layers, mtp=mtp)
    groups += guessed_indexer_tensors(cfg, layout.guesses, attn_layers)
    groups += linear_mixer_tensors(cfg, tuple(i for i in layers if types[i] == LINEAR))
    groups += mamba_tensors(cfg, tuple(i for i in layers if types[i] == MAMBA))
    if moe is None:
        assert cfg.intermediate_size is not None  # checked by the caller
        groups += _dense_mlps(cfg, layers, cfg.intermediate_size, mtp=mtp)
    else:
        moe_set = set(moe.moe_layers)
        sparse = tuple(i for i in layers if i in moe_set or i >= cfg.num_layers)
        dense = tuple(i for i in layers if i not in sparse)
        groups += moe_tensors(cfg, moe, sparse, mtp=mtp)
        if dense:
            assert moe.dense_intermediate_size is not None
            groups += _dense_mlps(cfg, dense, moe.dense_intermediate_size, mtp=mtp)
    norms = fam.norms_per_layer if fam is not None else 2
    names = fam.norm_names if fam is not None and fam.norm_names else _LAYER_NORM_NAMES[:norms]
    for name in names:
        groups.append(
            vector(f"model.layers.{{layer}}.{name}", cfg.hidden_size, NORM, layers, mtp=mtp)
        )
    return groups


def _dense_mlps(
    cfg: ModelConfig, layers: tuple[int, ...], width: int, *, mtp: bool
) -> list[TensorGroup]:
    """Dense MLPs of `layers`, each at its own width where the config lists
    `intermediate_size` per layer (else `width`; an MTP layer takes the last layer's)."""
    per_layer = cfg.intermediate_by_layer
    if per_layer is None or width != cfg.intermediate_size:
        return dense_mlp_tensors(cfg, layers, width, mtp=mtp)
    by_width: dict[int, list[int]] = {}
    for i in layers:
        by_width.setdefault(per_layer[min(i, len(per_layer) - 1)], []).append(i)
    groups: list[TensorGroup] = []
    for each, same in by_width.items():
        groups += dense_mlp_tensors(cfg, tuple(same), each, mtp=mtp)
    return groups


def _mtp_tensors(
    cfg: ModelConfig, layout: AttentionLayout, moe: MoeLayout | None, count: int
) -> list[TensorGroup]:
    """DeepSeek-V3 multi-token-prediction modules (DeepSeek-V3 report §2.2), as stored after
    the main layers: a full decoder layer, enorm/hnorm, eh_proj (hidden x 2*hidden) and
    shared_head.norm, plus copies of embed_tokens and shared_head.head where the family stores
    them (DeepSeek-V3, GLM-4.5)."""
    h, v = cfg.hidden_size, cfg.vocab_size
    layers = tuple(range(cfg.num_layers, cfg.num_layers + count))
    types = {i: FULL for i in layers}
    groups = _layer_tensors(cfg, layout, moe, layers, types, mtp=True)
    p = "model.layers.{layer}."
    groups += [
        vector(p + "enorm", h, NORM, layers, mtp=True),
        vector(p + "hnorm", h, NORM, layers, mtp=True),
        vector(p + "shared_head.norm", h, NORM, layers, mtp=True),
        *linear(p + "eh_proj", h, 2 * h, MTP_PROJ, layers, mtp=True),
    ]
    if cfg.family is not None and cfg.family.mtp_stores_embeddings:
        groups.append(
            TensorGroup(p + "embed_tokens", "weight", (v, h), EMBEDDING, layers, mtp=True)
        )
        groups += linear(p + "shared_head.head", v, h, LM_HEAD, layers, mtp=True)
    return groups


def _qwen3_next_mtp_tensors(
    cfg: ModelConfig, layout: AttentionLayout, moe: MoeLayout | None, count: int
) -> list[TensorGroup]:
    """Qwen3-Next MTP block as the published checkpoint stores it under `mtp.` and vLLM's
    `qwen3_next_mtp.py` (Qwen3NextMultiTokenPredictor) loads it: `pre_fc_norm_embedding` and
    `pre_fc_norm_hidden` RMSNorms, `fc` (hidden x 2*hidden, no bias), `count` full-attention
    decoder layers `mtp.layers.{i}` with the sparse-MoE block, and a final `mtp.norm`.
    Embedding and LM head are the main model's (vLLM loads `embed_tokens`/`lm_head` into the
    MTP module), so nothing vocab-sized is added. transformers ignores `mtp.*` on load.
    """
    h, n = cfg.hidden_size, cfg.num_layers
    # Built as layers n.. so the MoE/full-attention rules apply, then renamed to mtp.layers.i.
    built = tuple(range(n, n + count))
    groups = _layer_tensors(cfg, layout, moe, built, {i: FULL for i in built}, mtp=True)
    renamed = [
        replace(
            g,
            module=g.module.replace("model.layers.{layer}.", "mtp.layers.{layer}."),
            layers=tuple(i - n for i in g.layers),
        )
        for g in groups
    ]
    return [
        *renamed,
        vector("mtp.pre_fc_norm_embedding", h, NORM, mtp=True),
        vector("mtp.pre_fc_norm_hidden", h, NORM, mtp=True),
        *linear("mtp.fc", h, 2 * h, MTP_PROJ, mtp=True),
        vector("mtp.norm", h, NORM, mtp=True),
    ]


# Keys for the number of MTP modules: DeepSeek-V3/GLM-4.5 `num_nextn_predict_layers`,
# Qwen3-Next/Qwen3.5 `mtp_num_hidden_layers`, and `num_mtp_layers`.
MTP_COUNT_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers")


def mtp_layer_count(cfg: ModelConfig) -> int:
    """MTP modules in the checkpoint, from the first of `MTP_COUNT_KEYS` the config sets."""
    for key in MTP_COUNT_KEYS:
        if cfg.view.has(key):
            return cfg.view.int(key, 0, minimum=0) or 0
    return 0


def build_inventory(
    cfg: ModelConfig, layout: AttentionLayout, moe: MoeLayout | None
) -> list[TensorGroup]:
    """Every tensor of the checkpoint: embedding, decoder layers, final norm, LM head, MTP."""
    h, v = cfg.hidden_size, cfg.vocab_size
    groups = [TensorGroup("model.embed_tokens", "weight", (v, h), EMBEDDING)]
    types = dict(enumerate(layout.layer_types))
    groups += _layer_tensors(cfg, layout, moe, tuple(range(cfg.num_layers)), types)
    if cfg.family is None or cfg.family.final_norm:
        groups.append(vector("model.norm", h, NORM))
    if not cfg.tie_word_embeddings:
        groups += linear("lm_head", v, h, LM_HEAD, bias=cfg.lm_head_bias)
    elif cfg.lm_head_bias:
        # Ernie 4.5 with use_bias: the weight is the tied embedding, the bias is its own.
        groups.append(vector("lm_head", v, LM_HEAD, param="bias"))
    mtp = mtp_layer_count(cfg)
    if mtp and cfg.family is not None and cfg.family.mtp_layout == "qwen3_next":
        groups += _qwen3_next_mtp_tensors(cfg, layout, moe, mtp)
    elif mtp:
        groups += _mtp_tensors(cfg, layout, moe, mtp)
    return groups


def count_params(cfg: ModelConfig, inventory: list[TensorGroup]) -> ParamCounts:
    """Totals over the inventory (see `ParamCounts`).

    Active parameters follow the convention of published "activated" figures (DeepSeek-V3,
    Qwen3, gpt-oss model cards): every non-expert parameter, `experts_per_token` routed experts
    per MoE layer, the LM head, not the input embedding tables. With tied embeddings the shared
    matrix is counted once, as the LM head it also is.
    """
    total = active = extra = buffers = embedding = towers = 0
    by_group: dict[str, int] = {}
    for g in inventory:
        if g.mtp:
            extra += g.numel
            continue
        if g.buffer:
            buffers += g.numel
            continue
        by_group[g.role] = by_group.get(g.role, 0) + g.numel
        if g.role == TOWER:
            towers += g.numel
            continue
        total += g.numel
        if g.role in (EMBEDDING, PER_LAYER_EMBEDDING):
            embedding += g.numel
            if cfg.tie_word_embeddings and g.role == EMBEDDING:
                active += g.numel
            continue
        active += g.active_numel
    return ParamCounts(
        total=total,
        active=active,
        extra=extra,
        buffers=buffers,
        embedding=embedding,
        towers=towers,
        by_group=dict(sorted(by_group.items())),
    )


def built_inventory(cfg: ModelConfig, moe: MoeLayout | None) -> tuple[list[TensorGroup], MetaBuild]:
    """The inventory of a model type only transformers knows, from its meta-device build
    (meta_build.py), plus the MTP modules the checkpoint stores beside it.

    transformers builds no MTP modules (it drops `mtp.*` on load), so `mtp_layer_count` of
    them are estimated DeepSeek-V3-style: a copy of the last decoder layer with enorm, hnorm,
    shared_head.norm and eh_proj (hidden x 2*hidden). A multimodal wrapper transformers cannot
    build (a vision tower needing an uninstalled library: Gemma 3n's timm) is retried as its
    text model alone (the config as transformers resolved it), noted in `cfg.view.notes`.
    Raises `MetaBuildError`.
    """
    assert cfg.build_config is not None and cfg.build_model_type is not None
    top_k = {i: s.experts_per_token for i, s in moe.by_layer.items()} if moe else {}
    scalar = cfg.view.value("num_experts_per_tok")
    default_top_k = scalar if isinstance(scalar, int) and not isinstance(scalar, bool) else None
    try:
        build = meta_build(cfg.build_config, cfg.build_model_type, top_k, default_top_k)
    except MetaBuildError as err:
        text_type = cfg.model_type
        if not text_type or text_type == cfg.build_model_type or not transformers_knows(text_type):
            raise
        build = meta_build(dict(cfg.view.raw), text_type, top_k, default_top_k)
        cfg.view.notes.append(
            f"the {cfg.build_model_type} wrapper could not be built ({err}): its text model "
            f"{text_type} was built alone, the towers are not counted"
        )
    groups = list(build.groups)
    count = mtp_layer_count(cfg)
    if count:
        groups += _estimated_mtp(cfg, groups, count)
    return groups, build


def _estimated_mtp(cfg: ModelConfig, groups: list[TensorGroup], count: int) -> list[TensorGroup]:
    """`count` MTP modules shaped like the last decoder layer of `groups`, DeepSeek-V3-style."""
    last = cfg.num_layers - 1
    layers = tuple(range(cfg.num_layers, cfg.num_layers + count))
    h = cfg.hidden_size
    copies = [
        replace(g, layers=layers, mtp=True)
        for g in groups
        if last in g.layers and not g.buffer and g.role != TOWER
    ]
    p = "model.layers.{layer}."
    return [
        *copies,
        vector(p + "enorm", h, NORM, layers, mtp=True),
        vector(p + "hnorm", h, NORM, layers, mtp=True),
        vector(p + "shared_head.norm", h, NORM, layers, mtp=True),
        *linear(p + "eh_proj", h, 2 * h, MTP_PROJ, layers, mtp=True),
    ]

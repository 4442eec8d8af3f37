"""Which TP x PP x EP x DP splits a serving engine accepts for a model.

The rules are the ones vLLM and SGLang enforce when they load a model:

- Tensor parallelism shards attention by heads: TP must divide the query heads, and divide
  the KV heads or be a multiple of them; past the KV-head count each KV head is replicated
  on TP / kv_heads ranks (vLLM `QKVParallelLinear`: "num_kv_heads ... replicated"), which
  costs memory that `memory.py` counts. MLA shards by query heads only: its latent KV cache
  is the same on every TP rank (DeepSeek-V2 paper §2.1; vLLM MLA backends).
- Every TP-sharded width must divide evenly (vLLM `divide()` asserts it): the dense FFN,
  the shared-expert FFN, the routed-expert FFN when experts are TP-sharded (EP off), and the
  vocabulary, which vLLM pads to a multiple of 64 (`DEFAULT_VOCAB_PADDING_SIZE`) before
  splitting it (`VocabParallelEmbedding`).
- A block-quantized FP8 checkpoint (weight_block_size [n, k]) keeps every TP shard of a
  blocked width a multiple of the block: vLLM `Fp8LinearMethod`/`validate_fp8_block_shape`
  raises "... is not divisible by weight quantization block_n/block_k" otherwise. So
  DeepSeek-V3 (dense FFN 18,432, expert FFN 2,048, 128x128 blocks) stops at TP 16.
- Expert parallelism follows vLLM's `--enable-expert-parallel`: the EP group is TP x DP and
  holds whole experts. EP that does not divide the routed experts is "uneven": the engine
  needs redundant experts (vLLM EPLB `num_redundant_experts`) to balance, and the plan says
  how many.
- Pipeline parallelism splits the decoder layers into PP stages (at least one layer each),
  the embedding on the first stage and the LM head on the last (vLLM `get_pp_indices`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .model import ModelShape

VOCAB_PADDING = 64  # vLLM DEFAULT_VOCAB_PADDING_SIZE


@dataclass(frozen=True)
class Split:
    """One parallel layout: devices = tp x pp x dp; `ep` is 1 (experts TP-sharded) or tp x dp
    (whole experts spread over the EP group)."""

    tp: int
    pp: int
    dp: int
    ep: int

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp

    def label(self) -> str:
        return f"TP{self.tp} PP{self.pp} EP{self.ep} DP{self.dp}"


@dataclass(frozen=True)
class Validity:
    """Whether a split loads; `reasons` say why not, `flags` what it costs if it does."""

    valid: bool
    reasons: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    kv_heads_per_rank: float = 0.0
    kv_replication: int = 1  # ranks holding a copy of each KV head
    redundant_experts: int = 0
    padded_vocab: int = 0
    details: dict = field(default_factory=dict)


def padded_vocab(vocab: int) -> int:
    """Vocabulary rows after vLLM's padding to a multiple of 64 (rows)."""
    return -(-vocab // VOCAB_PADDING) * VOCAB_PADDING


def sharded_widths(shape: ModelShape, split: Split) -> dict[str, int]:
    """Widths TP splits, by name (elements along the split dimension)."""
    widths: dict[str, int] = {}
    if shape.mla:
        m = shape.mla
        widths["q_b_proj (heads x qk_head_dim)"] = shape.num_attention_heads * (
            m["qk_nope_head_dim"] + m["qk_rope_head_dim"]
        )
        widths["kv_b_proj (heads x (qk_nope + v))"] = shape.num_attention_heads * (
            m["qk_nope_head_dim"] + m["v_head_dim"]
        )
        widths["o_proj input (heads x v_head_dim)"] = shape.num_attention_heads * m["v_head_dim"]
    else:
        widths["q_proj (heads x head_dim)"] = shape.num_attention_heads * shape.head_dim
        if split.tp <= shape.num_kv_heads:
            widths["k/v_proj (kv_heads x head_dim)"] = shape.num_kv_heads * shape.head_dim
    if shape.intermediate_size and (not shape.is_moe or shape.moe_layers < shape.num_layers):
        widths["dense FFN (intermediate_size)"] = shape.intermediate_size
    if shape.num_shared_experts:
        widths["shared-expert FFN"] = (
            shape.num_shared_experts * shape.shared_expert_intermediate_size
        )
    if shape.is_moe and split.ep == 1:
        widths["routed-expert FFN (moe_intermediate_size)"] = shape.expert_intermediate_size
    return widths


def check_split(shape: ModelShape, split: Split) -> Validity:
    """Check `split` against the engine rules in this module's docstring."""
    tp, pp = split.tp, split.pp
    reasons: list[str] = []
    flags: list[str] = []
    heads, kv = shape.num_attention_heads, shape.num_kv_heads
    if heads % tp:
        reasons.append(f"TP {tp} does not divide the {heads} attention heads")
    kv_per_rank = 1.0
    replication = 1
    if shape.mla:
        kv_per_rank = 1.0  # one latent per token, whole on every rank
        replication = tp
    elif tp <= kv:
        if kv % tp:
            reasons.append(f"TP {tp} does not divide the {kv} KV heads")
        kv_per_rank = kv / tp
    else:
        if tp % kv:
            reasons.append(f"TP {tp} is neither a divisor nor a multiple of the {kv} KV heads")
        replication = tp // kv if not tp % kv else 1
        if not tp % kv:
            flags.append(f"each of the {kv} KV heads is replicated on {replication} TP ranks")
    for name, width in sharded_widths(shape, split).items():
        if width % tp:
            reasons.append(f"TP {tp} does not divide the {name} width {width}")
        elif shape.quant_block and shape.quant_method == "fp8":
            block_n, block_k = shape.quant_block
            shard = width // tp
            if shard % block_n or shard % block_k:
                reasons.append(
                    f"the {name} shard {width}/{tp} = {shard} is not a multiple of the FP8 "
                    f"quantization block {block_n}x{block_k}"
                )
    vocab = padded_vocab(shape.vocab_size)
    if vocab % tp:
        reasons.append(f"TP {tp} does not divide the padded vocabulary {vocab}")
    if pp > shape.num_layers:
        reasons.append(f"PP {pp} exceeds the {shape.num_layers} decoder layers")
    redundant = 0
    if shape.is_moe and split.ep > 1:
        if split.ep > shape.num_experts:
            reasons.append(f"EP {split.ep} exceeds the {shape.num_experts} routed experts")
        elif shape.num_experts % split.ep:
            per_rank = -(-shape.num_experts // split.ep)
            redundant = per_rank * split.ep - shape.num_experts
            flags.append(
                f"uneven EP: {shape.num_experts} routed experts over EP {split.ep} needs "
                f"{redundant} redundant experts ({per_rank} per rank)"
            )
    return Validity(
        valid=not reasons,
        reasons=tuple(reasons),
        flags=tuple(flags),
        kv_heads_per_rank=kv_per_rank,
        kv_replication=replication,
        redundant_experts=redundant,
        padded_vocab=vocab,
    )


def divisors(n: int) -> list[int]:
    """Divisors of `n` in increasing order (n >= 1; O(sqrt n))."""
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i * i != n:
                large.append(n // i)
        i += 1
    return small + large[::-1]


def splits_for(shape: ModelShape, devices: int) -> list[Split]:
    """Every TP x PP x DP (x EP) factorisation of `devices`; EP is 1 or TP x DP for MoE."""
    out: list[Split] = []
    for tp in divisors(devices):
        rest = devices // tp
        for pp in divisors(rest):
            dp = rest // pp
            out.append(Split(tp=tp, pp=pp, dp=dp, ep=1))
            if shape.is_moe and tp * dp > 1:
                out.append(Split(tp=tp, pp=pp, dp=dp, ep=tp * dp))
    return out


def valid_tp_sizes(shape: ModelShape, devices: int) -> list[int]:
    """TP sizes among the divisors of `devices` that pass every TP rule (EP off for MoE)."""
    return [
        tp
        for tp in divisors(devices)
        if check_split(shape, Split(tp=tp, pp=1, dp=devices // tp, ep=1)).valid
    ]

"""What a release brings that earlier releases (one analysis per known family) did not."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Keys that say nothing about the architecture: bookkeeping, token ids, training knobs.
TRIVIAL_KEYS = frozenset(
    {
        "transformers_version",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "torch_dtype",
        "dtype",
        "use_cache",
        "initializer_range",
        "auto_map",
        "_name_or_path",
        "architectures",
        "model_type",
        "attention_dropout",
        "hidden_dropout",
        "output_router_logits",
        "router_aux_loss_coef",
        "aux_loss_alpha",
        "tokenizer_class",
        "return_dict",
        "output_attentions",
        "output_hidden_states",
        "torchscript",
        "use_return_dict",
        "id2label",
        "label2id",
        "_attn_implementation",
        "resid_pdrop",
        "embd_pdrop",
        "attention_probs_dropout_prob",
        "hidden_dropout_prob",
        "pretraining_tp",
        "seq_aux",
        "ep_size",
        "use_bfloat16",
        "tie_encoder_decoder",
    }
)


def _rope_type(a: Mapping[str, Any]) -> str | None:
    rope = a.get("rope")
    return rope.get("type") if isinstance(rope, Mapping) else None


def _moe_layout(a: Mapping[str, Any]) -> str | None:
    moe = a.get("moe")
    if not isinstance(moe, Mapping):
        return None
    shared = "shared experts" if moe.get("num_shared_experts") else "no shared expert"
    grouped = "grouped top-k" if (moe.get("n_group") or 1) > 1 else "flat top-k"
    dense = "leading dense layers" if moe.get("dense_layers") else "all layers MoE"
    return f"{moe.get('scoring') or 'softmax'} router, {grouped}, {shared}, {dense}"


def _quant_method(a: Mapping[str, Any]) -> str | None:
    q = a.get("quantization")
    return q.get("method") if isinstance(q, Mapping) else None


def _attention_shape(a: Mapping[str, Any]) -> str | None:
    attn = a.get("attention")
    if not isinstance(attn, Mapping):
        return None
    parts = [str(attn.get("kind"))]
    if attn.get("sliding_layers"):
        parts.append("sliding-window layers")
    if attn.get("chunked_layers"):
        parts.append("chunked local attention")
    if attn.get("linear_attention_layers"):
        parts.append("linear-attention layers")
    if attn.get("ssm_layers"):
        parts.append("SSM layers")
    return " + ".join(parts)


_ASPECTS = (
    ("attention", "attention", _attention_shape),
    ("moe", "MoE layout", _moe_layout),
    ("quantization", "checkpoint quantization", _quant_method),
    ("rope", "RoPE type", _rope_type),
)


def compare_with_known(
    analysis: Mapping[str, Any], known: Sequence[Mapping[str, Any]]
) -> list[dict[str, str]]:
    """Differences between `analysis` and every analysis in `known` (dicts from `to_dict()`).

    Reports, one entry per aspect: a family never seen, config keys no known analysis had
    (`config_keys`, bookkeeping keys ignored), and an attention shape, MoE layout,
    quantization method or RoPE type that no known analysis has. Against an empty `known`
    each present aspect is reported once as new.
    """
    out: list[dict[str, str]] = []
    family = analysis.get("family") or analysis.get("model_type")
    known_families = {k.get("family") for k in known} | {k.get("model_type") for k in known}
    if not known:
        out.append(
            {
                "aspect": "family",
                "detail": f"no earlier releases to compare with: {family} is the first",
            }
        )
    elif family not in known_families:
        out.append({"aspect": "family", "detail": f"family {family} has not been seen before"})

    seen_keys: set[str] = set()
    for k in known:
        seen_keys.update(k.get("config_keys") or ())
    keys = [key for key in analysis.get("config_keys") or () if key not in TRIVIAL_KEYS]
    new_keys = sorted(key for key in keys if key not in seen_keys)
    if known and new_keys:
        out.append(
            {"aspect": "config keys", "detail": "keys no known family uses: " + ", ".join(new_keys)}
        )

    for _name, label, read in _ASPECTS:
        value = read(analysis)
        if value is None:
            continue
        seen = {read(k) for k in known}
        if value not in seen:
            detail = f"{label} not seen before: {value}" if known else f"{label}: {value}"
            out.append({"aspect": label, "detail": detail})
    return out

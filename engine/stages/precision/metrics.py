"""Logit metrics between the reference and a target over prefill positions and decode steps.

Rows are next-token logit vectors [vocab] (batch x (prompt_tokens + decode_steps) rows). The
pass/fail metrics are scale-free and computed on mean-centred rows (softmax is invariant to a
constant shift, so only the centred part changes the distribution):

- relative logit error per row ‖t_c - r_c‖₂ / ‖r_c‖₂: its mean (`relative_logit_error`) and
  worst row (`max_relative_logit_error`);
- cosine similarity of the centred rows, mean over rows (`cosine_similarity`) and worst row.

Reported alongside, in their own units: max and mean absolute logit error (logit units),
top-1 agreement (fraction of rows whose argmax agrees; prefill and decode separately) and the
mean KL(reference ‖ target) of the next-token distributions (nats).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from engine.stages.precision.result import check_rows
from engine.twin.run import Trace


def logit_rows(trace: Trace) -> torch.Tensor:
    """[rows, vocab] float64: the prefill rows then the decode rows."""
    vocab = trace.prefill_logits.shape[-1]
    return torch.cat(
        [trace.prefill_logits.reshape(-1, vocab), trace.decode_logits.reshape(-1, vocab)]
    ).double()


def count_non_finite(trace: Trace) -> int:
    """How many logits of the trace are NaN or ±Inf."""
    return sum(int((~torch.isfinite(x)).sum()) for x in (trace.prefill_logits, trace.decode_logits))


def logit_metrics(ref: Trace, tgt: Trace) -> dict[str, Any]:
    """The metrics of the module docstring (floats; `decode_top1_agreement` None without
    decode steps), plus `positions` (rows compared) and `reference_logit_rms` (RMS of the
    centred reference logits, logit units: how peaked the distributions are)."""
    r, t = logit_rows(ref), logit_rows(tgt)
    rc = r - r.mean(-1, keepdim=True)
    tc = t - t.mean(-1, keepdim=True)
    row_rel = (tc - rc).norm(dim=-1) / rc.norm(dim=-1).clamp_min(1e-30)
    row_cos = F.cosine_similarity(rc, tc, dim=-1)
    n_prefill = ref.prefill_logits.shape[0] * ref.prefill_logits.shape[1]
    agree = (r.argmax(-1) == t.argmax(-1)).double()
    kl = (F.softmax(r, -1) * (F.log_softmax(r, -1) - F.log_softmax(t, -1))).sum(-1)
    return {
        "max_abs_error": float((t - r).abs().max()),
        "mean_abs_error": float((t - r).abs().mean()),
        "relative_logit_error": float(row_rel.mean()),
        "max_relative_logit_error": float(row_rel.max()),
        "cosine_similarity": float(row_cos.mean()),
        "min_cosine_similarity": float(row_cos.min()),
        "top1_agreement": float(agree.mean()),
        "prefill_top1_agreement": float(agree[:n_prefill].mean()),
        "decode_top1_agreement": (
            float(agree[n_prefill:].mean()) if agree.numel() > n_prefill else None
        ),
        "kl_divergence": float(kl.mean().clamp_min(0.0)),
        "positions": int(r.shape[0]),
        "reference_logit_rms": float(rc.pow(2).mean().sqrt()),
    }


def failed_checks(metrics: dict[str, Any], thresholds: dict[str, Any]) -> list[str]:
    """One phrase per crossed threshold ("relative logit error 0.07 > 0.0625"), judged by
    `result.check_rows` (the one judge of a dtype's checks); a threshold that is None is
    reported, not enforced."""
    return [
        f"{row.label} {row.value:.4g} {row.op} {row.limit:.4g}"
        for row in check_rows(metrics, thresholds)
        if row.crossed
    ]

"""Each rank's outputs against the single-process float32 reference.

A split that is right changes only the order of floating-point sums (a row-parallel layer's
partial products are all-reduced), so its logits agree with the reference to float32
round-off; a wrong split (a shard on the wrong dimension, a K/V head on the wrong rank, an
expert routed to the wrong place) moves them by the size of the values themselves.

Tolerance (stated in every result): |logit - reference| <= RTOL x max|reference logit| +
ATOL. RTOL = 1e-4 is about 840 float32 unit round-offs (u = 2^-24 ~ 6e-8, IEEE 754), room for
the reordered sums of a few layers (Higham, "Accuracy and Stability of Numerical Algorithms",
2nd ed., section 3.1: a length-n sum's error grows like n*u); the twins' TP=2 splits measure
about 1e-6 of the logit scale. A top-1 flip counts as a disagreement only where the
reference's top-2 margin is wider than the tolerance (inside it the two are tied).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

RTOL = 1e-4
ATOL = 1e-5


def tolerance(reference_scale: float, rtol: float = RTOL, atol: float = ATOL) -> float:
    """The absolute tolerance for values whose reference max |x| is `reference_scale`."""
    return rtol * reference_scale + atol


def _logits(run: Mapping[str, Any]) -> torch.Tensor:
    """Prefill and decode logits as one [batch, positions, vocab] tensor."""
    return torch.cat([run["prefill_logits"], run["decode_logits"]], dim=1)


def logit_errors(reference: Mapping[str, Any], target: Mapping[str, Any], tol: float) -> dict:
    """{"max_abs_error", "top1_agreement", "top1_disagreements_outside_ties", "positions"}.

    `top1_agreement` is the share of positions (batch x (prompt + decode steps)) whose argmax
    matches the reference's; the outside-ties count leaves out positions whose reference top-2
    margin is within `tol`.
    """
    ref, tgt = _logits(reference), _logits(target)
    if ref.shape != tgt.shape:
        raise ValueError(f"logits of shape {list(tgt.shape)}, the reference's {list(ref.shape)}")
    diff = (tgt - ref).abs()
    max_abs = float(diff.max()) if torch.isfinite(diff).all() else float("inf")
    agree = tgt.argmax(-1) == ref.argmax(-1)
    top2 = ref.topk(2, dim=-1).values
    decided = (top2[..., 0] - top2[..., 1]) > tol
    return {
        "max_abs_error": max_abs,
        "top1_agreement": float(agree.float().mean()),
        "top1_disagreements_outside_ties": int((~agree & decided).sum()),
        "positions": int(agree.numel()),
    }


def first_divergence(
    reference: Mapping[str, torch.Tensor],
    target: Mapping[str, torch.Tensor],
    points: Sequence[Sequence[Any]],
    rtol: float = RTOL,
    atol: float = ATOL,
) -> dict[str, Any] | None:
    """The first module (forward order) whose prefill output is off by more than the tolerance.

    `points` are [name, layer, kind] in forward order (`precision.drift.hook_points`). Returns
    {"module", "layer", "kind", "max_abs_error", "tolerance"} or None when every recorded
    output is within it. A module missing on one side is skipped.
    """
    for name, layer, kind in points:
        ref, tgt = reference.get(name), target.get(name)
        if ref is None or tgt is None:
            continue
        scale = float(ref.abs().max()) if ref.numel() else 0.0
        tol = tolerance(scale, rtol, atol)
        if ref.shape != tgt.shape:
            return {
                "module": name,
                "layer": layer,
                "kind": kind,
                "max_abs_error": None,
                "tolerance": tol,
                "shape": [list(ref.shape), list(tgt.shape)],
            }
        err = (tgt - ref).abs().max()
        err_f = float(err) if torch.isfinite(err) else float("inf")
        if err_f > tol:
            return {
                "module": name,
                "layer": layer,
                "kind": kind,
                "max_abs_error": err_f,
                "tolerance": tol,
            }
    return None


def compare_rank(
    rank: int,
    reference: Mapping[str, Any],
    target: Mapping[str, Any],
    points: Sequence[Sequence[Any]],
) -> dict[str, Any]:
    """One rank's row: {"rank", "max_abs_error", "top1_agreement",
    "top1_disagreements_outside_ties", "positions", "tolerance", "passed",
    "first_divergent" (see `first_divergence`, or None)}."""
    scale = float(_logits(reference).abs().max())
    tol = tolerance(scale)
    row: dict[str, Any] = {"rank": rank, "tolerance": tol, "reference_logit_max": scale}
    try:
        row.update(logit_errors(reference, target, tol))
    except ValueError as exc:
        row.update(
            {
                "max_abs_error": None,
                "top1_agreement": None,
                "top1_disagreements_outside_ties": None,
                "positions": None,
                "passed": False,
                "first_divergent": None,
                "error": str(exc),
            }
        )
        return row
    row["first_divergent"] = first_divergence(reference["hidden"], target["hidden"], points)
    row["passed"] = (
        row["max_abs_error"] <= tol
        and row["top1_disagreements_outside_ties"] == 0
        and row["first_divergent"] is None
    )
    return row

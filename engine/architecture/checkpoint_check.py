"""The checkpoint's tensors against what its config implies.

With the tensors transformers builds for the config (`checkpoint_expected`): tensors the
config implies that the checkpoint lacks, tensors it holds that the config does not imply,
and tensors of another shape, each named (the first `SHOWN_NAMES`, the rest counted).
Names are matched exactly first, then in transformers' load-time form with wrapper prefixes
stripped (`language_model.model.layers.0…` and `model.language_model.layers.0…` are one
tensor). Quantization scales are not compared; a packed low-bit weight (`*_blocks`,
`qweight`, `weight_packed`) stands for its unpacked weight and is compared by its logical
elements. MTP modules (which transformers does not build) and tensors transformers itself
skips on load (`_keys_to_ignore_on_load_unexpected`) are not extra.

For every architecture, known to transformers or not: the decoder layers the checkpoint
holds against `num_hidden_layers`, and its MTP modules against the config's count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .checkpoint import MTP, SCALES, TOWER, TensorCount, base_name
from .checkpoint_expected import ExpectedTensors, matches_any
from .checkpoint_names import format_ranges

# Names listed per problem at most; the rest are counted.
SHOWN_NAMES = 10


def _listed(names: list[str]) -> dict[str, Any]:
    ordered = sorted(names, key=_natural)
    return {"count": len(ordered), "names": ordered[:SHOWN_NAMES]}


def _natural(name: str) -> list[Any]:
    """Sort key putting `layers.2` before `layers.10`."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in name.split(".")]


def _unique(mapping: dict[str, list[str]]) -> dict[str, str]:
    return {key: names[0] for key, names in mapping.items() if len(names) == 1}


def _match(
    checkpoint: dict[str, TensorCount], expected: ExpectedTensors
) -> tuple[dict[str, str], list[str], list[str]]:
    """({expected name: checkpoint name}, expected names unmatched, checkpoint names
    unmatched). `checkpoint` is keyed by base name (packed tensors unpacked)."""
    pairs = {name: name for name in checkpoint if name in expected.shapes}
    left_expected = [n for n in expected.shapes if n not in pairs]
    left_checkpoint = [n for n in checkpoint if n not in pairs]
    by_canonical_e: dict[str, list[str]] = {}
    for name in left_expected:
        by_canonical_e.setdefault(expected.canonical(name), []).append(name)
    by_canonical_c: dict[str, list[str]] = {}
    for name in left_checkpoint:
        by_canonical_c.setdefault(expected.canonical(name), []).append(name)
    exp_unique, ckpt_unique = _unique(by_canonical_e), _unique(by_canonical_c)
    for key, exp_name in exp_unique.items():
        if key in ckpt_unique:
            pairs[exp_name] = ckpt_unique[key]
    matched_c = set(pairs.values())
    return (
        pairs,
        [n for n in left_expected if n not in pairs],
        [n for n in left_checkpoint if n not in matched_c],
    )


def _tensor_check(counted: list[TensorCount], expected: ExpectedTensors) -> dict[str, Any]:
    """Missing, extra and wrong-shape tensors against transformers' build."""
    checkpoint: dict[str, TensorCount] = {}
    for t in counted:
        if t.group not in (SCALES, MTP):
            checkpoint[base_name(t.name)] = t
    pairs, missing, extra = _match(checkpoint, expected)
    missing = [n for n in missing if not matches_any(n, expected.ignore_missing)]
    ignored = [n for n in extra if matches_any(checkpoint[n].name, expected.ignore_unexpected)]
    extra = [n for n in extra if n not in set(ignored)]
    wrong: list[dict[str, Any]] = []
    for exp_name, ckpt_name in pairs.items():
        want = expected.shapes[exp_name]
        t = checkpoint[ckpt_name]
        packed = t.packed > 1 or t.name != ckpt_name
        fits = math.prod(want) == t.params if packed else tuple(t.shape) == tuple(want)
        if not fits:
            wrong.append(
                {
                    "name": t.name,
                    "expected": list(want),
                    "found": list(t.shape),
                    "dtype": t.dtype,
                    "packed": t.packed,
                }
            )
    wrong.sort(key=lambda w: _natural(w["name"]))
    out: dict[str, Any] = {
        "expected_from": expected.class_name,
        "expected_tensors": len(expected.shapes),
        "matched_tensors": len(pairs),
    }
    if missing:
        out["missing"] = _listed(missing)
    if extra:
        out["extra"] = _listed([checkpoint[n].name for n in extra])
    if ignored:
        out["ignored_by_transformers"] = _listed([checkpoint[n].name for n in ignored])
    if wrong:
        out["wrong_shape"] = {"count": len(wrong), "tensors": wrong[:SHOWN_NAMES]}
    return out


def _layer_check(counted: list[TensorCount], analysis: Mapping[str, Any]) -> dict[str, Any]:
    """Decoder layers and MTP modules held against the config's counts."""
    n = int(analysis.get("num_layers") or 0)
    m = int(analysis.get("mtp_layers") or 0)
    layers = {
        t.layer for t in counted if t.layer is not None and t.group not in (MTP, TOWER, SCALES)
    }
    mtp = {t.mtp_module for t in counted if t.group == MTP}
    out: dict[str, Any] = {}
    if layers:
        missing = sorted(set(range(n)) - layers)
        extra = sorted(layers - set(range(n)))
        out["layers"] = {"config": n, "checkpoint": len(layers)}
        if missing:
            out["layers"]["missing"] = format_ranges(missing)
        if extra:
            out["layers"]["extra"] = format_ranges(extra)
    elif counted:
        out["layers"] = {"config": n, "checkpoint": None}
    if len(mtp) != m:
        out["mtp"] = {"config": m, "checkpoint": len(mtp)}
    return out


def check_checkpoint(
    counted: list[TensorCount],
    analysis: Mapping[str, Any],
    expected: ExpectedTensors | None,
    *,
    why_no_expected: str | None = None,
    duplicates: Mapping[str, Any] | None = None,
    index_mismatch: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The checkpoint's tensors (`checkpoint.classify`'s) against the config.

    Returns {"layers": {"config", "checkpoint" (decoder layers held; None when no name
    shows one), "missing"/"extra": layer ranges}, "mtp": {"config", "checkpoint"} (only
    when they differ), and with `expected`: "expected_from" (the class built),
    "expected_tensors", "matched_tensors", "missing"/"extra"/"ignored_by_transformers"
    ({"count", "names"}), "wrong_shape" ({"count", "tensors": [{"name", "expected",
    "found", "dtype", "packed"}]}); without: "expected_from" None and `why_no_expected`;
    "duplicates" (a name in two files) and "index_mismatch" (the index against the headers)
    from the fetch stage's summary}. A key is there only when
    it has something to say, except "layers" and "expected_from".
    """
    out = _layer_check(counted, analysis)
    if expected is not None:
        out.update(_tensor_check(counted, expected))
    else:
        out["expected_from"] = None
        out["why_no_expected"] = why_no_expected or ""
    if duplicates:
        out["duplicates"] = dict(duplicates)
    if index_mismatch:
        out["index_mismatch"] = dict(index_mismatch)
    return out

"""Checkpoint tensor names: folded for storage, and what a name says about its tensor.

A large checkpoint holds ~100,000 tensors whose names differ only in their layer and expert
numbers (`model.layers.7.mlp.experts.129.gate_proj.weight`). `fold_tensors` stores them as
a few dozen entries, each a name template with `*` for every number, a dtype, a shape, and
for each `*` the numbers it takes ("0-60"); `unfold_tensors` gives back every name exactly
(a layer that lacks one expert is its own entry). A number folds only when written the way
`str(int)` writes it, up to 9 digits: a zero-padded `01` or a 5,000-digit part stays literal
in its template (unfolding `1` would not give back `01`).

The rest reads names the way checkpoints of many families write them (Llama, Qwen,
DeepSeek, gpt-oss, GLM, MiniMax, Gemma, multimodal wrappers): the decoder layer a tensor
belongs to, whether it is a multimodal tower's, the parts only multi-token-prediction (MTP)
layers hold.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from itertools import product
from typing import Any

PLACEHOLDER = "*"
# A dotted part that is a number written canonically: `0`, or up to 9 ASCII digits without a
# leading zero (`str.isdigit` would take other scripts' digits). Only these fold, so that
# unfolding writes back the very part: `layers.01.w` and a 5,000-digit part (past Python's
# int-string limit) stay literal in the template, and no number tops 999,999,999.
_NUMBER_PART = re.compile(r"(?:^|(?<=\.))(0|[1-9][0-9]{0,8})(?=\.|$)")

# Prefixes wrappers put before the language model's names, stripped (repeatedly) to compare
# names across layouts: `model.language_model.layers.0` and `language_model.model.layers.0`
# are both `layers.0`.
_WRAPPER_PREFIXES = ("model.", "language_model.", "text_model.", "transformer.", "backbone.")
# The decoder stack, once prefixes are stripped: `layers.N.`, GPT-2/Falcon `h.N.` (N as
# `_NUMBER_PART` folds it).
_DECODER_LAYER = re.compile(r"^(?:layers|h|blocks|decoder\.layers)\.(0|[1-9][0-9]{0,8})\.")
# Module-name parts of multimodal towers and projectors (substrings), and exact parts.
_TOWER_MARKERS = (
    "vision",
    "visual",
    "audio",
    "image",
    "video",
    "multi_modal",
    "mm_projector",
    "merger",
    "patch_merge",
)
_TOWER_PARTS = frozenset({"vit", "vpm", "apm", "resampler", "connector"})
# Parts only DeepSeek-V3-style MTP layers hold (stored after the main layers).
MTP_MARKERS = frozenset({"enorm", "hnorm", "eh_proj", "shared_head"})


def format_ranges(values: Iterable[int]) -> str:
    """Sorted integers as "0-3,7,9-12"."""
    ordered = sorted(set(values))
    parts: list[str] = []
    start = prev = None
    for value in ordered:
        if prev is not None and value == prev + 1:
            prev = value
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = value
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def parse_ranges(text: str) -> list[int]:
    """ "0-3,7" as [0, 1, 2, 3, 7]. Raises ValueError for anything else."""
    values: list[int] = []
    for part in str(text).split(","):
        low, dash, high = part.partition("-")
        start, end = int(low), int(high) if dash else int(low)
        if end < start or start < 0:
            raise ValueError(f"bad range {part!r}")
        values.extend(range(start, end + 1))
    return values


def name_template(name: str) -> tuple[str, tuple[int, ...]]:
    """`name` with `*` for each number, and the numbers: `model.layers.3.mlp.experts.7.w1`
    → (`model.layers.*.mlp.experts.*.w1`, (3, 7)). Only canonical numbers (`0`, or 1 to 9
    digits without a leading zero) are numbers: `layers.01.w` and a part of 10 or more
    digits stay as written, so the template and its numbers give back `name` exactly."""
    found = _NUMBER_PART.findall(name)
    if not found:
        return name, ()
    return _NUMBER_PART.sub(PLACEHOLDER, name), tuple(int(n) for n in found)


def _compress(tuples: list[tuple[int, ...]]) -> list[tuple[frozenset[int], ...]]:
    """Index tuples as rows of per-position sets whose products are exactly the tuples."""
    if not tuples or not tuples[0]:
        return [()]
    columns = [frozenset(t[i] for t in tuples) for i in range(len(tuples[0]))]
    size = 1
    for column in columns:
        size *= len(column)
    if size == len(tuples):
        return [tuple(columns)]
    # Split on the first number; first numbers with the same rest share a row.
    rests: dict[int, set[tuple[int, ...]]] = defaultdict(set)
    for t in tuples:
        rests[t[0]].add(t[1:])
    by_rest: dict[frozenset[tuple[int, ...]], set[int]] = defaultdict(set)
    for first, rest in rests.items():
        by_rest[frozenset(rest)].add(first)
    rows = []
    for rest, firsts in by_rest.items():
        for row in _compress(sorted(rest)):
            rows.append((frozenset(firsts), *row))
    return rows


def fold_tensors(tensors: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`{name: {"dtype", "shape"}}` as entries {"name": template with `*` for each number,
    "dtype", "shape", "index": one range string per `*` (absent without numbers)}, sorted;
    `unfold_tensors` reverses it exactly."""
    groups: dict[tuple[str, str, tuple[int, ...]], list[tuple[int, ...]]] = defaultdict(list)
    for name, info in tensors.items():
        template, numbers = name_template(name)
        shape = tuple(int(d) for d in info.get("shape", ()))
        groups[(template, str(info.get("dtype")), shape)].append(numbers)
    entries = []
    for (template, dtype, shape), tuples in groups.items():
        for row in _compress(sorted(set(tuples))):
            entry: dict[str, Any] = {"name": template, "dtype": dtype, "shape": list(shape)}
            if row:
                entry["index"] = [format_ranges(column) for column in row]
            entries.append(entry)
    return sorted(entries, key=lambda e: (e["name"], e.get("index", []), e["dtype"]))


def unfold_tensors(entries: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every `{name: {"dtype", "shape"}}` of `fold_tensors` entries (the tensors of one entry
    share their dict: read it, do not change it). Raises ValueError for an entry that is not
    one (a `*` count that does not match its index)."""
    tensors: dict[str, dict[str, Any]] = {}
    for entry in entries:
        parts = str(entry["name"]).split(".")
        slots = [i for i, part in enumerate(parts) if part == PLACEHOLDER]
        index = entry.get("index") or []
        if len(index) != len(slots):
            raise ValueError(f"tensor entry {entry['name']!r} has {len(index)} index ranges")
        # One dict shared by the entry's tensors: readers must not change it.
        info = {"dtype": str(entry["dtype"]), "shape": [int(d) for d in entry["shape"]]}
        for numbers in product(*(parse_ranges(r) for r in index)):
            for slot, number in zip(slots, numbers, strict=True):
                parts[slot] = str(number)
            tensors[".".join(parts)] = info
    return tensors


def strip_wrappers(name: str) -> str:
    """`name` without the wrapper prefixes before the language model's own names."""
    changed = True
    while changed:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix) :]
                changed = True
    return name


def decoder_layer(name: str) -> int | None:
    """The decoder layer `name` belongs to (`model.layers.12.…` → 12), None outside the
    decoder stack (embeddings, final norm, LM head, towers, `mtp.*`)."""
    match = _DECODER_LAYER.match(strip_wrappers(name))
    return int(match.group(1)) if match else None


def is_tower(name: str) -> bool:
    """Whether `name` is a multimodal tower's or projector's (vision, audio, merger...)."""
    parts = name.lower().split(".")[:-1]
    return any(part in _TOWER_PARTS for part in parts) or any(
        marker in part for part in parts for marker in _TOWER_MARKERS
    )

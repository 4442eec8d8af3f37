"""The plan's split notation as people type it: "TP8 PP1 EP1 DP1" (`Split.label()`'s own
words) read back into a `Split`, for the `plan` command's --split and the API's "split".

Degrees are named TP, PP, EP and DP, in any order and any case, each followed by its size
("tp8", "TP 8" and "TP=8" read alike), separated by spaces or commas; a degree left out is 1,
so "TP8" is "TP8 PP1 EP1 DP1" and "TP8 EP8" is "TP8 PP1 EP8 DP1". EP follows the planner's
rule (`validity`: vLLM's --enable-expert-parallel): the EP group is the TP x DP ranks, so EP
is 1 or TP x DP, and a dense model has no EP.
"""

from __future__ import annotations

import re

from .errors import PlanInputError
from .layout import SEARCH_LIMIT_DEVICES
from .validity import Split

# The largest split read: the most devices the planner ever looks at ("more devices would
# fit" searches up to it), so a bigger one is a typo, not a plan.
MAX_SPLIT_DEVICES = SEARCH_LIMIT_DEVICES
EXAMPLE = '"TP8 PP1 EP1 DP1"'

_DEGREE = re.compile(r"(tp|pp|ep|dp)\s*=?\s*(\d+)", re.IGNORECASE)
_SEPARATOR = re.compile(r"[\s,]*")


def parse_split(text: str) -> Split:
    """`text` in the plan's notation as a `Split(tp, pp, dp, ep)`: "TP8 PP1 EP1 DP1", "tp4
    pp2", "DP8 EP8" (order free, case-insensitive, a degree left out is 1).

    Raises `PlanInputError` with a one-line reason for text that is not the notation (an
    unknown word, a degree without a size), a degree given twice, a size below 1, a split of
    more than `MAX_SPLIT_DEVICES` (65,536) devices, and an EP other than 1 or TP x DP."""
    if not isinstance(text, str) or not text.strip():
        raise PlanInputError(f"a split is degrees like {EXAMPLE}, got {text!r}")
    degrees: dict[str, int] = {}
    position = _SEPARATOR.match(text).end()
    while position < len(text):
        found = _DEGREE.match(text, position)
        if found is None:
            rest = text[position:].split()[0]
            raise PlanInputError(
                f"cannot read {rest!r} in the split {text!r}: give degrees TP, PP, EP, DP each "
                f"with its size, like {EXAMPLE}"
            )
        name, digits = found.group(1).upper(), found.group(2)
        if name in degrees:
            raise PlanInputError(f"{name} is given twice in the split {text!r}")
        size = int(digits) if len(digits) <= len(str(MAX_SPLIT_DEVICES)) else None
        if size is not None and size < 1:
            raise PlanInputError(f"{name} must be at least 1, got {size} in the split {text!r}")
        if size is None or size > MAX_SPLIT_DEVICES:
            raise PlanInputError(
                f"{name}{digits} is implausibly large (a split of at most "
                f"{MAX_SPLIT_DEVICES:,} devices)"
            )
        degrees[name] = size
        position = _SEPARATOR.match(text, found.end()).end()
    tp, pp, dp, ep = (degrees.get(name, 1) for name in ("TP", "PP", "DP", "EP"))
    if tp * pp * dp > MAX_SPLIT_DEVICES:
        raise PlanInputError(
            f"the split {text!r} uses {tp * pp * dp:,} devices (TP x PP x DP), implausibly many "
            f"(at most {MAX_SPLIT_DEVICES:,})"
        )
    if ep not in (1, tp * dp):
        fix = f"EP{tp * dp} or EP1" if tp * dp > 1 else "EP1"
        raise PlanInputError(
            f"EP {ep} is neither 1 nor TP x DP = {tp * dp} in the split {text!r}: the EP group "
            f"is the TP x DP ranks (vLLM --enable-expert-parallel); with these TP and DP give "
            f'{fix}, or spread EP {ep} as "TP{ep} EP{ep}" or "DP{ep} EP{ep}"'
        )
    return Split(tp=tp, pp=pp, dp=dp, ep=ep)


def check_split_for(split: Split, *, devices: int, moe: bool) -> None:
    """Refuse a split the pool or the model cannot take, before it is sized: more devices
    (TP x PP x DP) than the pool's `devices`, or EP above 1 for a dense model (`moe` False:
    no experts to spread). Raises `PlanInputError` with a one-line reason."""
    if split.devices > devices:
        raise PlanInputError(
            f"the split {split.label()} uses {split.devices:,} devices (TP x PP x DP); the pool "
            f"has {devices:,}"
        )
    if split.ep > 1 and not moe:
        raise PlanInputError(
            f"the split {split.label()} has EP {split.ep}, but the model is dense: it has no "
            "experts to spread; give EP1 (or leave EP out)"
        )

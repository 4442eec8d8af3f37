"""What a serving engine's launch changed from the plan's command: the serve stage's
`command_diff` rows (the twin's launch, and the full-size run's) as values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.stored import as_list, as_mapping


@dataclass(frozen=True)
class CommandChange:
    """One flag the launch changed from the plan's command: the planned value, the launched
    one ("" where the command has none) and why (the stage's words)."""

    flag: str
    planned: str
    launched: str
    why: str


def text(value: Any) -> str:
    """`value` as text, "" for None."""
    return "" if value is None else str(value)


def command_changes(value: Any) -> list[CommandChange]:
    """The rows of a stored `command_diff` ([{"flag", "planned", "launched", "why"}]); a row
    that is not a mapping reads as empty."""
    return [
        CommandChange(
            flag=text(row.get("flag")),
            planned=text(row.get("planned")),
            launched=text(row.get("launched")),
            why=text(row.get("why")),
        )
        for row in (as_mapping(r) for r in as_list(value))
    ]

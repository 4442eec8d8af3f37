"""Strict parsing of a release's JSON files, shared by the hub sources and the `fetch` stage.

A release's `config.json`, `generation_config.json` and `model.safetensors.index.json` are
written by whoever uploads it, so what the parse refuses is the release's fault and the
message names the file: bytes that are not UTF-8, JSON errors (with line, column and
character offset), NaN/Infinity (Python's `json` accepts them; JSON, RFC 8259, and the
database's JSON do not), and nesting too deep for Python's parser (a `RecursionError`, which
would otherwise escape as an unexplained error). One parse, so a file refused in one place
is refused in every place with the same words.
"""

from __future__ import annotations

import json
import re
from typing import Any

_NON_FINITE = re.compile(r"[:\[,]\s*(-?Infinity|NaN)\b")


class JSONFileError(ValueError):
    """A release's file that is not strict JSON; `message` names the file and says where."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _NonFiniteNumber(ValueError):
    pass


def _refuse_constant(constant: str) -> Any:
    raise _NonFiniteNumber(constant)


def _non_finite_error(name: str, text: str, constant: str) -> JSONFileError:
    """Where the first NaN/Infinity stands (json's callback is not told the position)."""
    match = _NON_FINITE.search(text)
    if match is None:
        return JSONFileError(f"{name} is not valid JSON: {constant} (JSON has no NaN or Infinity).")
    pos = match.start(1)
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return JSONFileError(
        f"{name} is not valid JSON: {match.group(1)} at line {line} column {column} (char {pos}); "
        "JSON has no NaN or Infinity."
    )


def parse_json_bytes(name: str, raw: bytes) -> Any:
    """`raw` (the bytes of the file `name`, a UTF-8 BOM allowed) as JSON. Raises
    `JSONFileError` naming the file: not UTF-8 (the byte offset), invalid JSON (line, column,
    character offset of the first error), NaN or Infinity, nested too deeply to parse."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise JSONFileError(f"{name} is not UTF-8 text (byte {exc.start}).") from exc
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except _NonFiniteNumber as exc:
        raise _non_finite_error(name, text, str(exc)) from exc
    except RecursionError as exc:
        raise JSONFileError(f"{name} is nested too deeply to be read as JSON.") from exc
    except json.JSONDecodeError as exc:
        raise JSONFileError(
            f"{name} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} "
            f"(char {exc.pos})."
        ) from exc

"""The engine's own words: the error lines of its log, and an excerpt of its startup.

A refusal is reported with the engine's lines first (what vLLM printed), then day0's reading of
them. The lines are picked, not paraphrased: argparse's `error:` line, the last exception of a
traceback (`ValueError: ...`, `RuntimeError: ...`), and lines vLLM logs at ERROR level.
"""

from __future__ import annotations

import re

_EXCEPTION = re.compile(r"^\s*(?:[\w.]+\.)?([A-Z]\w*(?:Error|Exception|Exit)|AssertionError)\b:")
_ARGPARSE = re.compile(r"^(?:\S+: )?error: ")
_LEVEL_ERROR = re.compile(r"\b(?:ERROR|CRITICAL)\b")
_NOISE = ("Traceback (most recent call last)", "During handling of the above exception")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

MAX_LINE_CHARS = 500


def clean(line: str) -> str:
    return _ANSI.sub("", line).rstrip()[:MAX_LINE_CHARS]


def error_lines(log_text: str, *, limit: int = 8) -> list[str]:
    """The engine's error lines, most telling first: argparse errors, then the exception lines
    (the last one first: the one that stopped the engine), then ERROR-level log lines; each
    once, at most `limit`."""
    lines = [clean(line) for line in log_text.splitlines()]
    argparse_lines = [line for line in lines if _ARGPARSE.match(line)]
    exceptions = [line.strip() for line in lines if _EXCEPTION.match(line)]
    logged = [
        line
        for line in lines
        if _LEVEL_ERROR.search(line) and not any(noise in line for noise in _NOISE)
    ]
    picked: list[str] = []
    for line in [*argparse_lines, *reversed(exceptions), *logged]:
        if line and line not in picked:
            picked.append(line)
    return picked[:limit]


def excerpt(log_text: str, *, head: int = 12, tail: int = 12) -> list[str]:
    """The first `head` and last `tail` lines of the log (the version banner, the arguments,
    then how it ended), with a marker line where lines were left out."""
    lines = [clean(line) for line in log_text.splitlines() if line.strip()]
    if len(lines) <= head + tail:
        return lines
    return [*lines[:head], f"... {len(lines) - head - tail} lines ...", *lines[-tail:]]


def refusal_reason(lines: list[str]) -> str:
    """A short reason from the engine's error lines (the first one, without a log prefix)."""
    if not lines:
        return "the engine exited without an error line"
    first = lines[0]
    # vLLM's log prefix: "(APIServer pid=123) ERROR 12-01 18:00:00 [file.py:12] message"
    match = re.search(r"\[[\w./-]+:\d+\]\s*(.*)$", first)
    return (match.group(1) if match else first).strip()


# vLLM's line once the KV cache is allocated: "CPU KV cache size: 46,592 tokens" (the CPU
# build), "GPU KV cache size: 1,234,560 tokens" (CUDA, ROCm).
_KV_CACHE_TOKENS = re.compile(r"\bKV cache size: ([\d,]+) tokens")


def kv_cache_tokens(log_text: str) -> int | None:
    """The tokens the engine's KV cache holds, as its log says (the last such line), or None.
    With the cache's bytes known (a cpu pool's `VLLM_CPU_KVCACHE_SPACE`) this gives the KV
    bytes of a token the engine allocates: the served model's own layers and KV heads."""
    found = _KV_CACHE_TOKENS.findall(_ANSI.sub("", log_text))
    return int(found[-1].replace(",", "")) if found else None

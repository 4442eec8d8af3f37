"""The serve stage's load sweep, driven by vLLM's own benchmark module.

The load generator is `vllm.benchmarks.serve` (what `vllm bench serve` runs), not guidellm or
aiperf, because it ships inside the engine's own environment (nothing more to install on a
worker or in an engine image), it measures with vLLM's own definitions (TTFT, TPOT excluding
the first token, ITL, E2EL, output and request throughput, computed by the same code vLLM's
maintainers publish numbers with), and it works offline: `--dataset-name random` makes prompts
of exactly `--random-input-len` tokens from the served tokenizer, and `--ignore-eos` makes every
request generate `--random-output-len` tokens, so no data set is downloaded.

day0's process never imports vLLM: `run_sweep` starts `bench_child.py` (beside this file) with
the engine environment's Python, in its own session, hands it the sweep as JSON on stdin and
reads one JSON line per finished level back (vLLM's figures, in milliseconds), which become the
result's `sweep` points (`point_from_line`, in seconds):

    {"concurrency": 2, "requests": 8, "completed": 8, "errors": 0,
     "ttft_s_p50": ..., "ttft_s_p95": ..., "ttft_s_p99": ...,
     "tpot_s_p50": ..., "tpot_s_p95": ..., "tpot_s_p99": ..., "itl_s_p50": ...,
     "e2e_s_p50": ..., "e2e_s_p95": ..., "e2e_s_p99": ...,
     "total_input_tokens": ..., "total_output_tokens": ...,
     "output_tokens_per_s": ..., "requests_per_s": ..., "duration_s": ...}

(`total_input_tokens`, `total_output_tokens`: the tokens of the level's completed requests, as
the engine counted them in its usage figures.)

A child that fails, runs past `timeout_s`, is cancelled, or finds the engine gone (its requests
refused or cut off) ends the sweep with `SweepError`, which keeps the levels finished before.

The child's environment is the engine's allow-list (`process.engine_environment`: PATH, HOME,
locale, TMPDIR, the HF cache folders, ...) with `HF_HUB_OFFLINE=1` and what the caller adds:
the worker's secrets (database and broker URLs, SECRET_KEY, hub tokens, OPENAI_API_KEY) stay
out. An endpoint's API key (`api_key`, attach mode) travels in the stdin spec, never in argv or
the environment the child is started with, and is never logged; the child sets it as
`OPENAI_API_KEY` in its own environment, where vLLM's benchmark reads it for its
`Authorization: Bearer` header.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.contract import never_cancelled

from . import bench_child
from .process import engine_environment, tagged_pids

BENCH_CHILD = Path(bench_child.__file__).resolve()
LOAD_GENERATOR = "vllm.benchmarks.serve"
PERCENTILES = (50, 95, 99)
DEFAULT_SEED = 0
# Set in the child's environment whatever the caller passes: the sweep never downloads.
CHILD_ENV = {"HF_HUB_OFFLINE": "1"}

# Seconds a child gets to exit after SIGTERM before its group is killed.
_KILL_GRACE_S = 5.0
# The child's stderr lines kept for a failure's reason (vLLM prints a table per level there).
_STDERR_LINES = 200

# Point key -> vLLM's key in a bench_child line (milliseconds).
_LATENCY_KEYS = {
    "ttft_s_p50": "p50_ttft_ms",
    "ttft_s_p95": "p95_ttft_ms",
    "ttft_s_p99": "p99_ttft_ms",
    "tpot_s_p50": "p50_tpot_ms",
    "tpot_s_p95": "p95_tpot_ms",
    "tpot_s_p99": "p99_tpot_ms",
    "itl_s_p50": "p50_itl_ms",
    "e2e_s_p50": "p50_e2el_ms",
    "e2e_s_p95": "p95_e2el_ms",
    "e2e_s_p99": "p99_e2el_ms",
}


class SweepError(Exception):
    """The sweep stopped before its last level. `points` are the levels finished before;
    `kind` is "failed" (the child failed), "timeout", "cancelled" or "engine_gone" (the
    engine refused or cut off the requests)."""

    def __init__(self, reason: str, points: Iterable[dict[str, Any]] = (), kind: str = "failed"):
        super().__init__(reason)
        self.reason = reason
        self.points = list(points)
        self.kind = kind


def levels_for(plan_concurrency: int | None, cap: int) -> list[int]:
    """The sweep's concurrency levels: 1, 2, 4, ... up to min(plan_concurrency, cap), the top
    included even when it is not a power of two (min(12, 16) gives [1, 2, 4, 8, 12]). A plan
    without a concurrency sweeps up to the cap."""
    top = max(1, min(int(plan_concurrency or cap), int(cap)))
    levels = []
    level = 1
    while level < top:
        levels.append(level)
        level *= 2
    levels.append(top)
    return levels


def load_generator_name(python: str | os.PathLike, version: str | None = None) -> str:
    """ "vllm.benchmarks.serve (vLLM 0.32.0)": the benchmark module and the version of the vLLM
    installed beside `python`. `version` is that version when the caller already read it (the
    stage reads it once, for the engine); without it the package metadata is read by starting
    `python` (without importing vLLM). Just the module's name when neither gives a version."""
    if version:
        return f"{LOAD_GENERATOR} (vLLM {version})"
    probe = (
        "import importlib.metadata as m\n"
        "dists = m.packages_distributions().get('vllm') or ['vllm']\n"
        "print(m.version(dists[0]))\n"
    )
    try:
        done = subprocess.run(
            [str(python), "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return LOAD_GENERATOR
    version = done.stdout.strip()
    if done.returncode != 0 or not version:
        return LOAD_GENERATOR
    return f"{LOAD_GENERATOR} (vLLM {version})"


def _seconds(milliseconds: Any) -> float | None:
    return None if milliseconds is None else round(float(milliseconds) / 1000.0, 6)


def _rate(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


def _count(value: Any) -> int | None:
    return None if value is None else int(value)


def point_from_line(line: Mapping[str, Any]) -> dict[str, Any]:
    """One `sweep` point from one bench_child line (vLLM's milliseconds become seconds). A level
    where no request completed has no latencies (vLLM reports zeros for them)."""
    completed = int(line.get("completed") or 0)
    point: dict[str, Any] = {
        "concurrency": int(line["level"]),
        "requests": int(line["requests"]),
        "completed": completed,
        "errors": int(line.get("failed") or 0),
    }
    for key, vllm_key in _LATENCY_KEYS.items():
        point[key] = _seconds(line.get(vllm_key)) if completed else None
    point["total_input_tokens"] = _count(line.get("total_input_tokens"))
    point["total_output_tokens"] = _count(line.get("total_output_tokens"))
    point["output_tokens_per_s"] = _rate(line.get("output_throughput"))
    point["requests_per_s"] = _rate(line.get("request_throughput"))
    point["duration_s"] = _rate(line.get("duration"))
    return point


def _describe(point: Mapping[str, Any]) -> str:
    ttft = point["ttft_s_p50"]
    return (
        f"sweep: concurrency {point['concurrency']}: {point['completed']}/{point['requests']} "
        f"requests, {point['output_tokens_per_s']} output tokens/s"
        + (f", TTFT p50 {ttft} s" if ttft is not None else "")
    )


def _kill_group(process: subprocess.Popen) -> None:
    """SIGTERM the child's whole session, SIGKILL it after a grace period, reap the child."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=_KILL_GRACE_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=_KILL_GRACE_S)


def _pump(stream, sink: Callable[[str], None]) -> None:
    for raw in stream:
        sink(raw.rstrip("\n"))
    stream.close()


def run_sweep(
    *,
    python: str | os.PathLike,
    base_url: str,
    model: str,
    tokenizer_dir: str | os.PathLike,
    levels: Sequence[int],
    input_tokens: int,
    output_tokens: int,
    requests_per_level: int | None,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    log: Callable[[str], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    seed: int = DEFAULT_SEED,
    child: str | os.PathLike = BENCH_CHILD,
    api_key: str | None = None,
    on_point: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run the load sweep against the engine at `base_url`; one point per level, in order.

    `python` is the engine environment's interpreter (it runs `child`, bench_child.py);
    `requests_per_level` None sends four times each level's concurrency. The child's
    environment is the engine's allow-list with `CHILD_ENV` and `env` added (see the module
    docstring); `api_key`, the endpoint's key, goes to the child in its stdin spec only. `log`
    gets one line per finished level, `on_point` each point as its level finishes (when it
    ended, for the engine's metrics of that level); `cancelled` is polled while the child
    runs. Raises
    `SweepError` (keeping the finished points) when the child fails, exceeds `timeout_s`, is
    cancelled, or the engine stops answering.
    """
    log = log or (lambda _line: None)
    cancelled = cancelled or never_cancelled
    levels = [int(level) for level in levels]
    spec = {
        "base_url": base_url,
        "model": model,
        "tokenizer_dir": str(tokenizer_dir),
        "levels": levels,
        "input_tokens": int(input_tokens),
        "output_tokens": int(output_tokens),
        "requests_per_level": None if requests_per_level is None else int(requests_per_level),
        "seed": int(seed),
        "percentiles": list(PERCENTILES),
        "api_key": api_key or None,
    }
    # The child and anything it starts carry this tag, so that none outlives the sweep even
    # after leaving the child's session.
    run_tag = f"sweep-{uuid.uuid4().hex}"
    try:
        process = subprocess.Popen(
            [str(python), str(child)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=engine_environment({**CHILD_ENV, **dict(env or {})}, run_tag),
            start_new_session=True,
        )
    except OSError as exc:
        raise SweepError(f"the load generator could not start with {python}: {exc}") from exc
    lines: queue.Queue[str | None] = queue.Queue()
    stderr_tail: deque[str] = deque(maxlen=_STDERR_LINES)

    def stdout_sink(text: str) -> None:
        lines.put(text)

    stdout_reader = threading.Thread(
        target=lambda: (_pump(process.stdout, stdout_sink), lines.put(None)), daemon=True
    )
    stderr_reader = threading.Thread(
        target=_pump, args=(process.stderr, stderr_tail.append), daemon=True
    )
    stdout_reader.start()
    stderr_reader.start()
    try:
        process.stdin.write(json.dumps(spec))
        process.stdin.close()
    except OSError:
        pass  # the child died at once: its exit status says why, below

    points: list[dict[str, Any]] = []
    errors: list[str] = []
    deadline = time.monotonic() + timeout_s

    def stop(reason: str, kind: str) -> SweepError:
        _kill_group(process)
        return SweepError(reason, points, kind)

    def take(text: str) -> None:
        """One line of the child's stdout: a finished level, a level's error, or noise."""
        try:
            line = json.loads(text)
        except ValueError:
            stderr_tail.append(text)  # not ours: keep it with the child's other output
            return
        if not isinstance(line, dict):
            return
        if "error" in line:
            errors.append(str(line["error"]))
            return
        if line.get("connection_errors"):
            sample = "; ".join(line.get("error_samples") or [])
            raise stop(
                f"the engine stopped answering at concurrency {line.get('level')}: "
                f"{line['connection_errors']} of {line.get('requests')} requests could not "
                f"reach it ({sample})",
                "engine_gone",
            )
        point = point_from_line(line)
        points.append(point)
        if on_point is not None:
            on_point(point)
        log(_describe(point))

    try:
        while True:
            if cancelled():
                raise stop("the stage run was cancelled during the load sweep", "cancelled")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                finished = ", ".join(str(p["concurrency"]) for p in points) or "none"
                raise stop(
                    f"the load sweep did not finish in {timeout_s:g} s (levels finished: "
                    f"{finished})",
                    "timeout",
                )
            try:
                text = lines.get(timeout=min(0.5, remaining))
            except queue.Empty:
                if process.poll() is None:
                    continue
                # The child exited but its stdout is still open (a process it started holds
                # it): what it wrote is already in the queue.
                stdout_reader.join(timeout=1.0)
                while (text := _next_nowait(lines)) is not None:
                    take(text)
                break
            if text is None:  # the child closed its stdout: it is exiting
                break
            take(text)
        try:
            returncode = process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise stop(
                f"the load sweep's child did not exit within {timeout_s:g} s", "timeout"
            ) from None
    finally:
        # Whatever is left of the child's session (all of it on an error, the child's own
        # children otherwise) goes, so that no reader waits on a pipe it holds open.
        if process.poll() is None:
            _kill_group(process)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        for pid in tagged_pids(run_tag):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        stdout_reader.join(timeout=5)
        stderr_reader.join(timeout=5)

    child_error = errors[-1] if errors else None
    if returncode != 0 or child_error is not None or len(points) < len(levels):
        reason = child_error or _last_error_line(stderr_tail) or "no reason given"
        kind = "engine_gone" if _looks_like_engine_gone(reason) else "failed"
        raise SweepError(
            f"the load generator exited with {returncode} after {len(points)} of "
            f"{len(levels)} levels: {reason}",
            points,
            kind,
        )
    return points


def _next_nowait(lines: queue.Queue[str | None]) -> str | None:
    try:
        return lines.get_nowait()
    except queue.Empty:
        return None


_CONNECTION_WORDS = ("Cannot connect to host", "Connection refused", "ServerDisconnected")


def _looks_like_engine_gone(reason: str) -> bool:
    return any(word in reason for word in _CONNECTION_WORDS)


def _last_error_line(lines: Iterable[str]) -> str | None:
    """The last line of the child's stderr that names an error (a traceback's last line)."""
    meaningful = [
        line.strip()
        for line in lines
        if line.strip() and not line.startswith((" - leaked", "nanobind:", "See https://"))
    ]
    for line in reversed(meaningful):
        if "Error" in line or "Exception" in line:
            return line[:500]
    return meaningful[-1][:500] if meaningful else None

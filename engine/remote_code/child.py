"""Entry point of the remote-code sandbox's child process (see `engine.remote_code.sandbox`).

Run as `python -m engine.remote_code.child PARENT_PID` with the working directory set
to the sandbox's private temporary folder, a task (JSON) on stdin. In this order, before it
imports torch, transformers or the release's code:

1. `prctl(PR_SET_PDEATHSIG, SIGKILL)` (Linux, through ctypes): the kernel kills this process
   when the worker process that started it dies, so an orphan cannot run on; then exits at
   once if that parent is already gone (prctl(2)).
2. `setrlimit(RLIMIT_AS)` caps the address space at the task's `memory_limit_bytes`, and
   `setrlimit(RLIMIT_CPU)` caps CPU seconds at `cpu_limit_s` (SIGXCPU at the soft limit, SIGKILL
   at the hard one; setrlimit(2)). RLIMIT_AS counts every mapping, and a CUDA/ROCm runtime maps
   far more virtual memory than it uses: a GPU pool may need RLIMIT_DATA instead (the task's
   `memory_rlimit`: "as" or "data").
3. Writes the release's files into `code/`, builds the twin from them, runs the measurement and
   writes `result.json` ({"ok": true, "result": ...} or {"ok": false, "kind", "reason", ...}).

The parent enforces the wall-clock limit and kills the whole process group.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
import traceback

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
RESULT_FILE = "result.json"


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel for SIGKILL when the parent dies (Linux only; elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def set_limits(memory_limit_bytes: int, cpu_limit_s: int, memory_rlimit: str = "as") -> None:
    """Cap address space (or data segment) and CPU seconds, never above the inherited hard
    limits. Raises `ValueError` for an unknown `memory_rlimit`."""
    which = {"as": resource.RLIMIT_AS, "data": resource.RLIMIT_DATA}.get(memory_rlimit)
    if which is None:
        raise ValueError(f"memory_rlimit must be 'as' or 'data', not {memory_rlimit!r}")
    for limit, value, hard_extra in (
        (which, memory_limit_bytes, 0),
        (resource.RLIMIT_CPU, cpu_limit_s, 5),
    ):
        _soft, hard = resource.getrlimit(limit)
        soft = value if hard == resource.RLIM_INFINITY else min(value, hard)
        new_hard = hard if hard != resource.RLIM_INFINITY or not hard_extra else soft + hard_extra
        resource.setrlimit(limit, (soft, new_hard))


def _write(payload: dict) -> None:
    with open(RESULT_FILE + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(payload, fh)
    os.replace(RESULT_FILE + ".tmp", RESULT_FILE)


def main() -> None:
    die_with_parent(int(sys.argv[1]))
    task = json.load(sys.stdin)
    set_limits(
        int(task["memory_limit_bytes"]), int(task["cpu_limit_s"]), task.get("memory_rlimit", "as")
    )
    try:
        code_dir = os.path.abspath("code")
        os.makedirs(code_dir)
        for name, text in task["files"].items():
            with open(os.path.join(code_dir, os.path.basename(name)), "w", encoding="utf-8") as fh:
                fh.write(text)
        with open(os.path.join(code_dir, "config.json"), "w", encoding="utf-8") as fh:
            json.dump(task["config"], fh)
        from engine.remote_code.sandbox import measure_in_child

        _write({"ok": True, "result": measure_in_child(task, code_dir)})
    except MemoryError as exc:
        _write({"ok": False, "kind": "memory", "reason": f"MemoryError: {exc}"})
    except BaseException as exc:
        from engine.contract import StageFailed

        if isinstance(exc, StageFailed):
            payload = {"ok": False, "kind": "failed", "reason": exc.reason}
            payload["result"] = getattr(exc, "result", None)
            _write(payload)
            return
        text = f"{type(exc).__name__}: {exc}"
        memory = "can't allocate memory" in text or "out of memory" in text.lower()
        trace = traceback.format_exc()[-2000:]
        _write(
            {"ok": False, "kind": "memory" if memory else "error", "reason": text, "trace": trace}
        )


if __name__ == "__main__":
    main()

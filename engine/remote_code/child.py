"""Entry point of the remote-code sandbox's child process (see `engine.remote_code.sandbox`).

Run inside bubblewrap (`engine.remote_code.bwrap`) as `python -m engine.remote_code.child`,
in its work folder, a task (JSON) on stdin. In this order, before it imports torch,
transformers or the release's code:

1. When bwrap started it as root (a worker that runs as root), it drops to nobody
   (`drop_privileges`): the task's groups, then gid and uid 65534, and checks that no
   capability is left; it exits at once otherwise.
2. `setrlimit(RLIMIT_AS)` caps the address space at the task's `memory_limit_bytes`,
   `RLIMIT_CPU` the CPU seconds at `cpu_limit_s` (SIGXCPU at the soft limit, SIGKILL at the hard
   one), `RLIMIT_NPROC` the processes and threads of its uid at `process_limit`, and
   `RLIMIT_FSIZE` any file it writes at `file_limit_bytes` (setrlimit(2)). RLIMIT_AS counts every
   mapping, and a CUDA/ROCm runtime maps far more virtual memory than it uses: a GPU pool may
   need RLIMIT_DATA instead (the task's `memory_rlimit`: "as" or "data").
3. Builds the twin from the release's files in the read-only `code_dir`, runs the measurement
   and writes `result.json` ({"ok": true, "result": ...} or {"ok": false, "kind", "reason",
   ...}) into its work folder.

The parent enforces the wall-clock limit; bwrap's PID namespace ends every process the code
started when this one exits or is killed.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import traceback

RESULT_FILE = "result.json"


def drop_privileges(uid: int, gid: int, groups: list[int]) -> None:
    """As root (bwrap without a user namespace): keep only `groups`, become `gid` and `uid`,
    and exit (status 3, nothing run) if any capability survives. A no-op when not root."""
    if os.getuid() != 0 and os.geteuid() != 0:
        return
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() == 0 or os.geteuid() == 0 or _effective_capabilities() != 0:
        sys.stderr.write("the sandbox could not drop root\n")
        os._exit(3)


def _effective_capabilities() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return -1


def set_limits(
    memory_limit_bytes: int,
    cpu_limit_s: int,
    memory_rlimit: str = "as",
    *,
    process_limit: int | None = None,
    file_limit_bytes: int | None = None,
) -> None:
    """Cap address space (or data segment, bytes), CPU seconds, and where given the processes
    and threads of this uid and the size of any file written (bytes), never above the inherited
    hard limits. The hard limits come down with the soft ones (the CPU's 5 s above it, for
    SIGXCPU before SIGKILL). Raises `ValueError` for an unknown `memory_rlimit`."""
    which = {"as": resource.RLIMIT_AS, "data": resource.RLIMIT_DATA}.get(memory_rlimit)
    if which is None:
        raise ValueError(f"memory_rlimit must be 'as' or 'data', not {memory_rlimit!r}")
    limits = [(which, memory_limit_bytes, 0), (resource.RLIMIT_CPU, cpu_limit_s, 5)]
    if process_limit is not None:
        limits.append((resource.RLIMIT_NPROC, process_limit, 0))
    if file_limit_bytes is not None:
        limits.append((resource.RLIMIT_FSIZE, file_limit_bytes, 0))
    for limit, value, hard_extra in limits:
        _soft, hard = resource.getrlimit(limit)
        soft = value if hard == resource.RLIM_INFINITY else min(value, hard)
        # the hard limit too, so the release's code cannot raise the soft one back
        ceiling = soft + hard_extra
        new_hard = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
        resource.setrlimit(limit, (soft, new_hard))


def _write(payload: dict) -> None:
    with open(RESULT_FILE + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(payload, fh)
    os.replace(RESULT_FILE + ".tmp", RESULT_FILE)


def main() -> None:
    task = json.load(sys.stdin)
    drop_privileges(int(task["uid"]), int(task["gid"]), [int(g) for g in task["groups"]])
    set_limits(
        int(task["memory_limit_bytes"]),
        int(task["cpu_limit_s"]),
        task.get("memory_rlimit", "as"),
        process_limit=int(task["process_limit"]),
        file_limit_bytes=int(task["file_limit_bytes"]),
    )
    try:
        from engine.remote_code.sandbox import measure_in_child

        _write({"ok": True, "result": measure_in_child(task, task["code_dir"])})
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

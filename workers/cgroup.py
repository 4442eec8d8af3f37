"""The kernel's count of OOM kills in this process's memory cgroup, to tell an out-of-memory
kill from another SIGKILL.

The runner records the count when an attempt starts (`StageRun.attempts[i]
["oom_kills_at_start"]`); when the worker's main process learns that the child running it was
killed (`workers.requests.StageRequest`), a count that grew meanwhile says the kernel killed it
for memory. cgroup v2: `oom_kill` in `memory.events` of the cgroup named by the "0::" line of
/proc/self/cgroup (in a container with its own cgroup namespace that is "/", so
/sys/fs/cgroup/memory.events); cgroup v1: `oom_kill` in the memory controller's
`memory.oom_control`. None where neither can be read (no Linux, no memory controller).
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def memory_events_paths(proc_self_cgroup: str, *, root: Path = CGROUP_ROOT) -> list[Path]:
    """The files that may hold this process's cgroup's `oom_kill` count, most specific first,
    from the text of /proc/self/cgroup: cgroup v2's memory.events of its own cgroup, then of the
    root it sees; cgroup v1's memory.oom_control of its memory cgroup, then of that mount's
    root."""
    v2: list[Path] = []
    v1: list[Path] = []
    for line in proc_self_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        relative = path.strip().lstrip("/")
        if hierarchy == "0" and controllers == "":
            v2.append(root / relative / "memory.events")
        elif "memory" in controllers.split(","):
            v1.append(root / "memory" / relative / "memory.oom_control")
    candidates = [*v2, root / "memory.events", *v1, root / "memory" / "memory.oom_control"]
    return list(dict.fromkeys(candidates))


def read_oom_kills(path: Path) -> int | None:
    """The `oom_kill` count in a memory.events or memory.oom_control file; None when the file
    is missing or has none."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            try:
                return int(value.strip())
            except ValueError:
                return None
    return None


def oom_kill_count(
    *, proc_self_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT
) -> int | None:
    """How many processes of this process's memory cgroup the kernel has OOM-killed so far
    (cumulative); None where it cannot be read."""
    try:
        text = proc_self_cgroup.read_text()
    except OSError:
        text = ""
    for path in memory_events_paths(text, root=root):
        count = read_oom_kills(path)
        if count is not None:
            return count
    return None

"""The bubblewrap (`bwrap`) command line that confines the remote-code child.

The child runs in new network, PID, IPC, UTS and mount namespaces (and a cgroup namespace where
the kernel allows one): no network at all (only its own loopback), no view of the worker's
processes, and every process it starts dies with it (when the namespace's first process exits,
the kernel kills the rest, `setsid` or not). Its filesystem is a fresh tmpfs holding read-only
binds of only what it needs:

- the system's libraries and programs (/usr, and /bin, /lib... as the host has them), the
  loader's cache and a few /etc files (`ETC_FILES`), a passwd/group naming only root and nobody;
- the Python environment (`sys.prefix` and the interpreter it points to) and the repository's
  `engine/` package, at their own paths;
- the release's files at `CODE_DIR`;

and, writable: a private tmpfs /tmp (`tmp_bytes` at most) and its own work folder at `WORK_DIR`.
The tmpfs root and /dev are remounted read-only once built: without a user namespace root owns
them, but with one the sandbox's uid does, and writing there would take memory (a tmpfs) that
`RLIMIT_AS` does not count and no `--size` caps.
Its environment is only what `env` holds (`--clearenv`). `--die-with-parent` kills it when the
worker process dies, and `--new-session` keeps it off the worker's terminal.

It runs as nobody (uid and gid `SANDBOX_UID`), never root. A worker that is not root runs bwrap
with a user namespace mapping its own uid to nobody. A worker that runs as root would map nobody
to root outside (uid 0, which the kernel exempts from `RLIMIT_NPROC`), so there bwrap runs without
a user namespace, keeps only CAP_SETUID and CAP_SETGID, and the child drops to the real uid 65534
before it reads the release's code (`child.drop_privileges`). bwrap sets no_new_privs, so nothing
inside can regain privileges, and a seccomp filter (`seccomp.py`) refuses new user namespaces.

`DAY0_BWRAP` names the bwrap program (default `bwrap` on PATH).
"""

from __future__ import annotations

import glob
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from engine.paths import var_dir
from engine.remote_code import seccomp

BWRAP_ENV = "DAY0_BWRAP"
SANDBOX_UID = 65534
SANDBOX_GID = 65534
CODE_DIR = "/sandbox/code"
WORK_DIR = "/sandbox/work"
# /etc files the loader and Python read; the rest of /etc (and its secrets) stays outside.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives")
# Top-level system folders: bound read-only, or re-created as the symlinks a merged /usr has.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Device nodes an accelerator's runtime opens, by pool backend (torch device type); a "cpu"
# pool gets none beyond bwrap's minimal /dev.
DEVICE_GLOBS = {
    "cuda": ("/dev/nvidia*", "/dev/nvidia-caps", "/dev/dri", "/dev/kfd"),
    "xpu": ("/dev/dri",),
}
PASSWD = (
    "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
    f"nobody:x:{SANDBOX_UID}:{SANDBOX_GID}:nobody:{WORK_DIR}/home:/usr/sbin/nologin\n"
)
GROUP = f"root:x:0:\nnogroup:x:{SANDBOX_GID}:\n"
PROBE_TIMEOUT_S = 60


class SandboxUnavailable(Exception):
    """bubblewrap is missing or cannot confine a process on this worker (`reason` says which):
    remote code is refused, never run without it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def bwrap_executable() -> str:
    """The bwrap program's path: `DAY0_BWRAP` (a path or a name on PATH), default "bwrap".
    Raises `SandboxUnavailable` when it is not an executable file."""
    wanted = os.environ.get(BWRAP_ENV) or "bwrap"
    found = shutil.which(wanted)
    if found is None:
        raise SandboxUnavailable(
            f"bubblewrap ({wanted!r}, set by {BWRAP_ENV}) is not installed on this worker "
            "(Debian/Ubuntu: apt-get install bubblewrap)"
        )
    return found


def _covered(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def python_roots() -> list[str]:
    """The folders the interpreter needs, outermost only: the environment (`sys.prefix`),
    the interpreter it was made from (`sys.base_prefix`, where a venv's python links to) and
    their exec prefixes, resolved through symlinks."""
    paths = {
        os.path.realpath(p)
        for p in (
            sys.prefix,
            sys.exec_prefix,
            sys.base_prefix,
            sys.base_exec_prefix,
            os.path.dirname(os.path.realpath(sys.executable)),
        )
    }
    paths |= {os.path.abspath(sys.prefix)}  # a venv is entered by its own path
    return _outermost(paths)


def _outermost(paths: Iterable[str]) -> list[str]:
    kept: list[str] = []
    for path in sorted(set(paths), key=lambda p: (p.count("/"), p)):
        if not _covered(path, kept):
            kept.append(path)
    return kept


def _library_dirs(env: Mapping[str, str], keep_out: Iterable[str]) -> list[str]:
    """LD_LIBRARY_PATH's existing folders (a GPU runtime's libraries may live there), but
    never the root folder (that would bind the whole host) nor one holding a folder of
    `keep_out` (the checkout with its `.env`, the var folder with a SQLite database): an
    operator's `LD_LIBRARY_PATH=/work` must not show those to the release's code."""
    value = env.get("LD_LIBRARY_PATH", "")
    found = [os.path.realpath(p) for p in value.split(":") if p and os.path.isdir(p)]
    private = [os.path.realpath(p) for p in keep_out]
    return [
        path
        for path in found
        if path != "/" and not any(_covered(inner, [path]) for inner in private)
    ]


def device_nodes(backend: str) -> list[str]:
    """The host's device nodes (and folders of them) a `backend` pool's runtime opens."""
    found: list[str] = []
    for pattern in DEVICE_GLOBS.get(backend, ()):
        found.extend(sorted(glob.glob(pattern)))
    return found


def device_groups(nodes: Sequence[str]) -> list[int]:
    """The groups that may open `nodes` (a render or video group), for nobody to keep: device
    nodes are often mode 0660."""
    gids: set[int] = set()
    for node in nodes:
        for path in [node, *glob.glob(os.path.join(node, "*"))] if os.path.isdir(node) else [node]:
            try:
                info = os.stat(path)
            except OSError:
                continue
            if stat.S_ISCHR(info.st_mode) and info.st_mode & 0o060 and info.st_gid != 0:
                gids.add(info.st_gid)
    return sorted(gids)


def runs_as_root() -> bool:
    """Whether this worker is root: then bwrap runs without a user namespace and the child
    drops to nobody itself (module docstring)."""
    return os.geteuid() == 0


class _Args:
    """bwrap's options in order, creating each bind's parent folders mode 0755 first (bwrap
    would create them 0700, which nobody cannot enter)."""

    def __init__(self) -> None:
        self.args: list[str] = []
        self._dirs: set[str] = {"/"}

    def _parents(self, dest: str) -> None:
        parents = list(Path(dest).parents)[::-1]
        for parent in (str(p) for p in parents):
            if parent not in self._dirs:
                self._dirs.add(parent)
                self.args += ["--perms", "0755", "--dir", parent]

    def bind(self, option: str, source: str, dest: str) -> None:
        self._parents(dest)
        self._dirs.add(dest)
        self.args += [option, source, dest]


def command(
    *,
    bwrap: str,
    code_dir: str,
    work_dir: str,
    etc_dir: str,
    repo_root: Path,
    env: Mapping[str, str],
    backend: str,
    tmp_bytes: int,
    as_root: bool,
    seccomp_fd: int | None,
    argv: Sequence[str],
) -> list[str]:
    """The whole bwrap command line running `argv` (the child, by absolute paths) confined.

    `code_dir` (host) is bound read-only at `CODE_DIR`, `work_dir` (host, writable by nobody)
    at `WORK_DIR`, the cwd; `etc_dir` holds the passwd and group written from `PASSWD` and
    `GROUP`. `env` is the child's whole environment. `backend` picks the device nodes
    (`DEVICE_GLOBS`); `tmp_bytes` caps /tmp; `as_root` as `runs_as_root`; `seccomp_fd` holds
    `seccomp.program()` (None: no filter), to be passed to bwrap (`pass_fds`).
    """
    out = _Args()
    out.args += [
        bwrap,
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "day0-sandbox",
        "--die-with-parent",
        "--new-session",
    ]
    if as_root:
        # no user namespace: nobody would map to root outside (module docstring)
        out.args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        out.args += ["--unshare-user", "--disable-userns"]
        out.args += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    # The private /tmp first: a checkout or venv under /tmp (a CI clone in `mktemp -d`) is
    # bound on top of it below, where a tmpfs mounted afterwards would hide it.
    out.args += ["--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    out._dirs.add("/tmp")
    system = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            out.args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            out.bind("--ro-bind", path, path)
            system.append(path)
    for name in ETC_FILES:
        path = os.path.join("/etc", name)
        if os.path.exists(path):
            out.bind("--ro-bind", path, path)
    for name in ("passwd", "group"):
        out.bind("--ro-bind", os.path.join(etc_dir, name), f"/etc/{name}")
    cpu = "/sys/devices/system/cpu"  # the CPU count and topology torch reads
    if backend == "cpu" and os.path.isdir(cpu):
        out.bind("--ro-bind", cpu, cpu)
    elif backend != "cpu" and os.path.isdir("/sys"):
        out.bind("--ro-bind", "/sys", "/sys")  # a GPU runtime reads its PCI devices there
    private = (str(repo_root), str(var_dir()))
    roots = _outermost(
        [*python_roots(), str(repo_root / "engine"), *_library_dirs(env, keep_out=private)]
    )
    for path in roots:
        if not _covered(path, system):
            out.bind("--ro-bind", path, path)
    out.bind("--ro-bind", code_dir, CODE_DIR)
    out.bind("--bind", work_dir, WORK_DIR)
    out.args += ["--proc", "/proc", "--dev", "/dev"]
    for node in device_nodes(backend):
        out.args += ["--dev-bind", node, node]
    # the root and /dev tmpfs read-only (module docstring); mounts on them keep their own mode
    out.args += ["--remount-ro", "/", "--remount-ro", "/dev"]
    if seccomp_fd is not None:
        out.args += ["--seccomp", str(seccomp_fd)]
    out.args += ["--chdir", WORK_DIR, "--clearenv"]
    for name, value in sorted(env.items()):
        out.args += ["--setenv", name, value]
    return [*out.args, "--", *argv]


def write_identity(etc_dir: str) -> None:
    """The sandbox's /etc/passwd and /etc/group (`PASSWD`, `GROUP`) into `etc_dir`."""
    os.makedirs(etc_dir, exist_ok=True)
    for name, text in (("passwd", PASSWD), ("group", GROUP)):
        with open(os.path.join(etc_dir, name), "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(os.path.join(etc_dir, name), 0o644)


def probe(build: Callable[[int | None], list[str]], python: str) -> None:
    """Start the sandbox `build(seccomp_fd)` makes around `python -I -c pass` (no release
    code): raises `SandboxUnavailable` with bwrap's own words when it cannot (no namespaces
    allowed, a missing mount point) or Python cannot start inside it within `PROBE_TIMEOUT_S`
    seconds."""
    with seccomp.filter_fd() as fd:
        full = build(fd)
        argv = [*full[: full.index("--") + 1], python, "-I", "-c", "pass"]
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=PROBE_TIMEOUT_S,
                env={"PATH": os.defpath},
                start_new_session=True,
                pass_fds=() if fd is None else (fd,),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailable(f"bubblewrap ({full[0]}) could not start: {exc}") from exc
    if done.returncode != 0:
        said = (done.stderr or done.stdout).decode("utf-8", "replace").strip()[-500:]
        raise SandboxUnavailable(
            f"bubblewrap ({full[0]}) cannot confine a process on this worker "
            f"(exit code {done.returncode}): {said or 'no message'}"
        )

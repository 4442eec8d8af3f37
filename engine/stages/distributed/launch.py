"""Launch the ranks with torchrun and supervise them: time limit, cancel, crash, clean-up.

`torchrun --standalone` (torch.distributed.run) starts the ranks with a c10d rendezvous on
localhost whose port the OS chooses (`localhost:0`), so two jobs on one worker host never
collide on a port. torchrun runs in its own session through `torchrun_child` (which ties it
to the stage's process with PR_SET_PDEATHSIG); each rank ties itself to torchrun the same way
and writes its pid file as it starts. Whatever the outcome, torchrun's children and every rank
pid still running this work folder are SIGKILLed, then torchrun's process group, before
`launch_ranks` returns. Each rank's stdout and stderr are kept under WORKDIR/logs by torchrun
(`--log-dir`, `--redirects 3`) for the failing rank's log excerpt.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine.contract import raise_if_cancelled

# Lines of a failing rank's log shown in the stage's failure reason.
EXCERPT_LINES = 12
POLL_S = 0.2


@dataclass
class LaunchOutcome:
    """How the ranks ended.

    `status` is "ok" (torchrun exited 0), "failed" (it exited non-zero: a rank crashed or was
    killed, and torchrun stopped the others) or "timeout" (still running after `timeout_s`:
    everything was killed). `exit_code` is torchrun's; `elapsed_s` wall-clock seconds;
    `rank_logs` [{"rank", "exit_code" (None when unknown), "excerpt" (last lines of its
    stdout and stderr), "phase" (the last of `rank.PHASES` it reached), "stack" and
    "in_collective" (its Python stack when the time limit hit, `last_stack`, and whether it was
    inside torch.distributed)}] for every rank that left a log; `pids` {"launcher": torchrun's pid,
    "ranks": {rank: pid}} of the processes it ran (all dead when it returns).
    """

    status: str
    exit_code: int | None
    elapsed_s: float
    rank_logs: list[dict] = field(default_factory=list)
    launcher_excerpt: str = ""
    pids: dict = field(default_factory=dict)


def _tail(path: Path, lines: int = EXCERPT_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    # Progress bars, Python's warnings, the profiler's trace points and faulthandler's stack
    # dump (kept apart as "stack") are noise in an excerpt; everything else is kept.
    # faulthandler heads a dump "Stack (most recent call first):" when it dumps one thread
    # (rank.py registers it so), "Thread 0x…"/"Current thread 0x…" when it dumps them all.
    noise = ("warnings.warn", "File ", "Current thread", "Thread 0x", "Stack (most recent", "USDT:")
    kept = [
        line
        for line in text.splitlines()
        if line.strip()
        and "it/s]" not in line
        and "Warning:" not in line
        and not line.lstrip().startswith(noise)
    ]
    return "\n".join(kept[-lines:])


def rank_logs(logs_dir: Path, world_size: int, phases: dict[int, str]) -> list[dict]:
    """Each rank's log excerpt from torchrun's log folder (<dir>/<run>/attempt_0/<rank>/), with
    the step it reached (`phases`)."""
    out = []
    for rank in range(world_size):
        found = sorted(logs_dir.glob(f"*/attempt_*/{rank}"))
        if not found:
            continue
        folder = found[-1]
        excerpt = "\n".join(
            part for part in (_tail(folder / "stdout.log"), _tail(folder / "stderr.log")) if part
        )
        stack = last_stack(_read(folder / "stderr.log"))
        out.append(
            {
                "rank": rank,
                "exit_code": None,
                "excerpt": excerpt,
                "phase": phases.get(rank),
                # Where it was when the launcher asked (SIGUSR1, faulthandler), innermost last.
                "stack": stack,
                "in_collective": any("torch/distributed/" in frame for frame in stack),
            }
        )
    return out


def last_stack(stderr: str) -> list[str]:
    """The frames of the last faulthandler dump in a rank's stderr ("File ..., line N in f"),
    outermost first; [] when it holds none."""
    lines = stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if "(most recent call first):" in line]
    if not starts:
        return []
    frames = []
    for line in lines[starts[-1] + 1 :]:
        if not line.strip().startswith("File "):
            break
        frames.append(line.strip())
    return frames[::-1]


def dump_stacks(pids: list[int], workdir: Path, wait_s: float = 1.0) -> None:
    """Ask each rank still running `workdir` to write its Python stack to its stderr (SIGUSR1:
    `faulthandler`, registered by rank.py), then give them `wait_s` seconds to do it."""
    asked = [pid for pid in pids if str(workdir) in _cmdline(pid)]
    for pid in asked:
        try:
            os.kill(pid, signal.SIGUSR1)
        except (ProcessLookupError, PermissionError):
            continue
    if asked:
        time.sleep(wait_s)


def rank_pids(workdir: Path, world_size: int) -> dict[int, int]:
    """{rank: pid} from the pid files the ranks wrote as they started."""
    pids = {}
    for rank in range(world_size):
        try:
            pids[rank] = int((workdir / f"rank{rank}.pid").read_text())
        except (OSError, ValueError):
            continue
    return pids


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def children(pid: int) -> list[int]:
    """Pids of the live processes whose parent is `pid` (Linux /proc; [] elsewhere)."""
    out = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and fields[1] == str(pid) and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def kill_ranks(pids: list[int], workdir: Path) -> list[int]:
    """SIGKILL each pid still running a rank of `workdir` (its command line names the folder:
    a pid reused by another process is left alone); returns the pids killed."""
    killed = []
    for pid in pids:
        if str(workdir) not in _cmdline(pid):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
        killed.append(pid)
    return killed


def rank_phases(workdir: Path, world_size: int) -> dict[int, str]:
    """{rank: the last step it reached} (`rank.PHASES`), from its phase file."""
    phases = {}
    for rank in range(world_size):
        try:
            phases[rank] = (workdir / f"rank{rank}.phase").read_text().strip()
        except OSError:
            continue
    return phases


def launch_ranks(
    workdir: Path,
    *,
    world_size: int,
    threads_per_rank: int,
    timeout_s: float,
    cancelled: Callable[[], bool],
    env: dict[str, str] | None = None,
) -> LaunchOutcome:
    """Run `world_size` ranks of `rank.py` on WORKDIR and wait for them (see the module doc):
    `threads_per_rank` torch threads each, for at most `timeout_s` seconds (wall clock).

    Returns a `LaunchOutcome`; a rank that fails or hangs is an outcome, not an exception.
    Raises `StageCancelled` (after killing everything) when `cancelled()` turns true.
    """
    logs_dir = workdir / "logs"
    logs_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "engine.stages.distributed.torchrun_child",
        "--standalone",
        f"--nproc-per-node={world_size}",
        f"--log-dir={logs_dir}",
        "--redirects=3",
        "-m",
        "engine.stages.distributed.rank",
        str(workdir),
    ]
    child_env = dict(os.environ)
    child_env.update(
        {
            "OMP_NUM_THREADS": str(threads_per_rank),
            "PYTHONUNBUFFERED": "1",
            "TORCHELASTIC_ERROR_FILE": str(workdir / "error.json"),
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "TRANSFORMERS_VERBOSITY": "error",
        }
    )
    child_env.update(env or {})
    start = time.monotonic()
    with open(workdir / "launcher.log", "wb") as launcher_log:
        proc = subprocess.Popen(
            command,
            stdout=launcher_log,
            stderr=subprocess.STDOUT,
            env=child_env,
            cwd=str(Path(__file__).resolve().parents[3]),
            start_new_session=True,
        )
        status = "timeout"
        try:
            while time.monotonic() - start < timeout_s:
                if proc.poll() is not None:
                    status = "ok" if proc.returncode == 0 else "failed"
                    break
                raise_if_cancelled(cancelled)
                time.sleep(POLL_S)
        finally:
            pids = rank_pids(workdir, world_size)
            running = sorted({*children(proc.pid), *pids.values()})
            if status == "timeout" and proc.poll() is None:
                # Which rank waits in a collective and which does not tells the hung one.
                dump_stacks(running, workdir)
            # Ranks run in sessions of their own: killed by pid (those torchrun started and
            # those that wrote a pid file), before torchrun itself.
            kill_ranks(running, workdir)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    outcome = LaunchOutcome(
        status=status,
        exit_code=proc.returncode if status != "timeout" else None,
        elapsed_s=time.monotonic() - start,
        rank_logs=rank_logs(logs_dir, world_size, rank_phases(workdir, world_size)),
        pids={"launcher": proc.pid, "ranks": pids},
        launcher_excerpt=_tail(workdir / "launcher.log"),
    )
    codes = exit_codes(_read(workdir / "launcher.log"))
    for entry in outcome.rank_logs:
        entry["exit_code"] = codes.get(entry["rank"])
    return outcome


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def exit_codes(launcher_output: str) -> dict[int, int]:
    """{rank: exit code} from torchrun's failure summary ("rank : 1 (local_rank: 1)" then
    "exitcode : -9 (pid: ...)"); empty when it printed none."""
    codes: dict[int, int] = {}
    current: int | None = None
    for line in launcher_output.splitlines():
        key, _, value = line.strip().partition(":")
        words = value.split()
        if not words:
            continue
        if key.strip() == "rank":
            current = int(words[0]) if words[0].lstrip("-").isdigit() else None
        elif key.strip() == "exitcode" and current is not None and words[0].lstrip("-").isdigit():
            codes[current] = int(words[0])
    return codes

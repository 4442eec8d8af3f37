"""Keeps one process running: `python -m workers.supervise --name worker -- celery -A day0web
worker ...` runs the command and starts it again when it dies on its own, so that a Celery
worker SIGKILLed by the OOM killer or an operator comes back without stopping the rest of
`make run` (honcho stops every process of the Procfile as soon as one exits).

The rules:

- The child exits 0: it stopped on purpose (a warm shutdown after `kill -TERM`); the supervisor
  exits 0 too and does not start it again.
- The child exits non-zero, or is killed by a signal the supervisor did not receive itself:
  it is started again after a back-off (2 s, doubling while it keeps dying within a minute of
  its start, at most 30 s), logging e.g. "worker exited by SIGKILL; restarting in 2 s".
- The supervisor gets SIGTERM or SIGINT: it sends the child SIGTERM (for a Celery worker, a
  warm shutdown; SIGINT is not passed on as SIGINT because a child in the same process group
  as the sender, as under honcho or a terminal, has had it already, and Celery takes a second
  SIGINT as "cold shutdown now"), starts nothing more, and exits with the child's status once it
  has gone (128 + N for a child killed by signal N).
- The child stays in the supervisor's process group, so honcho's SIGKILL of the group after
  its 5 s grace reaches it too. On Linux it also gets SIGTERM if the supervisor alone is killed.

Standard library only: it runs before Django or Celery is imported, and knows nothing of them.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

logger = logging.getLogger("workers.supervise")

BACKOFF_MAX_S = 30.0
# A child that ran at least this long before dying starts the back-off from the beginning.
STABLE_AFTER_S = 60.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_PR_SET_PDEATHSIG = 1


def exit_description(returncode: int) -> str:
    """How a child ended, in a log's words: "by SIGKILL" or "with code 1"."""
    if returncode < 0:
        try:
            return f"by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"by signal {-returncode}"
    return f"with code {returncode}"


def next_backoff_s(*, previous_s: float | None, ran_s: float, initial_s: float) -> float:
    """The wait before the next start: `initial_s` after a child that ran a while (or the first
    time), else double the previous wait, capped at BACKOFF_MAX_S."""
    if previous_s is None or ran_s >= STABLE_AFTER_S:
        return initial_s
    return min(previous_s * 2, max(BACKOFF_MAX_S, initial_s))


def _terminate_with_parent() -> None:
    """In the child, before exec: SIGTERM when the supervisor dies (Linux's PR_SET_PDEATHSIG),
    so that a supervisor killed alone leaves no worker behind."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


class Supervisor:
    def __init__(
        self,
        command: Sequence[str],
        *,
        name: str,
        backoff_s: float = 2.0,
    ) -> None:
        self.command = list(command)
        self.name = name
        self.backoff_s = backoff_s
        self.stop_signal: int | None = None
        self._child: subprocess.Popen[bytes] | None = None

    def _on_stop_signal(self, signum: int, _frame: object) -> None:
        first = self.stop_signal is None
        self.stop_signal = signum
        if first:
            logger.info("%s: %s received; stopping it", self.name, signal.Signals(signum).name)
        if self._child is not None:
            # Popen.send_signal signals only a child not reaped yet (its pid is still its own).
            self._child.send_signal(signal.SIGTERM)

    def _start(self) -> subprocess.Popen[bytes]:
        child = subprocess.Popen(self.command, preexec_fn=_terminate_with_parent)
        logger.info("%s started (pid %d): %s", self.name, child.pid, " ".join(self.command))
        return child

    def _wait_unless_stopped(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.stop_signal is None and time.monotonic() < deadline:
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))

    def run(self) -> int:
        """Run the command until it exits 0 or the supervisor is told to stop; the exit
        status to leave with."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_stop_signal)
        backoff_s: float | None = None
        while True:
            started = time.monotonic()
            try:
                self._child = self._start()
            except OSError as error:
                # The command is not there (or not executable): starting again will not help.
                logger.error("%s cannot start %s: %s", self.name, self.command[0], error)
                return 127
            if self.stop_signal is not None:  # a stop that came in while it was starting
                self._child.send_signal(signal.SIGTERM)
            returncode = self._child.wait()
            status = 128 - returncode if returncode < 0 else returncode
            if self.stop_signal is not None:
                logger.info("%s exited %s; stopped", self.name, exit_description(returncode))
                return status
            if returncode == 0:
                logger.info("%s exited with code 0; not restarting", self.name)
                return 0
            backoff_s = next_backoff_s(
                previous_s=backoff_s,
                ran_s=time.monotonic() - started,
                initial_s=self.backoff_s,
            )
            logger.warning(
                "%s exited %s; restarting in %g s",
                self.name,
                exit_description(returncode),
                backoff_s,
            )
            self._wait_unless_stopped(backoff_s)
            if self.stop_signal is not None:
                logger.info("%s not restarted; stopped", self.name)
                return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workers.supervise",
        description="Run COMMAND; start it again when it dies on its own (not when it exits 0 "
        "or when this process is told to stop).",
    )
    parser.add_argument("--name", default="child", help="the name the log lines use")
    parser.add_argument(
        "--backoff-s",
        type=float,
        default=2.0,
        help=f"seconds before the first restart (doubling up to {BACKOFF_MAX_S:g} s)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (python -m workers.supervise -- COMMAND ...)")
    if args.backoff_s <= 0:
        parser.error("--backoff-s must be positive")
    logging.basicConfig(
        level=logging.INFO, format="[supervise] %(message)s", stream=sys.stderr, force=True
    )
    return Supervisor(command, name=args.name, backoff_s=args.backoff_s).run()


if __name__ == "__main__":
    sys.exit(main())

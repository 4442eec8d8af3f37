"""Tie a process's life to its parent's, so no rank or launcher outlives the stage."""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (prctl PR_SET_PDEATHSIG), so a
    process whose parent was killed by a hard time limit does not run on. A no-op elsewhere.
    Safe between fork and exec (no imports, one libc call)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

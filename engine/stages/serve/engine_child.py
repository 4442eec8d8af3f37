"""Runs inside the engine's own Python (stdlib only): dies with the worker, then runs the
engine's module as `python -m` would.

`python engine_child.py <module> <args...>`: asks Linux to send SIGKILL to this process when
its parent (the day0 worker) dies (`prctl(PR_SET_PDEATHSIG)`), so an engine never outlives a
worker killed with SIGKILL; the engine's own children are killed by the stage through its
process group (`process.EngineProcess.stop`).
"""

import ctypes
import os
import runpy
import signal
import sys

# This folder's modules (metrics.py, process.py, options.py...) must not shadow the engine's
# own imports of the same names: drop the script's folder from the path.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the stage's cleanup still kills the group
        pass


if __name__ == "__main__":
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the worker died before the request took effect
        sys.exit(1)
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)

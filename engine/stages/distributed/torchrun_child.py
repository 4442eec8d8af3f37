"""`python -m engine.stages.distributed.torchrun_child ARGS`: torchrun tied to its parent.

Sets the parent-death signal (`lifetime.die_with_parent`) and then runs torchrun
(`torch.distributed.run`) with ARGS in this process, so the launcher dies with the stage's
process even when a hard time limit SIGKILLs it. Done here rather than in a `preexec_fn`, which
is unsafe in a process with threads (the runner's heartbeat thread).
"""

from __future__ import annotations

import os
import runpy
import sys

from engine.stages.distributed.lifetime import die_with_parent

if __name__ == "__main__":
    die_with_parent()
    if os.getppid() == 1:  # the stage's process died before the signal was armed
        sys.exit(1)
    sys.argv = ["torchrun", *sys.argv[1:]]
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)

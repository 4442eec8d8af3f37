"""Where the engine keeps files on a worker: under `DAY0_VAR_DIR` when the worker has one (the
Django settings export it), else under the system's temporary folder. Read at call time, not at
import, so a test or a worker that sets it later is honoured."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def var_dir(*parts: str) -> Path:
    """`<DAY0_VAR_DIR or tempdir>/<parts...>` (not created)."""
    return Path(os.environ.get("DAY0_VAR_DIR") or tempfile.gettempdir()).joinpath(*parts)

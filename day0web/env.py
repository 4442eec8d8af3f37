"""Typed readers for settings taken from the environment.

Each reader refuses a malformed value with `ImproperlyConfigured` instead of falling back
silently, so a typo in `.env` stops the process at start-up with the variable's name.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from ipaddress import IPv4Network, IPv6Network, ip_network

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_str(name: str, default: str) -> str:
    """The variable's value, or `default` when it is unset or blank."""
    value = os.environ.get(name)
    return default if value is None or value.strip() == "" else value


def env_bool(name: str, default: bool) -> bool:
    """A boolean: 1/true/yes/on or 0/false/no/off (case-insensitive)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false).")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    """An integer, at least `minimum` when one is given."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer.") from exc
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below its minimum {minimum}.")
    return value


def env_float(
    name: str, default: float, *, minimum: float | None = None, maximum: float | None = None
) -> float:
    """A finite number, within `minimum`..`maximum` where given."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number.") from exc
    if value != value or value in (float("inf"), float("-inf")):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a finite number.")
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value:g} is below its minimum {minimum:g}.")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value:g} is above its maximum {maximum:g}.")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    """A comma-separated list; blanks are dropped."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


_RATE = re.compile(r"[1-9][0-9]*/(s|sec|second|m|min|minute|h|hour|d|day)")


def env_rate(name: str, default: str) -> str:
    """A request rate as Django REST framework reads it: "<count>/<period>" with the period
    s(ec), m(in), h(our) or d(ay), e.g. "60/min"."""
    value = env_str(name, default).strip()
    if not _RATE.fullmatch(value):
        raise ImproperlyConfigured(
            f"{name}={value!r} is not a rate: use <count>/<s|min|hour|day>, e.g. 60/min."
        )
    return value


def env_cache(name: str) -> dict[str, str]:
    """Django's default cache from a URL: blank, a per-process memory cache; redis:// or
    rediss://, Django's Redis cache shared by every process."""
    url = env_str(name, "").strip()
    if not url:
        return {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    if url.startswith(("redis://", "rediss://")):
        return {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url}
    raise ImproperlyConfigured(f"{name}={url!r}: use redis://host:port/db, or leave it blank.")


def env_stage_levels(
    name: str, default: Mapping[str, Sequence[str]], *, levels: Sequence[str]
) -> dict[str, list[str]]:
    """Stage names per level, as a JSON object: `{"experimental": ["fetch", "analyze"], ...}`.

    Every key is one of `levels`, every value a list of stage names (strings); a stage is
    named in one level at most, and a level left out needs no stage of its own. Returned with
    every level, in `levels` order. Whether the names are registered stages is checked once
    the stage registry can be read (`adaptation.readiness.readiness_thresholds_check`).
    """
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        value: object = {key: list(stages) for key, stages in default.items()}
    else:
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name} is not valid JSON: {exc}.") from exc
    example = '{"experimental": ["fetch", "analyze"], "functional": ["operators"], ...}'
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f"{name} must be a JSON object of levels: {example}.")
    if unknown := [key for key in value if key not in levels]:
        raise ImproperlyConfigured(
            f"{name}: unknown {'level' if len(unknown) == 1 else 'levels'} "
            f"{', '.join(map(repr, unknown))}; levels: "
            f"{', '.join(levels)}."
        )
    seen: dict[str, str] = {}
    result: dict[str, list[str]] = {}
    for level in levels:
        stages = value.get(level, [])
        if not isinstance(stages, list) or not all(isinstance(s, str) and s for s in stages):
            raise ImproperlyConfigured(f"{name}: {level} must be a list of stage names.")
        for stage in stages:
            if stage in seen:
                raise ImproperlyConfigured(
                    f"{name}: stage {stage!r} is named in {seen[stage]} and {level}; a level "
                    "already needs the stages of the levels below it."
                )
            seen[stage] = level
        result[level] = list(stages)
    return result


_HEADER_NAME = re.compile(r"[A-Za-z0-9-]+")


def env_header(name: str) -> tuple[str, str] | None:
    """An HTTP header and the value it must have, written "Name: value" (e.g.
    "X-Forwarded-Proto: https"), as Django's `SECURE_PROXY_SSL_HEADER` takes it: the header's
    META key ("HTTP_X_FORWARDED_PROTO") and the value. None when unset or blank."""
    raw = env_str(name, "").strip()
    if not raw:
        return None
    header, sep, value = raw.partition(":")
    header, value = header.strip(), value.strip()
    if not sep or not _HEADER_NAME.fullmatch(header) or not value:
        raise ImproperlyConfigured(
            f"{name}={raw!r} is not a header and its value: use e.g. X-Forwarded-Proto: https."
        )
    return "HTTP_" + header.upper().replace("-", "_"), value


def env_networks(name: str) -> list[IPv4Network | IPv6Network]:
    """A comma-separated list of networks in CIDR notation ("10.0.0.0/8, fd00::/8"; a bare
    address is its own /32 or /128); [] when unset or blank. Refuses a network with host
    bits set ("10.0.0.1/8"), which is a typo more often than not."""
    networks = []
    for item in env_list(name, []):
        try:
            networks.append(ip_network(item))
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name}: {item!r} is not a network: {exc}.") from exc
    return networks


def local_url(host: str, port: str) -> str:
    """The http URL of a server listening on `host`:`port` (`make run`'s DAY0_HOST and
    DAY0_PORT): an IPv6 address in brackets, and a wildcard address (0.0.0.0, ::), which is
    where one listens but no place to link to, as the loopback address."""
    host = host.strip().strip("[]")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://{f'[{host}]' if ':' in host else host}:{port.strip()}"

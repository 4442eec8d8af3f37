"""Typed readers for settings taken from the environment.

Each reader refuses a malformed value with `ImproperlyConfigured` instead of falling back
silently, so a typo in `.env` stops the process at start-up with the variable's name.
"""

from __future__ import annotations

import os
import re

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

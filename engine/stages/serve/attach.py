"""Attach mode (`kind: openai`): the serve stage's measurements against an OpenAI-compatible
endpoint a team already runs. Nothing is launched; the endpoint's address was checked by the
worker's outbound-address guard before the stage ran, and its API key is read from the worker's
environment variable `api_key_env` (never stored, never logged)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine.contract import StageContext

from .full_size import skipped
from .measure import measure
from .result import TPCheck
from .verdict import Measured

_SERVED_DTYPES = ("bfloat16", "float16", "float32")


def _reference_dtype(reference: str | None) -> str:
    if reference:
        with contextlib.suppress(OSError, ValueError):
            config = json.loads((Path(reference) / "config.json").read_text())
            dtype = str(config.get("torch_dtype") or config.get("dtype") or "")
            if dtype in _SERVED_DTYPES:
                return dtype
    return "bfloat16"


def attach(
    ctx: StageContext, settings: Mapping[str, Any], options: Mapping[str, Any]
) -> dict[str, Any]:
    """Precision (with the engine's `reference` folder), the sweep and the metrics against
    `settings["base_url"]`. Raises `StageFailed` (culprit infrastructure) when the endpoint
    does not answer or the key's variable is unset."""
    import httpx

    measured = Measured("attached")
    result = measured.result
    base_url = str(settings["base_url"])
    headers: dict[str, str] = {}
    api_key = None
    key_env = settings.get("api_key_env")
    if key_env:
        api_key = os.environ.get(str(key_env))
        if not api_key:
            raise measured.fail(
                "launch",
                f"the worker's environment has no {key_env} (the endpoint's API key)",
                culprit="infrastructure",
            )
        headers["Authorization"] = f"Bearer {api_key}"
    started = time.monotonic()
    try:
        with httpx.Client(timeout=30.0, headers=headers, follow_redirects=False) as client:
            models = client.get(f"{base_url}/v1/models")
            models.raise_for_status()
            served = [m.get("id") for m in models.json().get("data", []) if isinstance(m, dict)]
            version = ""
            with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError):
                answer = client.get(f"{base_url}/version")
                if answer.status_code == 200:
                    version = str(answer.json().get("version", ""))
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise measured.fail(
            "launch", f"the endpoint {base_url} does not answer: {exc}", culprit="infrastructure"
        ) from exc
    model = str(settings.get("model") or (served[0] if served else ""))
    if not model:
        raise measured.fail(
            "launch", f"the endpoint {base_url} serves no model", culprit="infrastructure"
        )
    result["engine"] = {
        "name": "openai",
        "version": version,
        "command": "",
        "launched_command": "",
        "command_diff": [],
        "base_url": base_url,
        "model": model,
        "answered_in_s": round(time.monotonic() - started, 3),
    }
    reference = str(settings["reference"]) if settings.get("reference") else None
    fetched = (ctx.previous.get("fetch") or {}).get("tokenizer") or {}
    tokenizer_dir = reference or (str(fetched["dir"]) if fetched.get("dir") else None)

    def answering() -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{base_url}/v1/models", headers=headers, timeout=5).is_success
        return False

    measure(
        ctx,
        measured,
        base_url=base_url,
        model=model,
        reference_dir=reference,
        tokenizer_dir=tokenizer_dir,
        dtype=_reference_dtype(reference),
        options=options,
        python=str(settings.get("python") or "python3"),
        version="",
        alive=answering,
        headers=headers,
        api_key=api_key,
    )
    result["tp"] = TPCheck(planned=None, launched=None, reason="not_launched_by_day0").to_dict()
    result["full_size"] = skipped("not_launched")
    return measured.conclude("attached")

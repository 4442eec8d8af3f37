"""The remote-code policy and its sandboxed runner.

A release whose architecture transformers lacks can only be twinned with the modeling code it
ships (`auto_map` in config.json naming `modeling_*.py` classes). Running that code is
`trust_remote_code`: off by default, allowed only when the release's org (the repo id before
"/") is in the pool's `trust_remote_code_orgs`. Allowed code never runs in the calling
process: a child process started with the multiprocessing "spawn" method (a fresh
interpreter, nothing inherited but the arguments) limits its own address space with
`resource.setrlimit(RLIMIT_AS)`, writes the fetched `*.py` files into a private temporary
folder, builds the twin from them, runs the stage's measurement and sends back a JSON-able
result through a pipe. The parent kills it when the time limit passes. A child that runs out
of time or memory, or dies, fails the stage with that reason.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import tempfile
import traceback
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from workers.stages.architecture.config_reader import unwrap_text_config
from workers.stages.base import PoolSpec, StageContext, StageFailed, StageTransientError

DEFAULT_TIME_LIMIT_S = 240.0
DEFAULT_MEMORY_LIMIT_BYTES = 16 * 1024**3


def fetched_config(ctx: StageContext) -> dict[str, Any]:
    """`ctx.previous["fetch"]["config"]`; `StageFailed` when the fetch stage left none."""
    fetched = ctx.previous.get("fetch")
    if not isinstance(fetched, dict) or not isinstance(fetched.get("config"), dict):
        raise StageFailed("the fetch stage produced no config.json to build a twin from")
    return fetched["config"]


def org_of(repo_id: str) -> str:
    """The org (or user) of a repo id: the part before "/"."""
    return repo_id.split("/", 1)[0]


def remote_code_allowed(repo_id: str, pool: PoolSpec) -> bool:
    """Whether the pool trusts the modeling code of `repo_id`'s org (case-insensitive)."""
    org = org_of(repo_id).lower()
    return any(org == allowed.lower() for allowed in pool.trust_remote_code_orgs)


def needs_remote_code(config: Mapping[str, Any]) -> bool:
    """True when transformers has neither the `architectures` class nor the `model_type`."""
    from workers.stages.twin.build import _transformers_class

    raw, _ = unwrap_text_config(config)
    model_cls, _cfg, _how = _transformers_class(
        raw.get("model_type"), list(raw.get("architectures") or [])
    )
    return model_cls is None


def modeling_file_names(config: Mapping[str, Any]) -> list[str]:
    """The `*.py` files `auto_map` refers to ("modeling_x.Cls" -> "modeling_x.py").

    A reference may name another repo ("org/repo--modeling_x.Cls"); that is refused.
    """
    raw, _ = unwrap_text_config(config)
    auto_map = raw.get("auto_map") or {}
    names: set[str] = set()
    for ref in auto_map.values():
        refs = ref if isinstance(ref, list) else [ref]
        for item in refs:
            if not isinstance(item, str):
                continue
            if "--" in item:
                raise StageFailed(
                    f"auto_map entry {item!r} points to another "
                    "repo; only the release's own code may run"
                )
            module = item.rsplit(".", 1)[0]
            names.add(f"{module}.py")
    return sorted(names)


def _limit_memory(limit_bytes: int) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    new = limit_bytes if hard == resource.RLIM_INFINITY else min(limit_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (new, hard))


def _child(conn: Any, task: dict[str, Any]) -> None:
    """Child process body: limits, files, twin, measurement; one JSON message back."""
    try:
        _limit_memory(int(task["memory_limit_bytes"]))
        with tempfile.TemporaryDirectory(prefix="day0-remote-") as folder:
            os.environ["HF_MODULES_CACHE"] = os.path.join(folder, "modules")
            os.environ["HF_HUB_OFFLINE"] = "1"
            code_dir = os.path.join(folder, "code")
            os.makedirs(code_dir)
            for name, text in task["files"].items():
                with open(
                    os.path.join(code_dir, os.path.basename(name)), "w", encoding="utf-8"
                ) as fh:
                    fh.write(text)
            with open(os.path.join(code_dir, "config.json"), "w", encoding="utf-8") as fh:
                json.dump(task["config"], fh)
            result = _measure(task, code_dir)
        conn.send(json.dumps({"ok": True, "result": result}))
    except StageFailed as exc:
        payload = {
            "ok": False,
            "kind": "failed",
            "reason": exc.reason,
            "result": getattr(exc, "result", None),
        }
        conn.send(json.dumps(payload))
    except MemoryError as exc:
        conn.send(json.dumps({"ok": False, "kind": "memory", "reason": f"MemoryError: {exc}"}))
    except BaseException as exc:
        text = f"{type(exc).__name__}: {exc}"
        kind = (
            "memory"
            if "can't allocate memory" in text or "out of memory" in text.lower()
            else "error"
        )
        conn.send(
            json.dumps(
                {"ok": False, "kind": kind, "reason": text, "trace": traceback.format_exc()[-2000:]}
            )
        )
    finally:
        conn.close()


def _measure(task: dict[str, Any], code_dir: str) -> dict[str, Any]:
    from workers.stages.twin import build_twin

    pool = PoolSpec(
        **{
            **task["pool"],
            "dtypes": tuple(task["pool"]["dtypes"]),
            "trust_remote_code_orgs": tuple(task["pool"]["trust_remote_code_orgs"]),
        }
    )
    twin = build_twin(
        task["config"], allow_remote_code=True, remote_code_dir=code_dir, org=task["org"]
    )
    stage = task["stage"]
    if stage == "operators":
        from workers.stages.operators import measure_operators

        return measure_operators(twin, pool)
    if stage == "precision":
        from workers.stages.precision import measure_precision

        return measure_precision(twin, pool)
    if stage == "twin":
        return {
            "twin": twin.description,
            "logits_shape": list(twin.model(twin.input_ids).logits.shape),
        }
    raise StageFailed(f"no sandboxed measurement named {stage!r}")


def run_sandboxed(
    stage: str,
    config: Mapping[str, Any],
    files: Mapping[str, bytes],
    pool: PoolSpec,
    *,
    org: str,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
) -> dict[str, Any]:
    """Run `stage`'s measurement ("operators", "precision" or "twin") on a twin built from the
    release's modeling `files` ({name: bytes}) in a spawned child process.

    Returns the measurement's result dict. Raises `StageFailed` when the child exceeds
    `time_limit_s` (seconds, wall clock; the child is killed) or `memory_limit_bytes`
    (RLIMIT_AS, virtual address space), dies, or the measurement fails (the child's
    `StageFailed` reason, with its `result` attached when it had one).
    """
    task = {
        "stage": stage,
        "config": dict(config),
        "files": {name: data.decode("utf-8") for name, data in files.items()},
        "pool": {
            **asdict(pool),
            "operator_manifest": dict(pool.operator_manifest) if pool.operator_manifest else None,
            "precision_thresholds": {
                k: dict(v) for k, v in (pool.precision_thresholds or {}).items()
            },
        },
        "org": org,
        "memory_limit_bytes": memory_limit_bytes,
    }
    context = multiprocessing.get_context("spawn")
    parent, child_end = context.Pipe(duplex=False)
    process = context.Process(
        target=_child, args=(child_end, task), name=f"day0-remote-{stage}", daemon=True
    )
    process.start()
    child_end.close()
    limit_gib = memory_limit_bytes / 1024**3
    try:
        if not parent.poll(time_limit_s):
            process.kill()
            process.join(5)
            raise StageFailed(
                f"the release's modeling code ran past its time limit of {time_limit_s:g} s in the "
                "sandboxed process and was killed"
            )
        try:
            message = json.loads(parent.recv())
        except EOFError:
            process.join(5)
            raise StageFailed(
                f"the sandboxed process running the release's modeling code died (exit code "
                f"{process.exitcode}) with a memory limit of {limit_gib:g} GiB"
            ) from None
    finally:
        parent.close()
        if process.is_alive():
            process.kill()
        process.join(5)
    if message["ok"]:
        return message["result"]
    if message["kind"] == "memory":
        raise StageFailed(
            "the release's modeling code exceeded the "
            f"sandbox's memory limit of {limit_gib:g} GiB: "
            f"{message['reason']}"
        )
    exc = StageFailed(
        message["reason"]
        if message["kind"] == "failed"
        else f"the release's modeling code failed in the sandbox: {message['reason']}"
    )
    if message.get("result") is not None:
        exc.result = message["result"]  # type: ignore[attr-defined]
    raise exc


def run_stage_in_sandbox(
    ctx: StageContext, stage: str, config: Mapping[str, Any]
) -> dict[str, Any]:
    """The policy, then the sandbox: fetch the release's modeling files and run `stage`.

    Raises `StageFailed` when the org is not trusted (naming the architecture and org),
    `StageTransientError` when the hub cannot be reached.
    """
    from adaptation.hubs import HubSpec, hub_source
    from adaptation.hubs.base import HubError

    raw, _ = unwrap_text_config(config)
    arch = (raw.get("architectures") or [raw.get("model_type")])[0]
    org = org_of(ctx.release.repo_id)
    if not remote_code_allowed(ctx.release.repo_id, ctx.pool):
        raise StageFailed(
            f"transformers has no {arch}; its shipped modeling code is not allowed for org {org} "
            f"(trust_remote_code is off for pool {ctx.pool.name}): add {org} to the pool's "
            "trust_remote_code_orgs to run it in a sandboxed process"
        )
    names = modeling_file_names(config)
    if not names:
        raise StageFailed(
            f"transformers has no {arch} and the release ships no modeling code (no auto_map)"
        )
    spec = HubSpec(kind=ctx.release.hub_kind, endpoint=ctx.release.hub_endpoint)
    try:
        files = hub_source(spec).fetch_files(ctx.release.repo_id, ctx.release.revision, names)
    except HubError as exc:
        if exc.transient:
            raise StageTransientError(
                exc.message, retry_after_s=getattr(exc, "retry_after_s", None)
            ) from exc
        raise StageFailed(exc.message) from exc
    ctx.log(
        f"running {', '.join(names)} of {ctx.release.repo_id} "
        f"in a sandboxed process (org {org} trusted)"
    )
    return run_sandboxed(stage, config, files, ctx.pool, org=org)

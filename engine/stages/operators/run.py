"""The `operators` stage: which ATen operators the model needs, and whether the pool has them.

The scaled twin (see `engine.twin`), or the release itself where its real weights
are present and small enough (`engine.twin.real`), runs a prefill and a few greedy
decode steps with its KV cache on the pool's device, in the pool's first serving dtype, under
a recording `TorchDispatchMode` (PyTorch docs, "Extending PyTorch: __torch_dispatch__",
https://pytorch.org/docs/stable/notes/extending.html#extending-all-torch-api-with-modes). A
dispatch mode sees every operator below autograd, after CompositeImplicitAutograd operators
have decomposed: the operators a backend must implement. It does not see inside a
CompositeExplicitAutograd kernel (e.g. `aten::embedding` calling `aten::index_select`): the
mode is off while an operator it intercepted runs.

One pass finds every gap. When an operator has no kernel on the pool's device (the dispatcher
raises `NotImplementedError: Could not run 'aten::X' with arguments from the 'Key' backend`),
the recorder marks it missing, runs that one operator on the CPU and moves its outputs back to
the device, so the run goes on to the next operator. When a kernel exists but lacks the run's
dtype (`RuntimeError: "..." not implemented for 'BFloat16'`), the recorder marks that dtype
missing for that operator and runs it once in float32 on the CPU.

Coverage of the operators that did run on a torch backend reads the dispatcher's table
(dispatcher notes: https://pytorch.org/tutorials/advanced/dispatcher.html and
https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/native/README.md, "Choosing the
right dispatch keyword"), for the pool's dispatch key ("CPU", "CUDA", "XPU", "PrivateUse1"...),
in `check_torch_backend`:

- a kernel registered for the key itself: covered;
- CompositeImplicitAutograd: covered; such an operator decomposes into other operators before
  any backend sees it, and those are what the recording checks;
- CompositeExplicitAutograd: covered, `via` "composite" (one kernel for every backend, written
  with other operators);
- CompositeExplicitAutogradNonFunctional, the functional/in-place wrapper every structured
  operator has: it allocates the output and redispatches to the `.out` overload on the
  tensors' backend, so it counts only when that `.out` overload (or the functional operator)
  has a kernel for the key;
- else the backend's boxed fallback (`torch._C._dispatch_has_backend_fallback`, e.g. a
  PrivateUse1 backend that copies to the CPU): "fallback";
- else missing.

A pool with an operator manifest (`manifests/README.md` in this folder) is checked against
the manifest instead, operator and dtype. Each operator is mapped back to the model features it
served (`operator_features`), so a missing operator reads as a limitation of a feature.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from engine.contract import StageContext, StageFailed
from engine.stages.operators.features import ModuleTracker, features_of
from engine.twin import Twin, copy_twin_model, twin_for_release
from engine.twin.run import DECODE_STEPS, prefill_and_decode, resolve_device

# torch device type -> the dispatch key its kernels register under.
DISPATCH_KEYS: Mapping[str, str] = {
    "cpu": "CPU",
    "cuda": "CUDA",
    "xpu": "XPU",
    "mps": "MPS",
    "hpu": "HPU",
    "meta": "Meta",
    "mtia": "MTIA",
    "maia": "MAIA",
}
SERVING_FLOAT_DTYPES = ("bfloat16", "float16", "float32")
# c10's dispatcher error for an operator with no kernel for the tensors' backend.
_MISSING_KERNEL_RE = re.compile(
    r"Could not run '([\w:.]+)' with arguments from the '(\w+)' backend"
)
# ATen's AT_DISPATCH error for a kernel that lacks a dtype: "addmm_impl_cpu_" not implemented
# for 'Half'. The quoted name is c10::ScalarType's.
_MISSING_DTYPE_RE = re.compile(r"not implemented for '(\w+)'")
SCALAR_TYPE_NAMES: Mapping[str, torch.dtype] = {
    "BFloat16": torch.bfloat16,
    "Half": torch.float16,
    "Float": torch.float32,
    "Double": torch.float64,
    "ComplexHalf": torch.complex32,
    "ComplexFloat": torch.complex64,
    "Float8_e4m3fn": torch.float8_e4m3fn,
    "Float8_e5m2": torch.float8_e5m2,
    "Bool": torch.bool,
    "Byte": torch.uint8,
    "Char": torch.int8,
    "Short": torch.int16,
    "Int": torch.int32,
    "Long": torch.int64,
}
STATUS_ORDER = {"missing": 0, "fallback": 1, "covered": 2}


def dispatch_key_for(device: torch.device) -> str:
    """The dispatch key name of `device`'s kernels (PrivateUse1 for a renamed backend)."""
    if device.type in DISPATCH_KEYS:
        return DISPATCH_KEYS[device.type]
    if device.type == torch._C._get_privateuse1_backend_name():
        return "PrivateUse1"
    return device.type.upper()


def op_display_name(func: Any) -> str:
    """ "aten::mm.default", "aten::add.Tensor": namespace::name.overload."""
    schema = func._schema
    return f"{schema.name}.{schema.overload_name or 'default'}"


def dispatcher_name(display: str) -> str:
    """The dispatcher's spelling: "aten::mm" for the default overload, "aten::add.Tensor"."""
    return display.removesuffix(".default")


def dtype_name(dtype: torch.dtype) -> str:
    """ "bfloat16" for torch.bfloat16."""
    return str(dtype).removeprefix("torch.")


def _signature(schema: Any) -> tuple[tuple[str, str], ...]:
    """Names and types of the arguments that are not `out=` tensors (kwarg-only, written)."""
    return tuple(
        (arg.name, str(arg.type))
        for arg in schema.arguments
        if not (arg.kwarg_only and arg.alias_info is not None and arg.alias_info.is_write)
    )


@lru_cache(maxsize=4096)
def structured_partners(name: str) -> tuple[str, ...]:
    """The overloads a CompositeExplicitAutogradNonFunctional kernel of `name` redispatches to.

    For a structured operator ("aten::mm.default", "aten::add_.Tensor"): the `.out` overload
    with the same non-out arguments ("aten::mm.out", "aten::add.out") and, for an in-place
    operator, the functional one ("aten::add.Tensor"), in the dispatcher's spelling. Empty when
    the schema cannot be found.
    """
    base, _, overload = name.rpartition(".")
    own = None
    candidates: list[tuple[str, Any]] = []
    for packet in dict.fromkeys((base, base.rstrip("_"))):
        for schema in torch._C._jit_get_schemas_for_operator(packet):
            candidates.append((packet, schema))
            if packet == base and (schema.overload_name or "default") == overload:
                own = schema
    if own is None:
        return ()
    wanted = _signature(own)
    partners = []
    for packet, schema in candidates:
        overload_name = schema.overload_name or "default"
        if packet == base and overload_name == overload:
            continue
        if _signature(schema) == wanted:
            partners.append(dispatcher_name(f"{packet}.{overload_name}"))
    return tuple(partners)


def check_torch_backend(name: str, key: str) -> tuple[str, str]:
    """(status, via) of operator `name` ("aten::mm.default") on dispatch key `key`.

    status is "covered", "fallback" or "missing"; via says how: "kernel", "composite
    (CompositeImplicitAutograd)", "composite", "kernel of aten::mm.out" (a structured
    operator's NonFunctional wrapper whose `.out` kernel the key has), "backend fallback",
    "no kernel", or "unknown operator" (not registered in this torch build). The rules and their
    sources are in the module docstring.
    """
    qualified = dispatcher_name(name)

    def has(op: str, dispatch_key: str) -> bool:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op, dispatch_key)

    try:
        if has(qualified, key):
            return "covered", "kernel"
        if has(qualified, "CompositeImplicitAutograd"):
            return "covered", "composite (CompositeImplicitAutograd)"
        if has(qualified, "CompositeExplicitAutograd"):
            return "covered", "composite"
        if has(qualified, "CompositeExplicitAutogradNonFunctional"):
            for partner in structured_partners(name):
                if has(partner, key):
                    return "covered", f"kernel of {partner}"
    except RuntimeError:  # "operator aten::x does not exist"
        return "missing", "unknown operator"
    dispatch_key = getattr(torch._C.DispatchKey, key, None)
    if dispatch_key is not None and torch._C._dispatch_has_backend_fallback(dispatch_key):
        return "fallback", "backend fallback"
    return "missing", "no kernel"


class _RunStopped(Exception):
    """An operator has no kernel and there is nowhere else to run it (its tensors are on the
    CPU already)."""


def _new_entry() -> dict[str, Any]:
    return {
        "dtypes": set(),
        "devices": set(),
        "modules": set(),
        "calls": 0,
        "missing_kernels": set(),
        "missing_dtypes": set(),
        "ran_on_cpu": 0,
    }


class OperatorRecorder(TorchDispatchMode):
    """Records every operator dispatched, and goes on past the ones the device lacks.

    `ops[name]` = {"dtypes": set[str] (of its tensors, in and out), "devices": set[str] (of its
    input tensors and device arguments), "modules": set[str], "calls": int,
    "missing_kernels": set[str] ("aten::add.out on PrivateUse1": the kernel the dispatcher
    lacked), "missing_dtypes": set[str] (dtypes its kernel rejected), "ran_on_cpu": int (calls
    run on the CPU in its place)}. `stopped` is the reason the run stopped early, if it did.
    """

    def __init__(self, tracker: ModuleTracker | None = None) -> None:
        super().__init__()
        self.tracker = tracker
        self.ops: dict[str, dict[str, Any]] = defaultdict(_new_entry)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.tracker is not None and not self.tracker.inside_model:
            # The decode loop's own operators (argmax, moving logits), not the model's: run,
            # past a missing kernel too, but not recorded.
            return self._call(func, args, kwargs, _new_entry())
        entry = self.ops[op_display_name(func)]
        entry["calls"] += 1
        if self.tracker is not None:
            entry["modules"].add(self.tracker.current)
        out = self._call(func, args, kwargs, entry)
        leaves, _ = tree_flatten((args, kwargs, out))
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                entry["dtypes"].add(dtype_name(leaf.dtype))
        return out

    @staticmethod
    def _call(func: Any, args: tuple, kwargs: dict, entry: dict[str, Any]) -> Any:
        """Run `func`; on a missing kernel or dtype, note it in `entry` and run it on the CPU.

        Raises `_RunStopped` when the kernel is missing for tensors already on the CPU, and
        what `func` raises for any other reason.
        """
        inputs, _ = tree_flatten((args, kwargs))
        for leaf in inputs:
            if isinstance(leaf, torch.Tensor):
                entry["devices"].add(leaf.device.type)
            elif isinstance(leaf, torch.device):
                entry["devices"].add(leaf.type)
        try:
            return func(*args, **kwargs)
        except NotImplementedError as exc:
            match = _MISSING_KERNEL_RE.search(str(exc))
            if match is None:
                raise
            entry["missing_kernels"].add(f"{match.group(1)} on {match.group(2)}")
            device = _device_of(inputs)
            if device is None:
                raise _RunStopped(
                    f"{op_display_name(func)} has no kernel for its CPU tensors "
                    f"({match.group(1)} on {match.group(2)}); there is nothing to fall back to"
                ) from exc
            entry["ran_on_cpu"] += 1
            return _run_elsewhere(func, args, kwargs, device, upcast=None)
        except RuntimeError as exc:
            match = _MISSING_DTYPE_RE.search(str(exc))
            dtype = SCALAR_TYPE_NAMES.get(match.group(1)) if match else None
            if dtype is None:
                raise
            entry["missing_dtypes"].add(dtype_name(dtype))
            if not dtype.is_floating_point:
                raise
            entry["ran_on_cpu"] += 1
            return _run_elsewhere(func, args, kwargs, _device_of(inputs), upcast=dtype)


def _device_of(leaves: list[Any]) -> torch.device | None:
    """The first device among `leaves` (tensors' devices, device arguments) that is not the
    CPU."""
    for leaf in leaves:
        device = leaf.device if isinstance(leaf, torch.Tensor) else leaf
        if isinstance(device, torch.device) and device.type != "cpu":
            return device
    return None


def _run_elsewhere(
    func: Any,
    args: tuple,
    kwargs: dict,
    device: torch.device | None,
    *,
    upcast: torch.dtype | None,
) -> Any:
    """Run one operator on the CPU (in float32 for tensors of dtype `upcast`) in place of
    `device`, and hand back outputs on `device` in their dtype.

    Arguments the operator writes (in-place `self`, `out=` tensors) get the result copied back,
    and the operator returns the caller's own tensors for them, as the kernel would.
    """
    originals: dict[int, torch.Tensor] = {}

    def to_cpu(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            moved = value.to("cpu")
            if upcast is not None and moved.dtype == upcast:
                moved = moved.float()
            originals[id(moved)] = value
            return moved
        if isinstance(value, torch.device):
            return torch.device("cpu")
        if isinstance(value, torch.dtype) and value == upcast:
            return torch.float32
        return value

    cpu_args, cpu_kwargs = tree_map(to_cpu, (tuple(args), dict(kwargs)))
    out = func(*cpu_args, **cpu_kwargs)
    written = {
        arg.name for arg in func._schema.arguments if arg.alias_info and arg.alias_info.is_write
    }
    named = dict(zip((a.name for a in func._schema.arguments), cpu_args, strict=False))
    named.update(cpu_kwargs)
    for arg_name in written:
        moved = named.get(arg_name)
        original = originals.get(id(moved))
        if original is not None and original is not moved:
            original.copy_(moved)

    def back(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if id(value) in originals:
            return originals[id(value)]
        if upcast is not None and value.dtype == torch.float32:
            value = value.to(upcast)
        return value.to(device) if device is not None else value

    return tree_map(back, out)


@dataclass
class Recording:
    """What `record_operators` saw: `ops` as in `OperatorRecorder.ops`; `stopped` the reason
    the run ended early (an operator without any kernel to run), else None."""

    ops: dict[str, dict[str, Any]]
    stopped: str | None = None
    notes: list[str] = field(default_factory=list)


def record_operators(model: torch.nn.Module, input_ids: torch.Tensor, steps: int) -> Recording:
    """Run prefill + `steps` greedy decode steps under `OperatorRecorder`.

    Missing kernels and dtypes do not raise (see the module docstring); an operator with no
    kernel even on the CPU ends the run early, with `stopped` saying which. Raises whatever else
    the model raises.
    """
    tracker = ModuleTracker(model)
    recorder = OperatorRecorder(tracker)
    stopped = None
    try:
        with recorder:
            prefill_and_decode(model, input_ids, steps=steps)
    except _RunStopped as exc:
        stopped = str(exc)
    finally:
        tracker.remove()
    return Recording(ops=dict(recorder.ops), stopped=stopped)


def validate_manifest(manifest: Mapping[str, Any]) -> dict[str, set[str]]:
    """{operator name: dtypes} from a manifest dict (format: `manifests/README.md` here).

    Raises `StageFailed` naming what is wrong with the manifest.
    """
    ops = manifest.get("operators") if isinstance(manifest, Mapping) else None
    if not isinstance(ops, Mapping) or not ops:
        raise StageFailed("the pool's operator manifest has no 'operators' object")
    out: dict[str, set[str]] = {}
    for name, dtypes in ops.items():
        if not isinstance(name, str) or "::" not in name:
            raise StageFailed(f"operator manifest: {name!r} is not a namespace::operator name")
        if not isinstance(dtypes, list) or not all(isinstance(d, str) for d in dtypes):
            raise StageFailed(f"operator manifest: dtypes of {name} must be a list of dtype names")
        out[name] = set(dtypes)
    return out


def check_manifest(
    name: str, dtypes: set[str], manifest: Mapping[str, set[str]]
) -> tuple[str, list[str]]:
    """("covered" | "missing", dtypes the manifest lacks) for operator `name`.

    The manifest may list an overload ("aten::add.Tensor", "aten::mm.default") or the bare
    operator ("aten::mm": every overload). "*" among the dtypes means any dtype.
    """
    listed = manifest.get(name)
    if listed is None:
        listed = manifest.get(name.rsplit(".", 1)[0])
    if listed is None:
        return "missing", sorted(dtypes)
    if "*" in listed:
        return "covered", []
    lacking = sorted(dtypes - listed)
    return ("missing", lacking) if lacking else ("covered", [])


def serving_dtype(dtypes: tuple[str, ...]) -> torch.dtype:
    """The first floating serving dtype the pool declares (float32 when it declares none)."""
    for name in dtypes:
        if name in SERVING_FLOAT_DTYPES:
            return getattr(torch, name)
    return torch.float32


def _status_of(
    name: str,
    info: Mapping[str, Any],
    *,
    key: str,
    on_device: bool,
    manifest_ops: Mapping[str, set[str]] | None,
) -> tuple[str, str, list[str]]:
    """(status, via, missing dtypes) of one recorded operator; see `measure_operators`."""
    runtime_dtypes = sorted(info["missing_dtypes"])
    if info["missing_kernels"]:
        kernels = ", ".join(sorted(info["missing_kernels"]))
        return "missing", f"no kernel at run time ({kernels}); ran on the CPU", runtime_dtypes
    if manifest_ops is not None:
        status, lacking = check_manifest(name, set(info["dtypes"]), manifest_ops)
        lacking = sorted(set(lacking) | set(runtime_dtypes))
        return ("missing" if lacking else status), "manifest", lacking
    if on_device and set(info["devices"]) <= {"cpu"}:
        status, via = check_torch_backend(name, "CPU")
        via = f"host (CPU tensors only; {via})"
    else:
        status, via = check_torch_backend(name, key)
    if runtime_dtypes:
        lacks = ", ".join(runtime_dtypes)
        return "missing", f"kernel lacks {lacks}; ran in float32 on the CPU", runtime_dtypes
    return status, via, []


def measure_operators(
    twin: Twin, pool: Any, *, analysis: Mapping[str, Any] | None = None, steps: int = DECODE_STEPS
) -> dict[str, Any]:
    """The operators stage's result for `twin` on `pool` (a PoolSpec or the same fields).

    Returns {"operators": [{"name", "dtypes", "feature", "status", "via", "devices", "calls",
    "modules" (count), "missing_dtypes", "ran_on_cpu"}], "missing": [names], "host_only":
    [names of operators that saw only CPU tensors on a non-CPU pool], "notes": [sentences],
    "device", "backend", "checked_against", "dispatch_key", "dtype" (the run's dtype),
    "decode_steps", "twin", "counts": {"covered", "missing", "fallback"}}. Operators are
    checked against the dispatch key of the pool's device (`dispatch_key_for`), whatever
    device an operator ended up running on. Missing operators and dtypes do not raise.

    Raises `StageFailed` when the device is absent or the twin cannot run for another reason
    than a missing kernel or dtype.
    """
    from engine.architecture import analyze_config

    device = resolve_device(pool.device, pool.name)
    key = dispatch_key_for(device)
    dtype = serving_dtype(tuple(pool.dtypes))
    model = copy_twin_model(twin).to(device=device, dtype=dtype)
    try:
        recording = record_operators(model, twin.input_ids, steps)
    except Exception as exc:
        raise StageFailed(
            f"the twin cannot run on {pool.device}: {type(exc).__name__}: {exc}"
        ) from exc

    if analysis is None:
        analysis = twin.analysis or analyze_config(_twin_config_dict(twin)).to_dict()
    manifest = pool.operator_manifest
    manifest_ops = validate_manifest(manifest) if manifest is not None else None
    where = f"pool {pool.name}"
    on_device = device.type != "cpu"
    ops = recording.ops
    rows = []
    for name in sorted(ops):
        info = ops[name]
        status, via, lacking = _status_of(
            name, info, key=key, on_device=on_device, manifest_ops=manifest_ops
        )
        rows.append(
            {
                "name": name,
                "dtypes": sorted(info["dtypes"]),
                "feature": features_of(info["modules"], model, analysis),
                "status": status,
                "via": via,
                "devices": sorted(info["devices"]),
                "calls": info["calls"],
                "modules": len(info["modules"]),
                "missing_dtypes": lacking,
                "ran_on_cpu": info["ran_on_cpu"],
            }
        )
    rows.sort(key=lambda r: (STATUS_ORDER[r["status"]], r["name"]))
    notes = _notes(rows, where=where, manifest_ops=manifest_ops)
    host_only = [r["name"] for r in rows if on_device and r["devices"] == ["cpu"]]
    if host_only:
        notes.append(
            f"{len(host_only)} operators saw only CPU tensors on {where} ({pool.device}): they "
            f"run on the host, not the device: {', '.join(host_only)}"
        )
    if recording.stopped:
        notes.insert(
            0,
            f"the run stopped early: {recording.stopped}; operators after it were not recorded",
        )
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in STATUS_ORDER}
    result = {
        "operators": rows,
        "missing": [r["name"] for r in rows if r["status"] == "missing"],
        "host_only": host_only,
        "notes": notes,
        "device": str(device),
        "backend": pool.backend,
        "checked_against": "manifest" if manifest_ops is not None else f"torch dispatcher ({key})",
        "dispatch_key": key,
        "dtype": dtype_name(dtype),
        "decode_steps": steps,
        "twin": twin.description,
        "counts": {s: counts[s] for s in ("covered", "missing", "fallback")},
    }
    if manifest_ops is not None:
        result["manifest"] = {
            "accelerator": manifest.get("accelerator"),
            "source": manifest.get("source"),
            "operators": len(manifest_ops),
        }
    return result


def _notes(
    rows: list[dict[str, Any]], *, where: str, manifest_ops: Mapping[str, set[str]] | None
) -> list[str]:
    notes = []
    for row in rows:
        need = row["feature"] or "the model"
        if row["status"] == "missing":
            what = (
                f" for {', '.join(row['missing_dtypes'])}"
                if row["missing_dtypes"]
                and (manifest_ops is None or _listed(row["name"], manifest_ops))
                else ""
            )
            notes.append(f"{need} needs {row['name']}{what}, missing on {where}")
        elif row["status"] == "fallback":
            notes.append(f"{need} runs {row['name']} through the backend's fallback on {where}")
    return notes


def _listed(name: str, manifest_ops: Mapping[str, set[str]]) -> bool:
    return name in manifest_ops or name.rsplit(".", 1)[0] in manifest_ops


def _twin_config_dict(twin: Twin) -> dict[str, Any]:
    data = twin.config.to_dict()
    data.pop("auto_map", None)
    return data


def run(ctx: StageContext) -> dict[str, Any]:
    """Record the twin's operators on the pool's device and check them against the pool.

    Reads `ctx.previous["fetch"]["config"]`. The release's real weights run at full size where
    a mirror folder holds them and they fit the pool (`twin.real.twin_for_release`); else the
    seeded twin, the reason in its description's notes. Releases whose architecture
    transformers lacks run in the remote-code sandbox when the pool trusts their org
    (`remote_code.py`). Raises `StageFailed` (see `measure_operators`, `remote_code`).
    """
    from engine.remote_code import sandbox as remote_code

    config = remote_code.fetched_config(ctx)
    if remote_code.needs_remote_code(config):
        return remote_code.run_stage_in_sandbox(ctx, "operators", config)
    twin = twin_for_release(ctx, config)
    result = measure_operators(twin, ctx.pool)
    ctx.log(
        f"{len(result['operators'])} operators on {result['device']} ({result['dtype']}) checked "
        f"against {result['checked_against']}: {result['counts']['covered']} covered, "
        f"{result['counts']['missing']} missing, {result['counts']['fallback']} fallback"
    )
    return result

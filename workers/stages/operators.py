"""The `operators` stage: which ATen operators the model needs, and whether the pool has them.

The scaled twin (see `workers.stages.twin`), or the release itself where its real weights
are present and small enough (`workers.stages.twin.real`), runs a prefill and a few greedy
decode steps with its KV cache on the pool's device, in the pool's first serving dtype, under
a recording `TorchDispatchMode`. A dispatch mode sees every operator below autograd, after
CompositeImplicitAutograd operators have decomposed: exactly the operators a backend must
implement (PyTorch docs, "Extending PyTorch: __torch_dispatch__"; dispatcher notes in
https://pytorch.org/tutorials/advanced/dispatcher.html).

Coverage on a torch backend uses the dispatcher's own table,
`torch._C._dispatch_has_kernel_for_dispatch_key(name, key)`, for the device's dispatch key
("CPU", "CUDA", "XPU", "MPS", "PrivateUse1"...), then the composite keys
(CompositeExplicitAutograd[NonFunctional], CompositeImplicitAutograd: a kernel written in
other operators that works on any backend), then the backend's boxed fallback
(`_dispatch_has_backend_fallback`, e.g. a PrivateUse1 backend that copies to CPU): an operator
served only by that fallback is reported as "fallback". A pool with an operator manifest
(workers/manifests/README.md) is checked against the manifest instead, operator and dtype.

Each operator is mapped back to the model features it served (RoPE type, MoE routing and
experts, MLA projections, sliding-window masks, attention sinks, norms), from the module that
was running when it was dispatched, so a missing operator reads as a limitation of a feature.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from workers.stages.base import StageContext, StageFailed
from workers.stages.twin import Twin, copy_twin_model, twin_for_release
from workers.stages.twin.run import DECODE_STEPS, prefill_and_decode, resolve_device

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
MLA_MODULES = frozenset(
    {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "q_a_layernorm", "kv_a_layernorm"}
)
COMPOSITE_KEYS = (
    "CompositeExplicitAutograd",
    "CompositeExplicitAutogradNonFunctional",
    "CompositeImplicitAutograd",
)
SERVING_FLOAT_DTYPES = ("bfloat16", "float16", "float32")
_MISSING_KERNEL_RE = re.compile(
    r"Could not run '([\w:.]+)' with arguments from the '(\w+)' backend"
)

# Features in the order a note names them: the specific (what a release adds) before the
# generic (what every transformer has).
FEATURE_PRIORITY = (
    "attention sinks",
    "MLA projections",
    "MoE routing",
    "MoE experts",
    "shared experts",
    "RoPE",
    "sliding-window",
    "QK norm",
    "attention",
    "MLP",
    "norm",
    "LM head",
    "token embedding",
    "masks and positions",
)


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


class _ModuleTracker:
    """Keeps the qualified name of the innermost module running (forward hooks)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.stack: list[str] = [""]
        self.handles = []
        for name, module in model.named_modules():
            self.handles.append(module.register_forward_pre_hook(self._push(name)))
            self.handles.append(module.register_forward_hook(self._pop, always_call=True))

    def _push(self, name: str):
        def hook(_module: Any, _args: Any) -> None:
            self.stack.append(name)

        return hook

    def _pop(self, _module: Any, _args: Any, _out: Any) -> None:
        if len(self.stack) > 1:
            self.stack.pop()

    @property
    def inside_model(self) -> bool:
        return len(self.stack) > 1

    @property
    def current(self) -> str:
        return self.stack[-1]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


class OperatorRecorder(TorchDispatchMode):
    """Records every operator dispatched: dtypes and devices of its tensors, modules it ran in.

    `ops[name]` = {"dtypes": set[str], "devices": set[str], "modules": set[str], "calls": int}.
    """

    def __init__(self, tracker: _ModuleTracker | None = None) -> None:
        super().__init__()
        self.tracker = tracker
        self.ops: dict[str, dict[str, Any]] = defaultdict(
            lambda: {"dtypes": set(), "devices": set(), "modules": set(), "calls": 0}
        )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.tracker is not None and not self.tracker.inside_model:
            return func(*args, **kwargs)  # the decode loop's own argmax, not the model's
        entry = self.ops[op_display_name(func)]
        entry["calls"] += 1
        if self.tracker is not None:
            entry["modules"].add(self.tracker.current)
        out = func(*args, **kwargs)
        leaves, _ = tree_flatten((args, kwargs, out))
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                entry["dtypes"].add(str(leaf.dtype).removeprefix("torch."))
                entry["devices"].add(leaf.device.type)
        return out


def record_operators(model: torch.nn.Module, input_ids: torch.Tensor, steps: int) -> dict:
    """Run prefill + `steps` greedy decode steps under `OperatorRecorder`; its `ops`.

    Raises whatever the model raises (NotImplementedError for a missing kernel).
    """
    tracker = _ModuleTracker(model)
    recorder = OperatorRecorder(tracker)
    try:
        with recorder:
            prefill_and_decode(model, input_ids, steps=steps)
    finally:
        tracker.remove()
    return dict(recorder.ops)


def feature_for_module(name: str, model: torch.nn.Module, analysis: Mapping[str, Any]) -> str:
    """The model feature a module implements, in the field's words.

    From the module's qualified name and class and the release's analysis (RoPE type,
    attention kind, MoE scoring and grouped top-k, layer types). A module with no feature of
    its own (a q_proj, an activation) takes its parent's; the top-level model's own operators
    build the masks and positions.
    """
    while name:
        feature = _own_feature(name, model, analysis)
        if feature is not None:
            return feature
        name = name.rsplit(".", 1)[0] if "." in name else ""
    attn = analysis.get("attention") or {}
    sliding = attn.get("sliding_layers") or attn.get("chunked_layers")
    return (
        "masks and positions (causal and sliding-window masks)"
        if sliding
        else "masks and positions"
    )


def _own_feature(name: str, model: torch.nn.Module, analysis: Mapping[str, Any]) -> str | None:
    rope = analysis.get("rope") or {}
    attn = analysis.get("attention") or {}
    moe = analysis.get("moe") or None
    parts = name.split(".")
    leaf = parts[-1]
    try:
        module = model.get_submodule(name)
    except AttributeError:
        return None
    cls = type(module).__name__
    layer = next((int(p) for p in parts if p.isdigit()), None)
    types = attn.get("layer_types") or []
    layer_type = types[layer] if layer is not None and layer < len(types) else None
    if leaf == "rotary_emb" or "Rotary" in cls:
        kind = rope.get("type") or "default"
        return "RoPE" if kind == "default" else f"{kind} RoPE"
    if leaf in MLA_MODULES:
        return "MLA projections"
    if leaf in ("q_norm", "k_norm"):
        return "QK norm"
    if leaf == "embed_tokens":
        return "token embedding"
    if leaf == "lm_head":
        return "LM head"
    if leaf == "experts":
        return "MoE experts (grouped GEMM)"
    if leaf in ("shared_experts", "shared_expert", "shared_expert_gate"):
        return "shared experts"
    if moe and leaf in ("gate", "router") and "mlp" in parts:
        grouped = ", grouped top-k" if (moe.get("n_group") or 1) > 1 else ""
        method = f", {moe['topk_method']}" if moe.get("topk_method") else ""
        return (
            f"MoE routing ({moe['scoring']} scores, "
            f"top-{moe['experts_per_token']}{grouped}{method})"
        )
    if leaf == "self_attn" or "Attention" in cls:
        desc = "MLA attention" if attn.get("kind") == "MLA" else f"attention ({attn.get('kind')})"
        if hasattr(module, "sinks"):
            desc = f"{desc} with attention sinks"
        if layer_type == "sliding_attention":
            desc = f"sliding-window {desc}"
        return desc
    if leaf == "mlp" or "MLP" in cls or "Moe" in cls or "MoE" in cls:
        if moe and hasattr(module, "experts"):
            return "MoE layer (combine)"
        return f"MLP ({analysis.get('hidden_act') or 'gated'})"
    if "norm" in leaf.lower() or "Norm" in cls:
        return "norm (RMSNorm)" if "RMS" in cls else f"norm ({cls})"
    return None


def _priority(feature: str) -> int:
    for i, key in enumerate(FEATURE_PRIORITY):
        if key in feature:
            return i
    return len(FEATURE_PRIORITY)


def features_of(
    modules: set[str], model: torch.nn.Module, analysis: Mapping[str, Any]
) -> str | None:
    """The features an operator served, most specific first, joined with ", "."""
    found = {feature_for_module(m, model, analysis) for m in modules}
    if not found:
        return None
    return ", ".join(sorted(found, key=lambda f: (_priority(f), f)))


def check_torch_backend(name: str, device_types: set[str], key: str) -> str:
    """ "covered", "fallback" or "missing" for `name` on dispatch key `key`."""
    qualified = dispatcher_name(name)
    target_key = key if device_types - {"cpu"} or key == "CPU" else "CPU"
    try:
        if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, target_key):
            return "covered"
        for composite in COMPOSITE_KEYS:
            if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, composite):
                return "covered"
    except RuntimeError:
        return "missing"
    dispatch_key = getattr(torch._C.DispatchKey, target_key, None)
    if dispatch_key is not None and torch._C._dispatch_has_backend_fallback(dispatch_key):
        return "fallback"
    return "missing"


def validate_manifest(manifest: Mapping[str, Any]) -> dict[str, set[str]]:
    """{operator name: dtypes} from a manifest dict (format: workers/manifests/README.md).

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


def measure_operators(
    twin: Twin, pool: Any, *, analysis: Mapping[str, Any] | None = None, steps: int = DECODE_STEPS
) -> dict[str, Any]:
    """The operators stage's result for `twin` on `pool` (a PoolSpec or the same fields).

    Returns {"operators": [{"name", "dtypes", "feature", "status", "calls", "modules"
    (count), "missing_dtypes"}], "missing": [names], "notes": [sentences], "device",
    "backend", "dispatch_key" (torch backends), "dtype" (the run's dtype), "decode_steps",
    "twin", "counts": {"covered", "missing", "fallback"}}. Missing operators do not raise.

    Raises `StageFailed` when the device is absent or the twin cannot run for another reason
    than a missing kernel.
    """
    from workers.stages.architecture import analyze_config

    device = resolve_device(pool.device, pool.name)
    dtype = serving_dtype(tuple(pool.dtypes))
    model = copy_twin_model(twin).to(device=device, dtype=dtype)
    notes: list[str] = []
    runtime_missing: dict[str, str] = {}
    try:
        ops = record_operators(model, twin.input_ids, steps)
    except NotImplementedError as exc:
        match = _MISSING_KERNEL_RE.search(str(exc))
        if match is None:
            raise StageFailed(
                f"the twin cannot run on {pool.device}: NotImplementedError: {exc}"
            ) from exc
        runtime_missing[match.group(1)] = match.group(2)
        notes.append(
            f"the twin stopped on {pool.device} at {match.group(1)} (no {match.group(2)} kernel); "
            "the operator list below was recorded on the CPU in the same dtype"
        )
        model = copy_twin_model(twin).to(dtype=dtype)
        try:
            ops = record_operators(model, twin.input_ids, steps)
        except Exception as inner:
            raise StageFailed(
                f"the twin cannot run even on the CPU: {type(inner).__name__}: {inner}"
            ) from inner
    except StageFailed:
        raise
    except Exception as exc:
        raise StageFailed(
            f"the twin cannot run on {pool.device}: {type(exc).__name__}: {exc}"
        ) from exc

    if analysis is None:
        analysis = twin.analysis or analyze_config(_twin_config_dict(twin)).to_dict()
    manifest = pool.operator_manifest
    manifest_ops = validate_manifest(manifest) if manifest is not None else None
    key = dispatch_key_for(device)
    where = f"pool {pool.name}"
    rows = []
    for name in sorted(ops):
        info = ops[name]
        dtypes = set(info["dtypes"])
        feature = features_of(info["modules"], model, analysis)
        lacking: list[str] = []
        if manifest_ops is not None:
            status, lacking = check_manifest(name, dtypes, manifest_ops)
        else:
            status = check_torch_backend(name, set(info["devices"]), key)
            if dispatcher_name(name) in runtime_missing:
                status = "missing"
        rows.append(
            {
                "name": name,
                "dtypes": sorted(dtypes),
                "feature": feature,
                "status": status,
                "calls": info["calls"],
                "modules": len(info["modules"]),
                "missing_dtypes": lacking,
            }
        )
    order = {"missing": 0, "fallback": 1, "covered": 2}
    rows.sort(key=lambda r: (order[r["status"]], r["name"]))
    for row in rows:
        if row["status"] == "missing":
            need = row["feature"] or "the model"
            what = (
                f" for {', '.join(row['missing_dtypes'])}"
                if row["missing_dtypes"]
                and manifest_ops is not None
                and _listed(row["name"], manifest_ops)
                else ""
            )
            notes.append(f"{need} needs {row['name']}{what}, missing on {where}")
        elif row["status"] == "fallback":
            notes.append(
                f"{row['feature'] or 'the model'} runs "
                f"{row['name']} through the CPU fallback on {where}"
            )
    counts = {
        s: sum(1 for r in rows if r["status"] == s) for s in ("covered", "missing", "fallback")
    }
    result = {
        "operators": rows,
        "missing": [r["name"] for r in rows if r["status"] == "missing"],
        "notes": notes,
        "device": str(device),
        "backend": pool.backend,
        "checked_against": "manifest" if manifest_ops is not None else f"torch dispatcher ({key})",
        "dtype": str(dtype).removeprefix("torch."),
        "decode_steps": steps,
        "twin": twin.description,
        "counts": counts,
    }
    if manifest_ops is not None:
        result["manifest"] = {
            "accelerator": manifest.get("accelerator"),
            "source": manifest.get("source"),
            "operators": len(manifest_ops),
        }
    return result


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
    (`remote_code.py`).
    """
    from workers.stages import remote_code

    config = remote_code.fetched_config(ctx)
    if remote_code.needs_remote_code(config):
        return remote_code.run_stage_in_sandbox(ctx, "operators", config)
    twin = twin_for_release(ctx, config)
    result = measure_operators(twin, ctx.pool)
    ctx.log(
        f"{len(result['operators'])} operators on {result['device']} ({result['dtype']}): "
        f"{result['counts']['covered']} covered, {result['counts']['missing']} missing, "
        f"{result['counts']['fallback']} fallback"
    )
    return result

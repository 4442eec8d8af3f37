"""The `precision` stage: does the pool's device, in each serving dtype, match the reference?

Reference: the scaled twin in float32 on the CPU (or the release's real model at full size,
where its weights are present: `workers.stages.twin.real`). Target: a copy of the same model
(same weights) on the pool's device in each dtype the pool declares. Both see the same prompts
(`Twin.input_ids`, [batch, tokens]): a prefill, then `DECODE_STEPS` decode steps through the
KV cache. The reference decodes greedily; the target is fed the reference's tokens (teacher
forcing) so that every position compares next-token distributions over the same context.

Metrics per dtype, over every prefill position and decode step (rows of logits, vocab wide):
max and mean absolute error of the logits (logit units), mean cosine similarity per row,
top-1 agreement (fraction of rows whose argmax agrees), and the mean KL divergence
KL(reference ‖ target) of the next-token distributions (nats).

Layer-wise drift: forward hooks on every decoder layer and its direct sub-modules (attention,
MLP or MoE, norms) and the final norm record the prefill hidden states of reference and target;
each gets its max absolute error and relative error ‖t - r‖₂ / ‖r‖₂ (Frobenius norms over the
whole tensor). The first *divergent* module, in execution order, is the first whose relative
error exceeds both `min_divergence_relative_error` and `divergence_jump_factor` x the median
relative error of the modules before it (the dtype's unit roundoff when there are none): a
jump against the drift so far, not a slow accumulation.

Thresholds: `DEFAULT_THRESHOLDS`, overridable per dtype through the pool's
`precision_thresholds`. A dtype that crosses one, or whose target produces NaN/Inf, fails the
stage with `StageFailed`; the full result is attached to the exception as `exc.result`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from workers.stages.base import StageContext, StageFailed
from workers.stages.twin import Twin, copy_twin_model, twin_for_release
from workers.stages.twin.run import DECODE_STEPS, Trace, prefill_and_decode, resolve_device

# Unit roundoff u = 2^-p of each format, p = significand bits including the implicit one
# (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., §2.1). int8 weight-only:
# symmetric per-output-channel quantization has a step of max|w| / 127, a relative error of
# at most 2^-8 of the channel's largest weight.
UNIT_ROUNDOFF: Mapping[str, float] = {
    "float32": 2.0**-24,
    "bfloat16": 2.0**-8,
    "float16": 2.0**-11,
    "int8": 2.0**-8,
    "float8_e4m3fn": 2.0**-4,
    "float8_e5m2": 2.0**-3,
}

_SOURCE_COMMON = (
    "Rounding errors of a length-n dot product grow like sqrt(n)·u in practice (Higham & Mary, "
    "'A New Approach to Probabilistic Rounding Error Analysis', SIAM J. Sci. Comput. 41(5), "
    "2019); a relative logit error e gives cosine similarity ≈ 1 - e²/2. A seeded twin's logits "
    "are flat (RMS ≈ 0.3 over 512 tokens), so near-ties flip under rounding: measured on the "
    "six real-config twins, bfloat16 top-1 agreement ranged 0.925-1.0 and float8 0.7-0.9 "
    "while cosine stayed >= 0.995; the top-1 limits leave that margin and KL/cosine carry the "
    "finer check."
)

DEFAULT_THRESHOLDS: Mapping[str, Mapping[str, Any]] = {
    "bfloat16": {
        "min_cosine_similarity": 0.99,
        "min_top1_agreement": 0.85,
        "max_kl_divergence": 0.01,
        "min_divergence_relative_error": 0.25,
        "divergence_jump_factor": 8.0,
        "source": (
            "bfloat16 keeps 8 significant bits, u = 2^-8 ≈ 3.9e-3 (Kalamkar et al., 'A Study "
            "of BFLOAT16 for Deep Learning Training', arXiv:1905.12322): relative logit "
            "errors of ~10u ≈ 0.04 through a few layers give cosine >= 0.99. " + _SOURCE_COMMON
        ),
    },
    "float16": {
        "min_cosine_similarity": 0.999,
        "min_top1_agreement": 0.9,
        "max_kl_divergence": 0.001,
        "min_divergence_relative_error": 0.05,
        "divergence_jump_factor": 8.0,
        "source": (
            "float16 (IEEE 754 binary16) keeps 11 significant bits, u = 2^-11 ≈ 4.9e-4: 8x "
            "tighter than bfloat16, but a range of only ±65504, so overflow shows as Inf. "
            + _SOURCE_COMMON
        ),
    },
    "int8": {
        "min_cosine_similarity": 0.98,
        "min_top1_agreement": 0.8,
        "max_kl_divergence": 0.05,
        "min_divergence_relative_error": 0.3,
        "divergence_jump_factor": 8.0,
        "source": (
            "int8 weight-only, symmetric per output channel (as in torch's "
            "aten::_weight_int8pack_mm path): step max|w|/127 per channel, activations in "
            "bfloat16, so errors are at least bfloat16's. " + _SOURCE_COMMON
        ),
    },
    "float8_e4m3fn": {
        "min_cosine_similarity": 0.95,
        "min_top1_agreement": 0.6,
        "max_kl_divergence": 0.1,
        "min_divergence_relative_error": 0.5,
        "divergence_jump_factor": 8.0,
        "source": (
            "float8 e4m3 keeps 4 significant bits, u = 2^-4 (Micikevicius et al., 'FP8 "
            "Formats for Deep Learning', arXiv:2209.05433), weights and activations scaled "
            "per tensor. " + _SOURCE_COMMON
        ),
    },
}
THRESHOLD_KEYS = (
    "min_cosine_similarity",
    "min_top1_agreement",
    "max_kl_divergence",
    "max_mean_abs_error",
    "min_divergence_relative_error",
    "divergence_jump_factor",
)
SUPPORTED_DTYPES = tuple(DEFAULT_THRESHOLDS)


def thresholds_for(dtype: str, overrides: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """The dtype's default thresholds with the pool's overrides on top (and which were)."""
    merged = dict(DEFAULT_THRESHOLDS.get(dtype, DEFAULT_THRESHOLDS["bfloat16"]))
    override = dict(overrides.get(dtype) or {})
    unknown = sorted(set(override) - set(THRESHOLD_KEYS))
    if unknown:
        raise StageFailed(
            f"precision_thresholds[{dtype!r}] has unknown keys {unknown}; known: "
            f"{', '.join(THRESHOLD_KEYS)}"
        )
    merged.update({k: float(v) for k, v in override.items()})
    merged["overridden"] = sorted(override)
    return merged


# -- layer-wise hooks ------------------------------------------------------------------------


def decoder_layers(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """The qualified name and ModuleList of the decoder layers (the longest ModuleList)."""
    best: tuple[str, torch.nn.ModuleList] | None = None
    for name, module in model.named_modules():
        is_layers = isinstance(module, torch.nn.ModuleList) and name.endswith("layers")
        if is_layers and (best is None or len(module) > len(best[1])):
            best = (name, module)
    if best is None:
        raise StageFailed(
            f"{type(model).__name__} has no decoder layer list to compare layer by layer"
        )
    return best


def module_kind(child_name: str, child: torch.nn.Module) -> str | None:
    """ "attention", "moe", "mlp" or "norm" for a decoder layer's direct sub-module."""
    lowered = child_name.lower()
    if "norm" in lowered:
        return "norm"
    if "attn" in lowered or "attention" in lowered:
        return "attention"
    if lowered in ("mlp", "feed_forward", "block_sparse_moe", "moe", "ffn"):
        return "moe" if hasattr(child, "experts") else "mlp"
    return None


def hook_points(model: torch.nn.Module) -> list[tuple[str, int, str]]:
    """(qualified module name, layer index, kind) of every compared module.

    Per decoder layer: its norms, attention and MLP/MoE, then the layer's output ("output");
    after the last layer, the final norm (layer index = number of layers, kind "norm").
    """
    prefix, layers = decoder_layers(model)
    points: list[tuple[str, int, str]] = []
    for i, layer in enumerate(layers):
        for child_name, child in layer.named_children():
            kind = module_kind(child_name, child)
            if kind is not None:
                points.append((f"{prefix}.{i}.{child_name}", i, kind))
        points.append((f"{prefix}.{i}", i, "output"))
    parent = prefix.rsplit(".", 1)[0] if "." in prefix else ""
    for final in ("norm", "final_layernorm", "ln_f"):
        name = f"{parent}.{final}" if parent else final
        try:
            model.get_submodule(name)
        except AttributeError:
            continue
        points.append((name, len(layers), "norm"))
        break
    return points


class HiddenStateRecorder:
    """Forward hooks that keep each hook point's first output (the prefill), float32 on CPU.

    `order` lists module names in the order they ran.
    """

    def __init__(self, model: torch.nn.Module, points: list[tuple[str, int, str]]) -> None:
        self.states: dict[str, torch.Tensor] = {}
        self.order: list[str] = []
        self.handles = [
            model.get_submodule(name).register_forward_hook(self._hook(name))
            for name, _, _ in points
        ]

    def _hook(self, name: str) -> Callable:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            if name in self.states:
                return
            tensor = output[0] if isinstance(output, tuple | list) else output
            if isinstance(tensor, torch.Tensor):
                self.states[name] = tensor.detach().float().cpu()
                self.order.append(name)

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def run_recorded(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    points: list,
    forced: torch.Tensor | None,
    steps: int,
) -> tuple[Trace, HiddenStateRecorder]:
    """Prefill + decode with hidden-state hooks on `points`."""
    recorder = HiddenStateRecorder(model, points)
    try:
        trace = prefill_and_decode(model, input_ids, steps=steps, forced_tokens=forced)
    finally:
        recorder.remove()
    return trace, recorder


def layer_drift(
    ref: HiddenStateRecorder, tgt: HiddenStateRecorder, points: list[tuple[str, int, str]]
) -> list[dict[str, Any]]:
    """[{"layer", "module", "name", "max_abs_error", "relative_error"}] in the reference's
    execution order; relative error ‖t - r‖₂ / ‖r‖₂ (float32, over the whole prefill tensor)."""
    meta = {name: (layer, kind) for name, layer, kind in points}
    rows = []
    for name in ref.order:
        if name not in tgt.states:
            continue
        r, t = ref.states[name], tgt.states[name]
        if r.shape != t.shape:
            continue
        diff = (t - r).abs()
        finite = bool(torch.isfinite(t).all())
        max_abs = float(diff.max()) if finite else math.inf
        rel = float((t - r).norm() / r.norm().clamp_min(1e-30)) if finite else math.inf
        layer, kind = meta[name]
        rows.append(
            {
                "layer": layer,
                "module": kind,
                "name": name,
                "max_abs_error": max_abs,
                "relative_error": rel,
                "finite": finite,
            }
        )
    return rows


def first_divergence(
    rows: list[dict[str, Any]], thresholds: Mapping[str, Any], unit_roundoff: float
) -> dict[str, Any] | None:
    """The first row whose relative error jumps (see the module docstring), or None."""
    earlier: list[float] = []
    for row in rows:
        rel = row["relative_error"]
        baseline = statistics.median(earlier) if earlier else unit_roundoff
        if rel > thresholds["min_divergence_relative_error"] and rel > thresholds[
            "divergence_jump_factor"
        ] * max(baseline, unit_roundoff):
            return row
        earlier.append(rel)
    return None


# -- targets in each dtype -------------------------------------------------------------------


class QuantizedLinear(torch.nn.Module):
    """A Linear whose weight is stored int8 (weight-only) or float8 e4m3 (with activations).

    int8: symmetric per-output-channel scales, `aten::_weight_int8pack_mm(x, w_int8, scales)`
    with bfloat16 activations (torch's weight-only int8 kernel). float8: weight and activation
    scaled per tensor to e4m3's max 448, `torch._scaled_mm` with a bfloat16 output.
    """

    def __init__(self, linear: torch.nn.Linear, kind: str) -> None:
        super().__init__()
        self.kind = kind
        weight = linear.weight.detach().float()
        self.bias = (
            None
            if linear.bias is None
            else torch.nn.Parameter(linear.bias.detach().to(torch.bfloat16), requires_grad=False)
        )
        self.out_features = weight.shape[0]
        if kind == "int8":
            scales = weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0
            q = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
            self.register_buffer("weight_q", q)
            self.register_buffer("scales", scales.to(torch.bfloat16))
        else:
            fmax = torch.finfo(torch.float8_e4m3fn).max
            scale = weight.abs().amax().clamp_min(1e-12) / fmax
            self.register_buffer("weight_q", (weight / scale).to(torch.float8_e4m3fn))
            self.register_buffer("scale", scale.reshape(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1]).to(torch.bfloat16)
        if self.kind == "int8":
            out = torch.ops.aten._weight_int8pack_mm(flat, self.weight_q, self.scales)
        else:
            fmax = torch.finfo(torch.float8_e4m3fn).max
            a_scale = flat.float().abs().amax().clamp_min(1e-12) / fmax
            a = (flat.float() / a_scale).to(torch.float8_e4m3fn)
            out = torch._scaled_mm(
                a,
                self.weight_q.t(),
                scale_a=a_scale,
                scale_b=self.scale.float(),
                out_dtype=torch.bfloat16,
            )
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)


# Widths the quantized kernels take: torch 2.13's CPU `_weight_int8pack_mm` crashes the process
# (SIGSEGV, not an exception) for a reduction width K that is not a multiple of 16 with more
# than one row; `_scaled_mm` needs multiples of 16 on CUDA. Other Linears stay bfloat16.
QUANT_WIDTH_MULTIPLE = 16


def _quantize_linears(model: torch.nn.Module, kind: str) -> tuple[int, int]:
    """Swap every nn.Linear whose widths are multiples of `QUANT_WIDTH_MULTIPLE` for a
    QuantizedLinear; (swapped, kept in bfloat16)."""
    swapped = kept = 0
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is not torch.nn.Linear:
                continue
            if (
                child.in_features % QUANT_WIDTH_MULTIPLE
                or child.out_features % QUANT_WIDTH_MULTIPLE
            ):
                kept += 1
                continue
            setattr(module, child_name, QuantizedLinear(child, kind).to(child.weight.device))
            swapped += 1
    return swapped, kept


def _probe_quantized(kind: str, device: torch.device) -> str | None:
    """Why `kind` cannot run on `device`, or None when its kernel runs there."""
    try:
        lin = torch.nn.Linear(64, 32).to(device)
        QuantizedLinear(lin, kind).to(device)(
            torch.ones(4, 64, device=device, dtype=torch.bfloat16)
        )
    except (RuntimeError, NotImplementedError, AttributeError) as exc:
        op = "aten::_weight_int8pack_mm" if kind == "int8" else "torch._scaled_mm (float8_e4m3fn)"
        return f"{op} does not run on {device}: {str(exc).splitlines()[0][:200]}"
    return None


def make_target(
    twin: Twin, dtype: str, device: torch.device
) -> tuple[torch.nn.Module | None, str | None, list[str]]:
    """(target model, reason it is skipped, notes) for `dtype` on `device`."""
    notes: list[str] = []
    if dtype in ("bfloat16", "float16", "float32"):
        torch_dtype = getattr(torch, dtype)
        try:
            torch.zeros(2, 2, device=device, dtype=torch_dtype) @ torch.zeros(
                2, 2, device=device, dtype=torch_dtype
            )
        except (RuntimeError, TypeError) as exc:
            return None, f"{dtype} matmul does not run on {device}: {exc}", notes
        return copy_twin_model(twin).to(device=device, dtype=torch_dtype), None, notes
    if dtype in ("int8", "float8_e4m3fn"):
        kind = "int8" if dtype == "int8" else "fp8"
        why = _probe_quantized(kind, device)
        if why is not None:
            return None, why, notes
        model = copy_twin_model(twin).to(device=device, dtype=torch.bfloat16)
        swapped, kept = _quantize_linears(model, kind)
        notes.append(
            f"{swapped} nn.Linear layers quantized to {dtype}"
            + (f", {kept} kept bfloat16 (the kernel refused their shape)" if kept else "")
            + "; fused expert weights, embeddings and norms stay bfloat16"
        )
        return model, None, notes
    return (
        None,
        (
            f"{dtype} is not a dtype this stage can build a "
            f"target in (known: {', '.join(SUPPORTED_DTYPES)})"
        ),
        notes,
    )


def perturb_norm_eps(model: torch.nn.Module, *, layer: int, module: str, eps: float) -> None:
    """Change one norm's epsilon (e.g. layer 2's `post_attention_layernorm` to 1e-1).

    A deliberately wrong target for tests and drills: the stage must fail naming that layer
    and the norm. Raises ValueError when the module has no epsilon attribute.
    """
    prefix, layers = decoder_layers(model)
    norm = layers[layer].get_submodule(module)
    for attr in ("variance_epsilon", "eps", "epsilon"):
        if hasattr(norm, attr):
            setattr(norm, attr, eps)
            return
    raise ValueError(f"{prefix}.{layer}.{module} has no epsilon attribute")


# -- metrics ---------------------------------------------------------------------------------


def logit_metrics(ref: Trace, tgt: Trace) -> dict[str, float]:
    """Errors between reference and target logits over prefill positions and decode steps."""
    vocab = ref.prefill_logits.shape[-1]
    r = torch.cat(
        [ref.prefill_logits.reshape(-1, vocab), ref.decode_logits.reshape(-1, vocab)]
    ).double()
    t = torch.cat(
        [tgt.prefill_logits.reshape(-1, vocab), tgt.decode_logits.reshape(-1, vocab)]
    ).double()
    n_prefill = ref.prefill_logits.shape[0] * ref.prefill_logits.shape[1]
    agree = (r.argmax(-1) == t.argmax(-1)).double()
    kl = (F.softmax(r, -1) * (F.log_softmax(r, -1) - F.log_softmax(t, -1))).sum(-1)
    return {
        "max_abs_error": float((t - r).abs().max()),
        "mean_abs_error": float((t - r).abs().mean()),
        "cosine_similarity": float(F.cosine_similarity(r, t, dim=-1).mean()),
        "top1_agreement": float(agree.mean()),
        "prefill_top1_agreement": float(agree[:n_prefill].mean()),
        "decode_top1_agreement": float(agree[n_prefill:].mean())
        if agree.numel() > n_prefill
        else None,
        "kl_divergence": float(kl.mean().clamp_min(0.0)),
        "positions": int(r.shape[0]),
        "reference_logit_rms": float(r.pow(2).mean().sqrt()),
    }


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def compare_dtype(
    twin: Twin,
    dtype: str,
    device: torch.device,
    ref_trace: Trace,
    ref_states: HiddenStateRecorder,
    points: list,
    thresholds: Mapping[str, Any],
    *,
    steps: int,
    perturb: Mapping[str, Any] | None,
) -> tuple[dict[str, Any] | None, str | None]:
    """(metrics entry, skip reason) for one dtype."""
    target, skip, notes = make_target(twin, dtype, device)
    if target is None:
        return None, skip
    if perturb:
        perturb_norm_eps(
            target,
            layer=int(perturb["layer"]),
            module=str(perturb["module"]),
            eps=float(perturb["eps"]),
        )
        notes.append(
            f"perturbed on purpose: layer {perturb['layer']} "
            f"{perturb['module']} eps = {perturb['eps']}"
        )
    tgt_trace, tgt_states = run_recorded(target, twin.input_ids, points, ref_trace.tokens, steps)
    drift = layer_drift(ref_states, tgt_states, points)
    u = UNIT_ROUNDOFF.get(dtype, 2.0**-8)
    finite = all(
        bool(torch.isfinite(x).all()) for x in (tgt_trace.prefill_logits, tgt_trace.decode_logits)
    )
    layers_out = [{k: v for k, v in row.items() if k != "finite"} for row in drift]
    entry: dict[str, Any] = {"thresholds": dict(thresholds), "notes": notes, "unit_roundoff": u}
    if not finite:
        bad = int(
            (
                ~torch.isfinite(
                    torch.cat(
                        [tgt_trace.prefill_logits.flatten(), tgt_trace.decode_logits.flatten()]
                    )
                )
            ).sum()
        )
        first_bad = next((row for row in drift if not row["finite"]), None)
        where = (
            (
                f"; first non-finite hidden state at layer {first_bad['layer']} "
                f"({first_bad['module']}: {first_bad['name']})"
            )
            if first_bad
            else ""
        )
        reason = f"{dtype}: the target's logits hold NaN/Inf ({bad} values){where}"
        for row in layers_out:
            for key in ("max_abs_error", "relative_error"):
                if not math.isfinite(row[key]):
                    row[key] = None
        entry.update(
            {
                "max_abs_error": None,
                "mean_abs_error": None,
                "cosine_similarity": None,
                "top1_agreement": None,
                "kl_divergence": None,
                "passed": False,
                "first_divergent_layer": first_bad["layer"] if first_bad else None,
                "first_divergent_module": first_bad["module"] if first_bad else None,
                "first_divergent_name": first_bad["name"] if first_bad else None,
                "layers": layers_out,
                "non_finite_values": bad,
                "reason": reason,
            }
        )
        return entry, None
    metrics = logit_metrics(ref_trace, tgt_trace)
    diverged = first_divergence(drift, thresholds, u)
    failures = []
    if metrics["top1_agreement"] < thresholds["min_top1_agreement"]:
        failures.append(
            f"top-1 agreement {_fmt(metrics['top1_agreement'])} "
            f"< {thresholds['min_top1_agreement']}"
        )
    if metrics["cosine_similarity"] < thresholds["min_cosine_similarity"]:
        failures.append(
            f"cosine similarity {_fmt(metrics['cosine_similarity'])} "
            f"< {thresholds['min_cosine_similarity']}"
        )
    if metrics["kl_divergence"] > thresholds["max_kl_divergence"]:
        failures.append(
            f"KL divergence {_fmt(metrics['kl_divergence'])} > {thresholds['max_kl_divergence']}"
        )
    limit = thresholds.get("max_mean_abs_error")
    if limit is not None and metrics["mean_abs_error"] > limit:
        failures.append(f"mean absolute error {_fmt(metrics['mean_abs_error'])} > {limit}")
    where = (
        (
            f"first divergent layer {diverged['layer']} ({diverged['module']}: "
            f"{diverged['name']}, relative error {_fmt(diverged['relative_error'])})"
        )
        if diverged
        else "no layer's error jumps"
    )
    reason = (
        f"{dtype}: {', '.join(failures)}; {where}"
        if failures
        else f"{dtype}: within thresholds; {where}"
    )
    entry.update(metrics)
    entry.update(
        {
            "passed": not failures,
            "first_divergent_layer": diverged["layer"] if diverged else None,
            "first_divergent_module": diverged["module"] if diverged else None,
            "first_divergent_name": diverged["name"] if diverged else None,
            "layers": layers_out,
            "reason": reason,
        }
    )
    return entry, None


def measure_precision(
    twin: Twin,
    pool: Any,
    *,
    steps: int = DECODE_STEPS,
    perturb: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The precision result for `twin` on `pool` (a PoolSpec or the same fields).

    Returns {"reference": {"device": "cpu", "dtype": "float32"}, "dtypes": {dtype: {...}},
    "skipped_dtypes": {dtype: reason}, "twin", "passed", "decode_steps", "prompt": {"batch",
    "tokens"}}. `perturb` ({"layer", "module", "eps"}) changes one norm's epsilon in every
    target (see `perturb_norm_eps`). Raises `StageFailed` (device absent; a dtype failed:
    the exception's `result` attribute holds this dict) .
    """
    device = resolve_device(pool.device, pool.name)
    reference = twin.model
    points = hook_points(reference)
    ref_trace, ref_states = run_recorded(reference, twin.input_ids, points, None, steps)
    if not all(
        bool(torch.isfinite(x).all()) for x in (ref_trace.prefill_logits, ref_trace.decode_logits)
    ):
        raise StageFailed(
            "the float32 reference twin itself produces NaN/Inf: "
            "the config's values overflow even in float32"
        )
    overrides = pool.precision_thresholds or {}
    result: dict[str, Any] = {
        "reference": {"device": "cpu", "dtype": "float32"},
        "target_device": str(device),
        "dtypes": {},
        "skipped_dtypes": {},
        "decode_steps": steps,
        "prompt": {"batch": int(twin.input_ids.shape[0]), "tokens": int(twin.input_ids.shape[1])},
        "twin": twin.description,
    }
    for dtype in pool.dtypes:
        thresholds = thresholds_for(dtype, overrides)
        entry, skipped = compare_dtype(
            twin,
            dtype,
            device,
            ref_trace,
            ref_states,
            points,
            thresholds,
            steps=steps,
            perturb=perturb,
        )
        if entry is None:
            result["skipped_dtypes"][dtype] = skipped
        else:
            result["dtypes"][dtype] = entry
    result["passed"] = all(e["passed"] for e in result["dtypes"].values())
    if not result["passed"]:
        reasons = "; ".join(e["reason"] for e in result["dtypes"].values() if not e["passed"])
        exc = StageFailed(reasons)
        exc.result = result  # type: ignore[attr-defined]  # stored by the lead on failure
        raise exc
    return result


def run(ctx: StageContext) -> dict[str, Any]:
    """Compare the twin on the pool's device in each declared dtype with the float32 reference.

    The twin is the release's real model where its weights are present and small enough
    (`twin.real.twin_for_release`), so the figures are the release's own; else the seeded twin.

    Raises `StageFailed` (with `.result`) when a dtype crosses a threshold or yields NaN/Inf.
    """
    from workers.stages import remote_code

    config = remote_code.fetched_config(ctx)
    if remote_code.needs_remote_code(config):
        return remote_code.run_stage_in_sandbox(ctx, "precision", config)
    result = measure_precision(twin_for_release(ctx, config), ctx.pool)
    for entry in result["dtypes"].values():
        ctx.log(
            f"{entry['reason']} (top-1 {entry['top1_agreement']:.3f}, "
            f"KL {entry['kl_divergence']:.2e})"
        )
    for dtype, why in result["skipped_dtypes"].items():
        ctx.log(f"{dtype} skipped: {why}")
    return result

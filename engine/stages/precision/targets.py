"""Targets: a copy of the twin on the pool's device in one serving dtype.

bfloat16, float16 and float32 are the twin cast whole (`make_target`). int8 (weight-only) and
float8 e4m3 swap each `nn.Linear` whose widths the kernels take for a `QuantizedLinear` that
runs torch's own kernels; everything else (fused expert weights, embeddings, norms) stays
bfloat16. `perturb_norm_eps` makes a deliberately wrong target for tests and drills.
"""

from __future__ import annotations

import torch

from engine.twin import Twin, copy_twin_model

from .thresholds import SUPPORTED_DTYPES


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


def quantize_linears(model: torch.nn.Module, kind: str) -> tuple[int, int]:
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


def probe_quantized(kind: str, device: torch.device) -> str | None:
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
        why = probe_quantized(kind, device)
        if why is not None:
            return None, why, notes
        model = copy_twin_model(twin).to(device=device, dtype=torch.bfloat16)
        swapped, kept = quantize_linears(model, kind)
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
    from .drift import decoder_layers

    prefix, layers = decoder_layers(model)
    norm = layers[layer].get_submodule(module)
    for attr in ("variance_epsilon", "eps", "epsilon"):
        if hasattr(norm, attr):
            setattr(norm, attr, eps)
            return
    raise ValueError(f"{prefix}.{layer}.{module} has no epsilon attribute")

"""Safetensors checkpoints for tests, real-shaped but holding no weights.

`meta_checkpoint` builds a config's model with transformers on the meta device and takes its
tensors as `save_pretrained` would write them (tied weights dropped, transformers' weight
conversions reverted to the checkpoint's own names and layout): names, dtypes and shapes
only. `safetensors_file` writes one file from such a table: a valid header with its
`data_offsets`, then zero bytes for the data (or none at all, `data=False`: a file cut after
its header, which a header-only reader must still read). `shard` splits a table into
numbered shards with their `model.safetensors.index.json`.

These are test helpers: they build what a real release would hold, independently of the
engine's own readers, so that a test can compare the engine's counts with the tensors put
in.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from typing import Any

# Bits per element of the safetensors dtypes these helpers write.
DTYPE_BITS = {"F32": 32, "BF16": 16, "F16": 16, "F8_E4M3": 8, "U8": 8, "I8": 8, "I32": 32}

# name -> (safetensors dtype, shape)
Table = dict[str, tuple[str, tuple[int, ...]]]


def nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    """Bytes of one tensor."""
    return math.ceil(math.prod(shape) * DTYPE_BITS[dtype] / 8)


def meta_checkpoint(config: Mapping[str, Any], *, dtype: str = "BF16") -> Table:
    """The tensors `save_pretrained` writes for `config` (a config.json dict), all in `dtype`
    (persistent float32 buffers such as DeepSeek's `e_score_correction_bias` in F32), built
    on the meta device (no memory). The model type must be one transformers knows."""
    return meta_build(config, dtype=dtype)[0]


def meta_build(config: Mapping[str, Any], *, dtype: str = "BF16") -> tuple[Table, int]:
    """`meta_checkpoint`'s table and the parameters of the model transformers builds
    (`model.parameters()`: buffers not counted, a tied matrix once)."""
    import torch
    import transformers
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    kwargs = {k: v for k, v in config.items() if k not in ("model_type", "quantization_config")}
    cfg = transformers.AutoConfig.for_model(config["model_type"], **kwargs)
    architecture = (config.get("architectures") or [None])[0]
    model_class = getattr(transformers, architecture, None) if architecture else None
    with torch.device("meta"):
        if model_class is not None:
            model = model_class._from_config(cfg)
        else:
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    buffers = {name for name, _ in model.named_buffers()}
    state = remove_tied_weights_from_state_dict(model.state_dict(), model)
    state = revert_weight_conversion(model, state)
    table: Table = {}
    for name, tensor in state.items():
        kept = "F32" if name in buffers and tensor.dtype == torch.float32 else dtype
        table[name] = (kept, tuple(int(d) for d in tensor.shape))
    return table, sum(p.numel() for p in model.parameters())


def header_bytes(table: Table) -> tuple[bytes, int]:
    """The 8-byte length and JSON header of a file holding `table` (tensors in name order,
    the header padded with spaces to 8 bytes as safetensors writes it), and its data size."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in sorted(table):
        dtype, shape = table[name]
        size = nbytes(dtype, shape)
        offsets = [offset, offset + size]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": offsets}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, offset


def safetensors_file(table: Table, *, data: bool = True) -> bytes:
    """A safetensors file of `table`: header, then zero bytes for the data (`data=False`:
    none, the file ends after its header)."""
    head, size = header_bytes(table)
    return head + (bytes(size) if data else b"")


def shard(table: Table, count: int, *, data: bool = True) -> dict[str, bytes]:
    """`table` split into `count` files `model-0000i-of-0000n.safetensors` (tensors dealt
    in name order, about as many each: every file holds one when the table has `count`)
    with the index naming them: {file name: bytes}."""
    names = sorted(table)
    files: dict[str, bytes] = {}
    weight_map: dict[str, str] = {}
    for i in range(count):
        shard_name = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
        part = {name: table[name] for name in names[i::count]}
        files[shard_name] = safetensors_file(part, data=data)
        weight_map.update(dict.fromkeys(part, shard_name))
    total = sum(nbytes(*table[name]) for name in names)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    return files


def numel(table: Table) -> int:
    """Elements over every tensor of `table`."""
    return sum(math.prod(shape) for _, shape in table.values())

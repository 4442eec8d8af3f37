"""The accelerator catalog: per accelerator kind, the datasheet figures a plan needs.

The figures live in `accelerators.json` next to this module (versioned with the code; each
figure names its source there). `load_catalog()` reads and checks the file;
`Catalog.with_entries()` adds or replaces kinds (the admin's rows, in the same format);
`cpu_accelerator()` describes a machine as one "cpu" device (cores and memory, measured now
or as a worker measured them at start). Units: bytes, bytes/s, FLOP/s. A figure the vendor
does not publish is `None`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

CATALOG_PATH = Path(__file__).resolve().parent / "accelerators.json"

_NUMBER_FIELDS = (
    "memory_bandwidth_bytes_per_s",
    "dense_bf16_flops",
    "dense_fp8_flops",
    "intra_node_bandwidth_bytes_per_s",
    "inter_node_bandwidth_bytes_per_s",
)


# Figures only the catalog file gives (an admin row has no field for them): dense FP4 matrix
# FLOP/s, published for Blackwell (NVFP4) and CDNA 4 (MXFP4), null for devices without FP4.
FILE_ONLY_FIGURES = ("dense_fp4_flops",)

LOW_PRECISION_KINDS = ("fp8", "int8")


class CatalogError(ValueError):
    """The catalog file (or an admin row) is malformed, or a kind is not in it. `field` is
    the entry key at fault ("memory_bytes", "dtypes", "sources", ...) when there is one, so
    a form can show the error on that field."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Accelerator:
    """One accelerator kind.

    `memory_bytes` (bytes) is the device memory; `memory_datasheet` keeps the datasheet's
    words (its "GB" read as GiB, see the catalog's conventions). Bandwidths are bytes/s per
    direction, FLOP figures dense peak FLOP/s (`dense_fp8_flops` is INT8 OP/s when
    `low_precision_kind` is "int8"; `dense_fp4_flops` is FP4 matrix FLOP/s, NVFP4 or MXFP4,
    None where the device has no FP4 unit). `sources` maps each figure to its datasheet.
    """

    kind: str
    name: str
    vendor: str
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float | None
    dense_bf16_flops: float | None
    dense_fp8_flops: float | None
    dtypes: tuple[str, ...]
    intra_node_bandwidth_bytes_per_s: float | None
    inter_node_bandwidth_bytes_per_s: float | None
    devices_per_node: int
    dense_fp4_flops: float | None = None
    low_precision_kind: str | None = None
    device_resource: str = "nvidia.com/gpu"
    memory_datasheet: str = ""
    sources: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # A cpu kind whose measured speed figures come from probes taken on a busy host (no
    # quiet probe of the pool yet): predictions on them are labelled so.
    measured_on_busy_host: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every field."""
        return {
            "kind": self.kind,
            "name": self.name,
            "vendor": self.vendor,
            "memory_bytes": self.memory_bytes,
            "memory_datasheet": self.memory_datasheet,
            "memory_bandwidth_bytes_per_s": self.memory_bandwidth_bytes_per_s,
            "dense_bf16_flops": self.dense_bf16_flops,
            "dense_fp8_flops": self.dense_fp8_flops,
            "dense_fp4_flops": self.dense_fp4_flops,
            "low_precision_kind": self.low_precision_kind,
            "dtypes": list(self.dtypes),
            "intra_node_bandwidth_bytes_per_s": self.intra_node_bandwidth_bytes_per_s,
            "inter_node_bandwidth_bytes_per_s": self.inter_node_bandwidth_bytes_per_s,
            "devices_per_node": self.devices_per_node,
            "device_resource": self.device_resource,
            "sources": dict(self.sources),
            "notes": list(self.notes),
            "measured_on_busy_host": self.measured_on_busy_host,
        }


@dataclass(frozen=True)
class Catalog:
    """The accelerators of one catalog file version.

    `cpu` describes the "cpu" kind when set (a worker's registered cores and memory);
    otherwise "cpu" is the machine this runs on, measured when asked.
    """

    version: str
    accelerators: Mapping[str, Accelerator]
    conventions: Mapping[str, str] = field(default_factory=dict)
    cpu: Accelerator | None = None

    def accelerator(self, kind: str) -> Accelerator:
        """The accelerator `kind` ("h100", ...; "cpu": `self.cpu`, else this machine
        measured now). Raises `CatalogError` naming the known kinds."""
        if kind == "cpu":
            return self.cpu or cpu_accelerator()
        try:
            return self.accelerators[kind]
        except KeyError:
            known = ", ".join([*sorted(self.accelerators), "cpu"])
            raise CatalogError(f"unknown accelerator kind {kind!r}; known kinds: {known}") from None

    def kinds(self) -> list[str]:
        """Catalog kinds in file order (without "cpu")."""
        return list(self.accelerators)

    def with_entries(self, entries: list[Mapping[str, Any]], *, label: str = "") -> Catalog:
        """This catalog with `entries` (catalog-file format) added, or replacing the entry
        of the same kind. Each entry is checked as a file entry is (`parse_catalog`);
        raises `CatalogError` for a malformed one. `label` is appended to the version
        ("2025-06-01.1+admin row h100")."""
        if not entries:
            return self
        accelerators = dict(self.accelerators)
        for entry in entries:
            acc = parse_accelerator(entry)
            accelerators[acc.kind] = acc
        version = f"{self.version}+{label}" if label else self.version
        return replace(self, version=version, accelerators=accelerators)

    def with_cpu(self, cpu: Accelerator) -> Catalog:
        """This catalog with the "cpu" kind described by `cpu` (e.g. a worker's figures)."""
        return replace(self, cpu=cpu)


def _positive_number(entry: Mapping[str, Any], key: str, *, allow_none: bool) -> float | None:
    value = entry.get(key)
    if value is None and allow_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not value > 0
        or value == float("inf")
    ):
        raise CatalogError(
            f"{entry.get('kind')!r}: {key} must be a positive number, got {value!r}", field=key
        )
    return float(value)


SOURCED_FIGURES = ("memory_bytes", *_NUMBER_FIELDS)


def missing_sources(entry: Mapping[str, Any]) -> list[str]:
    """The figures of a catalog entry that are given but have no source in its `sources`
    (keys as in the file, in `SOURCED_FIGURES` then `FILE_ONLY_FIGURES` order): all of them,
    not only the first."""
    sources = entry.get("sources")
    sources = sources if isinstance(sources, Mapping) else {}
    return [
        key
        for key in (*SOURCED_FIGURES, *FILE_ONLY_FIGURES)
        if entry.get(key) is not None and not str(sources.get(key) or "").strip()
    ]


def parse_accelerator(entry: Mapping[str, Any]) -> Accelerator:
    """One catalog entry (the file's format) as an `Accelerator`. Raises `CatalogError`
    (with `.field`) for a missing or non-positive figure, a figure without a source in
    `sources`, `dtypes` that are not a list of strings, or an unknown low-precision kind."""
    if not isinstance(entry, Mapping):
        raise CatalogError(f"an accelerator entry must be an object, got {type(entry).__name__}")
    kind = entry.get("kind")
    if not isinstance(kind, str) or not kind:
        raise CatalogError(f"accelerator entry without a kind: {entry!r}", field="kind")
    if kind == "cpu":
        raise CatalogError(
            "accelerator kind 'cpu' is reserved: it is the machine a cpu pool's worker runs on",
            field="kind",
        )
    memory = entry.get("memory_bytes")
    if isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0:
        raise CatalogError(
            f"{kind!r}: memory_bytes must be a positive integer, got {memory!r}",
            field="memory_bytes",
        )
    per_node = entry.get("devices_per_node")
    if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node <= 0:
        raise CatalogError(
            f"{kind!r}: devices_per_node must be a positive integer", field="devices_per_node"
        )
    numbers = {
        key: _positive_number(entry, key, allow_none=True)
        for key in (*_NUMBER_FIELDS, *FILE_ONLY_FIGURES)
    }
    dtypes = entry.get("dtypes") or []
    if not isinstance(dtypes, list | tuple) or not all(isinstance(d, str) and d for d in dtypes):
        raise CatalogError(
            f"{kind!r}: dtypes must be a list of dtype names, got {dtypes!r}", field="dtypes"
        )
    low = entry.get("low_precision_kind") or None
    if low is not None and low not in LOW_PRECISION_KINDS:
        raise CatalogError(
            f"{kind!r}: low_precision_kind must be one of {', '.join(LOW_PRECISION_KINDS)} "
            f"or empty, got {low!r}",
            field="low_precision_kind",
        )
    sources = entry.get("sources") or {}
    if not isinstance(sources, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in sources.items()
    ):
        raise CatalogError(
            f"{kind!r}: sources must map each figure to its source text", field="sources"
        )
    if missing := missing_sources(entry):
        raise CatalogError(
            f"{kind!r}: {', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no source "
            f"(add sources[{missing[0]!r}]: the datasheet's title and address)",
            field=missing[0],
        )
    return Accelerator(
        kind=kind,
        name=str(entry.get("name") or kind),
        vendor=str(entry.get("vendor") or ""),
        memory_bytes=memory,
        dtypes=tuple(dtypes),
        devices_per_node=per_node,
        low_precision_kind=low,
        device_resource=str(entry.get("device_resource") or "nvidia.com/gpu"),
        memory_datasheet=str(entry.get("memory_datasheet") or ""),
        sources=dict(sources),
        notes=tuple(entry.get("notes") or ()),
        **numbers,
    )


def parse_catalog(data: Mapping[str, Any]) -> Catalog:
    """A `Catalog` from the parsed JSON document (checks every entry)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("accelerators"), list):
        raise CatalogError("the catalog must be an object with an 'accelerators' list")
    accelerators: dict[str, Accelerator] = {}
    for entry in data["accelerators"]:
        acc = parse_accelerator(entry)
        if acc.kind in accelerators:
            raise CatalogError(f"accelerator kind {acc.kind!r} appears twice", field="kind")
        accelerators[acc.kind] = acc
    return Catalog(
        version=str(data.get("catalog_version") or ""),
        accelerators=accelerators,
        conventions=dict(data.get("conventions") or {}),
    )


@lru_cache(maxsize=4)
def _load(path: str) -> Catalog:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CatalogError(f"cannot read the accelerator catalog {path}: {err}") from err
    return parse_catalog(data)


def load_catalog(path: str | os.PathLike[str] | None = None) -> Catalog:
    """The catalog in `path` (default: the `accelerators.json` shipped with this module)."""
    return _load(str(path or CATALOG_PATH))


def physical_memory_bytes() -> int | None:
    """Physical memory of this machine in bytes (POSIX sysconf pages x page size), or None
    where the OS cannot say."""
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None
    if pages <= 0 or page_size <= 0:
        return None
    return int(pages) * int(page_size)


def cpu_accelerator(
    *,
    cores: int | None = None,
    memory_bytes: int | None = None,
    measured_by: str = "",
    measured_figures: Mapping[str, Any] | None = None,
) -> Accelerator:
    """A machine as one "cpu" device: its cores and memory (bytes).

    Without arguments: the machine this runs on, measured now (`os.cpu_count()`, POSIX
    sysconf). With `cores`/`memory_bytes`: the figures another machine measured (a worker's,
    registered at its start), and `measured_by` names it ("worker cpu@host"); a figure not
    given is measured here. A machine whose memory cannot be read reports 1 byte, so nothing
    fits and the plan says so instead of guessing.

    No datasheet gives a CPU's memory bandwidth and FLOP/s: without `measured_figures` they
    are None and no roofline prediction is made for the cpu kind. `measured_figures` are what
    a performance stage measured on a worker of the pool (`device_probe.probe_device`, via the
    pool's running calibration): {"memory_bandwidth_bytes_per_s", "flops": {"bfloat16": ...},
    "source": "who measured them, how", "host_busy"}; they become the kind's
    `memory_bandwidth_bytes_per_s` and `dense_bf16_flops`, each with that source, labelled
    measured, and `measured_on_busy_host` where "host_busy" is true (probes taken on a busy
    host, the pool having no quiet one: `engine/probe_repeats.py`).
    """
    given = cores is not None or memory_bytes is not None
    if cores is None or isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        cores = os.cpu_count() or 1
    if memory_bytes is None or isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int):
        memory_bytes = physical_memory_bytes() or 0
    memory = memory_bytes
    where = measured_by or "this machine"
    if given:
        memory_source = f"measured by {where} at start: {memory} bytes"
        cores_source = f"measured by {where} at start: {cores} cores"
    else:
        memory_source = "measured: os.sysconf('SC_PAGE_SIZE') x os.sysconf('SC_PHYS_PAGES')"
        cores_source = f"measured: os.cpu_count() = {cores}"
    sources = {"memory_bytes": memory_source, "cores": cores_source}
    bandwidth, flops = _measured_figures(measured_figures)
    if bandwidth is not None and flops is not None:
        source = str((measured_figures or {}).get("source") or "a performance stage's probe")
        sources["memory_bandwidth_bytes_per_s"] = f"measured: {source}"
        sources["dense_bf16_flops"] = f"measured: {source}"
        busy = (measured_figures or {}).get("host_busy") is True
        notes: tuple[str, ...] = (
            "memory bandwidth and BF16 FLOP/s measured on a worker of the pool"
            + (" while its host was busy" if busy else "")
            + " (not a datasheet): roofline predictions use them, labelled so",
        )
    else:
        bandwidth = flops = None
        busy = False
        notes = ("memory bandwidth and FLOP/s are not measured: no roofline prediction",)
    return Accelerator(
        kind="cpu",
        name=f"{where} ({cores} cores)",
        vendor="host",
        memory_bytes=memory if memory > 0 else 1,
        memory_bandwidth_bytes_per_s=bandwidth,
        dense_bf16_flops=flops,
        dense_fp8_flops=None,
        dtypes=("float32", "bfloat16"),
        intra_node_bandwidth_bytes_per_s=None,
        inter_node_bandwidth_bytes_per_s=None,
        devices_per_node=1,
        device_resource="cpu",
        memory_datasheet=f"{memory} bytes ({'registered' if given else 'os.sysconf'})",
        sources=sources,
        notes=notes,
        measured_on_busy_host=busy,
    )


def _measured_figures(figures: Mapping[str, Any] | None) -> tuple[float | None, float | None]:
    """(bytes/s, BF16 FLOP/s) from measured figures; None for a missing or non-positive one."""
    if not isinstance(figures, Mapping):
        return None, None

    def positive(value: Any) -> float | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value) if 0 < value < float("inf") else None

    flops = figures.get("flops")
    bf16 = positive(flops.get("bfloat16")) if isinstance(flops, Mapping) else None
    return positive(figures.get("memory_bandwidth_bytes_per_s")), bf16


__all__ = [
    "CATALOG_PATH",
    "FILE_ONLY_FIGURES",
    "SOURCED_FIGURES",
    "Accelerator",
    "Catalog",
    "CatalogError",
    "cpu_accelerator",
    "load_catalog",
    "missing_sources",
    "parse_accelerator",
    "parse_catalog",
    "physical_memory_bytes",
]

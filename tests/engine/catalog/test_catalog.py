"""The accelerator catalog file and its loader (plain pytest)."""

from __future__ import annotations

import json
import os

import pytest

from engine.catalog import (
    CATALOG_PATH,
    CatalogError,
    cpu_accelerator,
    load_catalog,
    parse_catalog,
)

REQUIRED = ("h200", "h100", "a100-80gb", "mi300x", "gaudi3", "ascend-910b")
FIGURES = (
    "memory_bytes",
    "memory_bandwidth_bytes_per_s",
    "dense_bf16_flops",
    "dense_fp8_flops",
    "dense_fp4_flops",
    "intra_node_bandwidth_bytes_per_s",
    "inter_node_bandwidth_bytes_per_s",
)


def test_required_kinds_and_a_second_domestic_accelerator():
    catalog = load_catalog()
    for kind in REQUIRED:
        assert catalog.accelerator(kind).kind == kind
    vendors = {catalog.accelerator(k).vendor for k in catalog.kinds()}
    assert "Cambricon" in vendors and "Huawei" in vendors
    assert catalog.version


def test_every_published_figure_names_its_source():
    catalog = load_catalog()
    for kind in catalog.kinds():
        acc = catalog.accelerator(kind)
        for figure in FIGURES:
            if getattr(acc, figure) is not None:
                assert acc.sources.get(figure), f"{kind}.{figure} has no source"


def test_datasheet_figures():
    catalog = load_catalog()
    h100 = catalog.accelerator("h100")
    # NVIDIA H100 datasheet (SXM): 80GB, 3.35 TB/s, BF16 1,979 TFLOPS with sparsity.
    assert h100.memory_bytes == 80 * 2**30
    assert h100.memory_bandwidth_bytes_per_s == 3.35e12
    assert h100.dense_bf16_flops == 1979e12 / 2
    # AMD MI300X data sheet: 192 GB HBM3, 5.3 TB/s, BF16 1,307.4 TFLOPS dense.
    mi300x = catalog.accelerator("mi300x")
    assert mi300x.memory_bytes == 192 * 2**30 and mi300x.dense_bf16_flops == 1307.4e12
    # A100 has no FP8: its 8-bit figure is INT8.
    assert catalog.accelerator("a100-80gb").low_precision_kind == "int8"


def test_fp4_figures_of_the_blackwell_kinds():
    catalog = load_catalog()
    # NVIDIA HGX B200: FP4 Tensor Core 72 PFLOPS without sparsity for 8 GPUs.
    b200 = catalog.accelerator("b200")
    assert b200.dense_fp4_flops == 72e15 / 8 == 2 * b200.dense_fp8_flops
    assert b200.memory_bytes == 180 * 2**30 and b200.memory_bandwidth_bytes_per_s == 8e12
    # GB200 NVL72: FP4 1,440 PFLOPS with sparsity for 72 GPUs, one NVLink domain of 72.
    gb200 = catalog.accelerator("gb200")
    assert gb200.dense_fp4_flops == 1440e15 / 72 / 2
    assert gb200.memory_bytes == 186 * 2**30 and gb200.devices_per_node == 72
    assert b200.to_dict()["dense_fp4_flops"] == 9e15
    # Hopper has no FP4 unit: the figure is null, not zero.
    assert catalog.accelerator("h100").dense_fp4_flops is None
    assert catalog.accelerator("h100").to_dict()["dense_fp4_flops"] is None


def test_an_fp4_figure_without_source_or_positive_value_is_refused():
    data = json.loads(CATALOG_PATH.read_text())
    b200 = next(entry for entry in data["accelerators"] if entry["kind"] == "b200")
    del b200["sources"]["dense_fp4_flops"]
    with pytest.raises(CatalogError, match="dense_fp4_flops has no source") as refused:
        parse_catalog(data)
    assert refused.value.field == "dense_fp4_flops"
    b200["sources"]["dense_fp4_flops"] = "a datasheet"
    b200["dense_fp4_flops"] = 0
    with pytest.raises(CatalogError, match="dense_fp4_flops must be a positive number"):
        parse_catalog(data)


def test_unpublished_figures_are_null_and_said_so():
    ascend = load_catalog().accelerator("ascend-910b")
    assert ascend.memory_bandwidth_bytes_per_s is None and ascend.dense_bf16_flops is None
    assert any("not public" in note for note in ascend.notes)


def test_unknown_kind_names_the_known_ones():
    with pytest.raises(CatalogError, match="h100"):
        load_catalog().accelerator("tpu-v9")


def test_a_figure_without_source_is_refused():
    data = json.loads(CATALOG_PATH.read_text())
    del data["accelerators"][0]["sources"]["memory_bandwidth_bytes_per_s"]
    with pytest.raises(CatalogError, match="no source"):
        parse_catalog(data)


def test_negative_memory_is_refused():
    data = json.loads(CATALOG_PATH.read_text())
    data["accelerators"][0]["memory_bytes"] = -1
    with pytest.raises(CatalogError, match="memory_bytes"):
        parse_catalog(data)


def test_cpu_kind_measures_this_machine():
    cpu = cpu_accelerator()
    expected = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert cpu.kind == "cpu" and cpu.memory_bytes == expected
    assert str(os.cpu_count()) in cpu.name
    assert cpu.memory_bandwidth_bytes_per_s is None
    assert load_catalog().accelerator("cpu").memory_bytes == expected

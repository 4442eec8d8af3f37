"""The admin's catalog rows and pool layouts: checked when saved as the catalog file is, and
shown next to what the shipped file says; the worker list is read-only."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from adaptation.catalog import catalog_current, pool_catalog
from adaptation.models import AcceleratorKind, AcceleratorPool, Worker
from tests.factories import cpu_pool
from workers.catalog import load_catalog

pytestmark = pytest.mark.django_db

GIB = 2**30


def kind_row(**fields) -> AcceleratorKind:
    defaults = {
        "kind": "npu-x1",
        "name": "Example NPU",
        "vendor": "Example",
        "memory_gib": 64,
        "memory_bandwidth_tbps": 1.6,
        "dense_bf16_tflops": 320,
        "dtypes": ["bfloat16", "float16"],
        "devices_per_node": 8,
        "sources": {
            "memory_bytes": "Example NPU datasheet, https://example.com/npu",
            "memory_bandwidth_bytes_per_s": "same datasheet",
            "dense_bf16_flops": "same datasheet",
        },
    }
    return AcceleratorKind(**{**defaults, **fields})


def errors_of(row) -> dict:
    with pytest.raises(ValidationError) as err:
        row.full_clean()
    return err.value.message_dict


def test_a_complete_row_is_accepted_and_joins_the_catalog():
    row = kind_row()
    row.full_clean()
    row.save()
    catalog = catalog_current()
    npu = catalog.accelerator("npu-x1")
    assert npu.memory_bytes == 64 * GIB and npu.memory_bandwidth_bytes_per_s == 1.6e12
    assert catalog.kinds()[: len(load_catalog().kinds())] == load_catalog().kinds()


def test_a_figure_without_a_source_is_refused_on_that_field():
    row = kind_row(dense_fp8_tflops=640)  # no sources["dense_fp8_flops"]
    errors = errors_of(row)
    assert list(errors) == ["dense_fp8_tflops"]
    assert 'add "dense_fp8_flops"' in errors["dense_fp8_tflops"][0]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"dtypes": "bfloat16"}, "dtypes"),
        ({"dtypes": ["bfloat16", 16]}, "dtypes"),
        ({"sources": ["a datasheet"]}, "sources"),
        ({"memory_bandwidth_tbps": -1.0}, "memory_bandwidth_tbps"),
        ({"kind": "cpu"}, "kind"),
    ],
)
def test_malformed_rows_are_refused_on_the_field(fields, field):
    assert field in errors_of(kind_row(**fields))


def test_a_pool_refuses_an_unknown_kind_naming_the_known_ones():
    pool = AcceleratorPool(name="tpus", backend="manifest", accelerator="tpu-v9")
    message = errors_of(pool)["accelerator"][0]
    assert "Unknown accelerator kind 'tpu-v9'" in message
    for kind in ("h200", "h100", "mi300x", "ascend-910b"):
        assert kind in message
    kind_row(kind="tpu-v9").save()  # an admin row makes it known
    AcceleratorPool(name="tpus", backend="manifest", accelerator="tpu-v9").full_clean()


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"backend": "cuda"}, "accelerator", "needs its accelerator kind for the plan stage"),
        ({"backend": "cpu", "accelerator": "h100"}, "accelerator", "leave this blank"),
        ({"backend": "cpu", "devices_per_node": 4}, "devices_per_node", "whole machine"),
    ],
)
def test_a_pool_layout_the_plan_cannot_use_is_refused(fields, field, words):
    message = errors_of(AcceleratorPool(name="p", **fields))[field][0]
    assert words in message


def test_sensible_pools_are_accepted():
    AcceleratorPool(name="cpu2", backend="cpu").full_clean()
    AcceleratorPool(
        name="h200", backend="cuda", device="cuda", accelerator="h200", nodes=2
    ).full_clean()


def test_pool_catalog_of_a_gpu_pool():
    pool = AcceleratorPool.objects.create(
        name="mi300x", backend="manifest", accelerator="mi300x", devices_per_node=4, nodes=2
    )
    catalog, layout, note = pool_catalog(pool)
    assert (layout.accelerator, layout.devices_per_node, layout.nodes) == ("mi300x", 4, 2)
    assert catalog.accelerator("mi300x").memory_bytes == 192 * GIB
    assert note.startswith("mi300x (AMD Instinct")


def test_pool_catalog_of_the_cpu_pool_uses_its_live_worker():
    from django.utils import timezone

    Worker.objects.create(
        name="cpu@host",
        hostname="host",
        queues=["pool.cpu", "day0"],
        cpu_cores=8,
        memory_bytes=16 * GIB,
        last_heartbeat_at=timezone.now(),
    )
    catalog, layout, note = pool_catalog(cpu_pool())
    assert layout.accelerator == "cpu" and layout.devices == 1
    cpu = catalog.accelerator("cpu")
    assert cpu.memory_bytes == 16 * GIB and cpu.name == "cpu@host (8 cores)"
    assert (
        note
        == "cpu is the machine of worker cpu@host as it registered at start (8 cores, 16.0 GiB)"
    )


def test_the_kind_admin_shows_what_the_file_says(logged_in_client):
    h100 = load_catalog().accelerator("h100")
    row = kind_row(kind="h100", name="H100 override", memory_gib=96)
    row.save()
    page = logged_in_client.get(f"/admin/adaptation/acceleratorkind/{row.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "What the file says for this kind" in text
    assert h100.name in text and str(h100.memory_bytes) in text
    assert "this row replaces it" in text
    listing = logged_in_client.get("/admin/adaptation/acceleratorkind/").content.decode()
    assert "H100 override" in listing


def test_the_kind_admin_refuses_a_figure_without_source(logged_in_client):
    page = logged_in_client.post(
        "/admin/adaptation/acceleratorkind/add/",
        {
            "kind": "npu-x2",
            "name": "NPU",
            "memory_gib": "32",
            "memory_bandwidth_tbps": "1.0",
            "dtypes": '["bfloat16"]',
            "devices_per_node": "8",
            "device_resource": "example.com/npu",
            "sources": '{"memory_bytes": "datasheet"}',
        },
    )
    assert page.status_code == 200  # the form again, with the error
    assert "add &quot;memory_bandwidth_bytes_per_s&quot;" in page.content.decode()
    assert not AcceleratorKind.objects.filter(kind="npu-x2").exists()


def test_pool_and_worker_admin_pages(logged_in_client):
    from django.utils import timezone

    pool = cpu_pool()
    page = logged_in_client.get(f"/admin/adaptation/acceleratorpool/{pool.pk}/change/")
    assert page.status_code == 200 and "Accelerator layout (for the plan)" in page.content.decode()
    Worker.objects.create(
        name="cpu@host", hostname="host", queues=["pool.cpu"], backend="cpu",
        devices=[{"index": 0}], last_heartbeat_at=timezone.now(),
    )  # fmt: skip
    listing = logged_in_client.get("/admin/adaptation/worker/").content.decode()
    assert "cpu@host" in listing
    assert logged_in_client.get("/admin/adaptation/worker/add/").status_code == 403

"""The admin's catalog rows and pool layouts: checked when saved as the catalog file is, and
shown next to what the shipped file says; the worker list is read-only."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from adaptation import catalog as site_catalog
from adaptation.catalog import pool_catalog, pool_layout
from adaptation.models import AcceleratorKind, AcceleratorPool, Worker
from engine.catalog import SOURCED_FIGURES, load_catalog
from engine.units import gb_per_s_to_bytes_per_s
from tests import dom
from tests.factories import cpu_pool

pytestmark = pytest.mark.django_db

GIB = 2**30


def kind_row(**fields) -> AcceleratorKind:
    defaults = {
        "kind": "npu-x1",
        "name": "Example NPU",
        "vendor": "Example",
        "memory_gib": 64,
        "memory_bandwidth_tb_per_s": 1.6,
        "dense_bf16_tflop_per_s": 320,
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
    catalog = AcceleratorKind.objects.catalog()
    npu = catalog.accelerator("npu-x1")
    assert npu.memory_bytes == 64 * GIB and npu.memory_bandwidth_bytes_per_s == 1.6e12
    assert catalog.kinds()[: len(load_catalog().kinds())] == load_catalog().kinds()


def test_a_figure_without_a_source_is_refused_on_that_field():
    row = kind_row(dense_fp8_tflop_per_s=640)  # no sources["dense_fp8_flops"]
    errors = errors_of(row)
    assert list(errors) == ["dense_fp8_tflop_per_s"]
    assert 'add "dense_fp8_flops"' in errors["dense_fp8_tflop_per_s"][0]


def test_every_figure_without_a_source_is_reported_at_once():
    """Not one per save: each figure given without its source is named in one go."""
    row = kind_row(
        dense_fp8_tflop_per_s=640,
        intra_node_bandwidth_gb_per_s=392,
        inter_node_bandwidth_gb_per_s=50,
        sources={"memory_bytes": "Example NPU datasheet, https://example.com/npu"},
    )
    errors = errors_of(row)
    assert sorted(errors) == sorted(
        [
            "memory_bandwidth_tb_per_s",
            "dense_bf16_tflop_per_s",
            "dense_fp8_tflop_per_s",
            "intra_node_bandwidth_gb_per_s",
            "inter_node_bandwidth_gb_per_s",
        ]
    )
    assert 'add "inter_node_bandwidth_bytes_per_s"' in errors["inter_node_bandwidth_gb_per_s"][0]


def test_unit_fields_say_their_unit_and_sources_its_keys():
    """Names say the unit ("_gb_per_s": gigabytes per second, not gigabits), and so do the
    labels the admin shows; the sources field lists the keys it expects."""
    labels = {f.name: str(f.verbose_name) for f in AcceleratorKind._meta.get_fields() if f.concrete}
    assert labels["memory_gib"] == "Memory (GiB)"
    assert labels["memory_bandwidth_tb_per_s"] == "Memory bandwidth (TB/s)"
    assert labels["dense_bf16_tflop_per_s"] == "Dense BF16 (TFLOP/s)"
    assert labels["dense_fp8_tflop_per_s"] == "Dense FP8 (TFLOP/s)"
    assert labels["intra_node_bandwidth_gb_per_s"] == "Intra-node bandwidth (GB/s per direction)"
    assert "GB/s" in labels["inter_node_bandwidth_gb_per_s"]
    pool_labels = {f.name: str(f.verbose_name) for f in AcceleratorPool._meta.concrete_fields}
    assert pool_labels["intra_node_bandwidth_gb_per_s"] == (
        "Intra-node bandwidth (GB/s per direction)"
    )
    assert "GB/s" in pool_labels["inter_node_bandwidth_gb_per_s"]
    help_text = AcceleratorKind._meta.get_field("sources").help_text
    for key in SOURCED_FIGURES:
        assert key in help_text


def test_a_pools_bandwidth_in_gb_per_s_reaches_the_planner_in_bytes_per_s():
    from workers.runner import pool_spec

    pool = AcceleratorPool.objects.create(
        name="h200x8",
        backend="manifest",
        accelerator="h200",
        intra_node_bandwidth_gb_per_s=450,
        inter_node_bandwidth_gb_per_s=50,
    )
    layout = pool_layout(pool)
    spec = pool_spec(pool)
    assert layout.intra_node_bandwidth_bytes_per_s == 450e9 == gb_per_s_to_bytes_per_s(450)
    assert spec.intra_node_bandwidth_bytes_per_s == 450e9
    assert layout.inter_node_bandwidth_bytes_per_s == spec.inter_node_bandwidth_bytes_per_s == 50e9
    assert gb_per_s_to_bytes_per_s(None) is None


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"dtypes": "bfloat16"}, "dtypes"),
        ({"dtypes": ["bfloat16", 16]}, "dtypes"),
        ({"sources": ["a datasheet"]}, "sources"),
        ({"memory_bandwidth_tb_per_s": -1.0}, "memory_bandwidth_tb_per_s"),
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
        == "cpu is the machine of worker cpu@host as it registered at start (8 cores, 16.0 GiB); "
        "no performance run on the pool measured its memory bandwidth and FLOP/s yet"
    )
    assert cpu.memory_bandwidth_bytes_per_s is None  # no prediction without measured figures


def probed_run(pool, bandwidth: float, bf16: float, host: str = "cpu@host"):
    """A succeeded performance run of `pool` whose device probe measured these figures."""
    from tests.factories import make_job

    job = make_job(
        stages=("performance",),
        pool=pool,
        statuses={"performance": "succeeded"},
        results={
            "performance": {
                "calibration": {
                    "device": {
                        "kind": "measured",
                        "device": "cpu",
                        "memory_bandwidth_bytes_per_s": bandwidth,
                        "flops": {"bfloat16": bf16},
                    }
                }
            }
        },
    )
    run = job.stage_runs.get()
    run.worker_host = host
    run.save(update_fields=["worker_host"])
    return run


def test_measured_figures_are_the_median_of_the_last_performance_runs():
    from adaptation.selectors.calibration import pool_measured_figures

    pool = cpu_pool()
    assert pool_measured_figures(pool=pool) is None
    oldest = probed_run(pool, 1e9, 1e10)  # beyond the window of 5
    runs = [probed_run(pool, bw * 1e9, fl * 1e11) for bw, fl in ((20, 1), (10, 3), (40, 2))]
    runs += [probed_run(pool, bw * 1e9, fl * 1e11) for bw, fl in ((30, 5), (50, 4))]
    figures = pool_measured_figures(pool=pool)
    assert figures["memory_bandwidth_bytes_per_s"] == 30e9  # median of 20, 10, 40, 30, 50
    assert figures["flops"]["bfloat16"] == 3e11  # median of 1, 3, 2, 5, 4
    assert oldest.pk not in figures["runs"] and sorted(figures["runs"]) == [r.pk for r in runs]
    assert figures["source"].startswith("median of 5 performance runs (")
    assert pool_measured_figures(pool=pool, runs=2)["memory_bandwidth_bytes_per_s"] == 40e9


def test_pool_catalog_of_the_cpu_pool_predicts_on_the_measured_figures():
    from adaptation.selectors.calibration import pool_calibration, pool_measured_figures
    from engine.stages.plan.run import pool_catalog_for_stage

    pool = cpu_pool()
    runs = [probed_run(pool, bw * 1e9, 2e11) for bw in (10, 30, 20)]
    catalog, _layout, note = pool_catalog(pool)
    cpu = catalog.accelerator("cpu")
    assert cpu.memory_bandwidth_bytes_per_s == 20e9 and cpu.dense_bf16_flops == 2e11
    assert "memory bandwidth 20.0 GB/s and BF16 0.20 TFLOP/s measured, not a datasheet's" in note
    assert f"median of 3 performance runs (stage runs {runs[-1].pk}, " in note
    # the same figures the plan stage gets (the runner passes pool_calibration to it)
    stage_cpu = pool_catalog_for_stage(
        pool, measured_figures=pool_calibration(pool=pool)["device"]
    ).accelerator("cpu")
    assert stage_cpu.memory_bandwidth_bytes_per_s == cpu.memory_bandwidth_bytes_per_s
    assert pool_measured_figures(pool=pool) == pool_calibration(pool=pool)["device"]


def test_pool_catalog_reuses_a_loaded_catalog_and_names_the_figures_origin():
    """A page planning many pools loads the catalog once: given it, `pool_catalog` asks the
    database nothing about accelerator kinds, and still says whose figures it uses."""
    kind_row(kind="h100", name="H100 override", memory_gib=96).save()
    loaded = AcceleratorKind.objects.catalog()
    h100 = AcceleratorPool.objects.create(name="h100x8", backend="manifest", accelerator="h100")
    h200 = AcceleratorPool.objects.create(name="h200x8", backend="manifest", accelerator="h200")
    with CaptureQueriesContext(connection) as queries:
        _, _, h100_note = pool_catalog(h100, loaded)
        catalog, _, h200_note = pool_catalog(h200, loaded)
    assert not [q for q in queries.captured_queries if "acceleratorkind" in q["sql"]]
    assert catalog is loaded
    assert h100_note == "h100 (H100 override) figures from the admin's catalog row"
    assert h200_note.startswith("h200 (NVIDIA H200") and h200_note.endswith(
        f"figures from catalog {load_catalog().version}"
    )


def test_live_workers_are_read_in_one_place():
    """The cpu kind's worker comes from the workers selector's `live_workers`, the only one."""
    from adaptation.selectors import inventory, workers

    assert site_catalog.live_workers is workers.live_workers
    assert not hasattr(inventory, "live_workers")


def test_gib_is_defined_once():
    from adaptation.charts import plan as charts
    from adaptation.presenters import plan as plan_presenters
    from adaptation.templatetags import day0_format
    from engine import formatting, units

    assert units.GIB == 2**30
    for module in (charts, day0_format, plan_presenters, site_catalog, formatting):
        assert getattr(module, "GIB", units.GIB) is units.GIB, module.__name__


def test_the_kind_list_shows_the_shipped_kinds_before_any_row(logged_in_client):
    """A site starts with no row: the list says what the shipped file already holds, and how
    to override a kind, instead of a bare "0 accelerator kinds"."""
    shipped = load_catalog()
    kind_row(kind="h100", name="H100 override").save()
    page = logged_in_client.get("/admin/adaptation/acceleratorkind/")
    assert page.status_code == 200
    html = page.content.decode()
    block = dom.find(html, "div.module#shipped-catalog")
    assert f"Shipped catalog {shipped.version}: {len(shipped.kinds())} kinds" in block.text
    assert "Add a row with the same kind to override" in block.text
    listed = [row["data-kind"] for row in block.select('tr[class="shipped-kind"]')]
    assert listed == shipped.kinds()
    h200 = shipped.accelerator("h200")
    cells = dom.texts(block, 'tr[class="shipped-kind"][data-kind="h200"] > td')
    assert cells[1].startswith(h200.name)
    assert cells[2] == f"{h200.memory_bytes / 2**30:,g}"
    assert cells[3] == f"{h200.memory_bandwidth_bytes_per_s / 1e12:,g}"
    assert cells[4] == f"{h200.dense_bf16_flops / 1e12:,g}"
    assert cells[5] == "no"
    h100 = dom.texts(block, 'tr[class="shipped-kind"][data-kind="h100"] > td')
    assert h100[-1] == "yes"  # overridden by a row
    assert "H100 override" in html  # the row itself, below


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
            "memory_bandwidth_tb_per_s": "1.0",
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

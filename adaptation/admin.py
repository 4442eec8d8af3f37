"""Admin for the rows people configure (watches, pools, accelerator kinds) and read-mostly
views of the rest."""

from __future__ import annotations

import json

from django.contrib import admin
from django.utils.html import format_html

from adaptation.models import (
    AcceleratorKind,
    AcceleratorPool,
    AdaptationJob,
    HubWatch,
    ModelRelease,
    OperatorCheck,
    PrecisionResult,
    StageRun,
    Worker,
)
from workers.catalog import CatalogError, load_catalog


@admin.register(AcceleratorPool)
class AcceleratorPoolAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "backend",
        "accelerator",
        "devices_per_node",
        "nodes",
        "device",
        "queue",
        "dtypes",
        "enabled",
    )
    list_filter = ("backend", "accelerator", "enabled")
    search_fields = ("name", "queue", "accelerator")
    fieldsets = (
        (None, {"fields": ("name", "backend", "queue", "device", "enabled", "description")}),
        (
            "Accelerator layout (for the plan)",
            {
                "description": "The catalog kind and how many devices: a cpu pool leaves the "
                "kind blank (its worker's machine is one device); blank sizes and bandwidths "
                "take the catalog's figures for the kind.",
                "fields": (
                    "accelerator",
                    "devices_per_node",
                    "nodes",
                    "intra_node_bandwidth_gbps",
                    "inter_node_bandwidth_gbps",
                ),
            },
        ),
        (
            "Validation",
            {
                "fields": (
                    "dtypes",
                    "operator_manifest",
                    "trust_remote_code_orgs",
                    "precision_thresholds",
                    "real_weights_max_bytes",
                )
            },
        ),
    )


def _shipped_entry(kind: str) -> dict | None:
    """The shipped catalog file's entry for `kind`, or None (not in the file, or unreadable)."""
    try:
        catalog = load_catalog()
    except CatalogError:
        return None
    accelerator = catalog.accelerators.get(kind)
    return accelerator.to_dict() if accelerator is not None else None


@admin.register(AcceleratorKind)
class AcceleratorKindAdmin(admin.ModelAdmin):
    list_display = (
        "kind",
        "name",
        "memory_gib",
        "memory_bandwidth_tbps",
        "dense_bf16_tflops",
        "dense_fp8_tflops",
        "overrides_file",
        "updated_at",
    )
    search_fields = ("kind", "name", "vendor")
    readonly_fields = ("shipped_figures", "updated_at")
    fieldsets = (
        (None, {"fields": ("kind", "name", "vendor")}),
        (
            "Figures (decimal units: GiB of memory, TB/s, TFLOP/s, GB/s per direction)",
            {
                "description": 'Every figure given needs its source in "sources", keyed as '
                'in the catalog file: {"memory_bytes": "datasheet title, URL", '
                '"memory_bandwidth_bytes_per_s": "...", "dense_bf16_flops": "...", ...}. '
                "Leave a figure the vendor does not publish blank.",
                "fields": (
                    "memory_gib",
                    "memory_bandwidth_tbps",
                    "dense_bf16_tflops",
                    "dense_fp8_tflops",
                    "low_precision_kind",
                    "dtypes",
                    "intra_node_bandwidth_gbps",
                    "inter_node_bandwidth_gbps",
                    "devices_per_node",
                    "device_resource",
                    "sources",
                    "notes",
                ),
            },
        ),
        ("The shipped catalog file", {"fields": ("shipped_figures", "updated_at")}),
    )

    @admin.display(boolean=True, description="Overrides the file")
    def overrides_file(self, obj: AcceleratorKind) -> bool:
        return _shipped_entry(obj.kind) is not None

    @admin.display(description="What the file says for this kind")
    def shipped_figures(self, obj: AcceleratorKind) -> str:
        """The shipped catalog file's entry for the row's kind (read-only), so an admin sees
        what the row overrides."""
        entry = _shipped_entry(obj.kind) if obj.kind else None
        if entry is None:
            return (
                f"The shipped catalog {load_catalog().version} has no kind {obj.kind!r}: this "
                "row adds one."
                if obj.kind
                else "—"
            )
        return format_html(
            "<p>Catalog {}: this row replaces it.</p><pre>{}</pre>",
            load_catalog().version,
            json.dumps(entry, indent=2),
        )


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    """Workers register themselves; the admin only reads them."""

    list_display = (
        "name",
        "hostname",
        "queues",
        "backend",
        "devices_count",
        "last_heartbeat_at",
        "stopped_at",
    )
    list_filter = ("backend",)
    search_fields = ("name", "hostname")

    @admin.display(description="Devices")
    def devices_count(self, obj: Worker) -> int:
        return len(obj.devices or [])

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(HubWatch)
class HubWatchAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "kind",
        "author",
        "repo_pattern",
        "pool",
        "enabled",
        "poll_interval_s",
        "last_polled_at",
        "next_poll_at",
        "consecutive_failures",
    )
    list_filter = ("kind", "enabled", "pool")
    search_fields = ("name", "author", "repo_pattern", "endpoint")
    readonly_fields = (
        "last_polled_at",
        "last_success_at",
        "last_error",
        "consecutive_failures",
        "next_poll_at",
    )


class StageRunInline(admin.TabularInline):
    model = StageRun
    extra = 0
    can_delete = False
    fields = ("stage", "attempt", "status", "started_at", "finished_at", "worker_host", "error")
    readonly_fields = fields


@admin.register(AdaptationJob)
class AdaptationJobAdmin(admin.ModelAdmin):
    list_display = ("id", "release", "pool", "trigger", "status", "created_at", "finished_at")
    list_filter = ("status", "pool", "trigger")
    inlines = [StageRunInline]
    readonly_fields = (
        "release",
        "pool",
        "trigger",
        "stages",
        "status",
        "started_at",
        "finished_at",
    )


@admin.register(ModelRelease)
class ModelReleaseAdmin(admin.ModelAdmin):
    list_display = ("repo_id", "revision", "hub_kind", "family", "published_at", "discovered_at")
    list_filter = ("hub_kind", "found_by", "family")
    search_fields = ("repo_id", "revision")
    readonly_fields = ("config", "metadata")


@admin.register(OperatorCheck)
class OperatorCheckAdmin(admin.ModelAdmin):
    list_display = ("name", "status", "feature", "pool", "stage_run")
    list_filter = ("status", "pool")
    search_fields = ("name", "feature")


@admin.register(PrecisionResult)
class PrecisionResultAdmin(admin.ModelAdmin):
    list_display = ("stage_run", "pool", "dtype", "passed", "top1_agreement", "max_abs_error")
    list_filter = ("passed", "dtype", "pool")

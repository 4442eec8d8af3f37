"""Admin for the accelerator pools and kinds people configure (the shipped catalog file's
kinds shown above the rows they override), and a read-only view of the workers.

Only a superuser may let a pool's attached engine reach private or loopback addresses
(`engine_allow_private_network`, as a notification subscription's `allow_private_network`),
and an engine endpoint another user changes loses that leave.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html

from adaptation.admin.read_only import ReadOnlyAdmin
from adaptation.models import AcceleratorKind, AcceleratorPool, Worker
from engine.catalog import CatalogError, load_catalog
from engine.units import GIB, TERA


class AcceleratorPoolForm(forms.ModelForm):
    """The pool's fields; `allows_private_network` (set by the admin per request) says whether
    the user may keep `engine_allow_private_network` for a changed engine endpoint."""

    allows_private_network = False

    class Meta:
        model = AcceleratorPool
        fields = (
            "name",
            "backend",
            "queue",
            "device",
            "enabled",
            "description",
            "accelerator",
            "devices_per_node",
            "nodes",
            "intra_node_bandwidth_gb_per_s",
            "inter_node_bandwidth_gb_per_s",
            "dtypes",
            "operator_manifest",
            "trust_remote_code_orgs",
            "precision_thresholds",
            "real_weights_max_bytes",
            "engine",
            "engine_allow_private_network",
        )
        help_texts = {
            "engine": 'JSON: {"kind": "vllm", "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}, '
            '"memory_fraction": 0.1}; {"kind": "sglang", ...}; or {"kind": "openai", '
            '"base_url": "https://...", "api_key_env": "NAME", "model": "..."} to attach to a '
            "running endpoint; {} for none (the serve stage then does not run). Every key: "
            "docs/stages/serve.md.",
        }

    def clean(self) -> dict:
        """Drop the leave to reach private networks when a user who may not give it changes
        where the engine points (the model's clean then checks the new address)."""
        cleaned = super().clean()
        pool = self.instance
        if (
            not self.allows_private_network
            and pool.engine_allow_private_network
            and _endpoint(cleaned.get("engine")) != _endpoint(self.initial.get("engine"))
        ):
            pool.engine_allow_private_network = False
        return cleaned


def _endpoint(engine: Any) -> tuple[Any, Any]:
    """An engine object's kind and base_url (what decides where the worker connects)."""
    if not isinstance(engine, dict):
        return (None, None)
    return (engine.get("kind"), engine.get("base_url"))


@admin.register(AcceleratorPool)
class AcceleratorPoolAdmin(admin.ModelAdmin):
    form = AcceleratorPoolForm
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
                    "intra_node_bandwidth_gb_per_s",
                    "inter_node_bandwidth_gb_per_s",
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
        (
            "Serving engine (the serve stage)",
            {
                "description": "The engine the serve stage launches on the pool (vLLM, SGLang) "
                "or the OpenAI-compatible endpoint it attaches to: docs/stages/serve.md.",
                "fields": ("engine", "engine_allow_private_network"),
            },
        ),
    )

    def get_readonly_fields(self, request: HttpRequest, obj=None) -> tuple[str, ...]:
        """`engine_allow_private_network` unless the user is a superuser (it lets the worker
        reach the internal network)."""
        fields = tuple(super().get_readonly_fields(request, obj))
        if not request.user.is_superuser:
            fields += ("engine_allow_private_network",)
        return fields

    def get_form(self, request: HttpRequest, obj=None, change: bool = False, **kwargs: Any):
        form = super().get_form(request, obj, change, **kwargs)
        form.allows_private_network = bool(request.user.is_superuser)
        return form


def _shipped_entry(kind: str) -> dict | None:
    """The shipped catalog file's entry for `kind`, or None (not in the file, or unreadable)."""
    try:
        catalog = load_catalog()
    except CatalogError:
        return None
    accelerator = catalog.accelerators.get(kind)
    return accelerator.to_dict() if accelerator is not None else None


def _in_units(value: float | None, unit: float) -> str:
    """A datasheet figure in the admin's units ("4.8" TB/s), "not published" when None."""
    return "not published" if value is None else f"{value / unit:,g}"


def _shipped_catalog_context() -> dict[str, Any]:
    """What the accelerator-kind list shows above its rows: the shipped catalog file's
    version and kinds (name, memory in GiB, memory bandwidth in TB/s, dense BF16 TFLOP/s) and
    which of them an admin row overrides; or why the file cannot be read."""
    try:
        catalog = load_catalog()
    except CatalogError as err:
        return {"shipped_catalog_error": str(err)}
    overridden = set(AcceleratorKind.objects.values_list("kind", flat=True))
    kinds = [
        {
            "kind": acc.kind,
            "name": acc.name,
            "vendor": acc.vendor,
            "memory_gib": _in_units(acc.memory_bytes, GIB),
            "memory_bandwidth_tb_per_s": _in_units(acc.memory_bandwidth_bytes_per_s, TERA),
            "dense_bf16_tflop_per_s": _in_units(acc.dense_bf16_flops, TERA),
            "overridden": acc.kind in overridden,
        }
        for acc in catalog.accelerators.values()
    ]
    return {"shipped_catalog": {"version": catalog.version, "kinds": kinds}}


@admin.register(AcceleratorKind)
class AcceleratorKindAdmin(admin.ModelAdmin):
    list_display = (
        "kind",
        "name",
        "memory_gib",
        "memory_bandwidth_tb_per_s",
        "dense_bf16_tflop_per_s",
        "dense_fp8_tflop_per_s",
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
                    "memory_bandwidth_tb_per_s",
                    "dense_bf16_tflop_per_s",
                    "dense_fp8_tflop_per_s",
                    "low_precision_kind",
                    "dtypes",
                    "intra_node_bandwidth_gb_per_s",
                    "inter_node_bandwidth_gb_per_s",
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

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        """The rows, below the kinds the shipped catalog file already has (a site starts with
        no row, yet plans on every shipped kind)."""
        extra_context = {**(extra_context or {}), **_shipped_catalog_context()}
        return super().changelist_view(request, extra_context=extra_context)

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
class WorkerAdmin(ReadOnlyAdmin):
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

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

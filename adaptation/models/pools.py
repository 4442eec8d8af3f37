"""Accelerator pools, the catalog rows an admin adds, and the workers that serve the pools."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from adaptation import outbound_http
from engine import formatting as fmt
from engine.catalog import (
    Catalog,
    CatalogError,
    load_catalog,
    missing_sources,
    parse_accelerator,
)
from engine.contract import DEFAULT_REAL_WEIGHTS_MAX_BYTES
from engine.stages.precision.thresholds import RETIRED_KEYS, THRESHOLD_KEYS
from engine.stages.serve.options import engine_settings
from engine.units import GIB, TERA, gb_per_s_to_bytes_per_s


def default_pool_dtypes() -> list[str]:
    return ["bfloat16", "float16"]


# Serving dtypes a pool may declare, as torch names (what the precision and performance stages
# build), and a torch device string.
SERVING_DTYPES = ("float32", "bfloat16", "float16", "int8", "float8_e4m3fn")

DEVICE_PATTERN = re.compile(r"[a-z][a-z0-9_]*(:[0-9]+)?")


def _threshold_problem(thresholds: Any) -> str:
    """Why `precision_thresholds` cannot be read by the precision stage ("" when it can):
    dtype keys are serving dtypes, limit names the stage's `THRESHOLD_KEYS`, values
    numbers."""
    if not isinstance(thresholds, dict):
        return 'Per dtype, limits: {"bfloat16": {"min_top1_agreement": 0.95}}.'
    for dtype, limits in thresholds.items():
        if dtype not in SERVING_DTYPES:
            return f"Unknown dtype {dtype!r}: use torch names ({', '.join(SERVING_DTYPES)})."
        if not isinstance(limits, dict):
            return f'{dtype}: an object of limits, e.g. {{"min_top1_agreement": 0.95}}.'
        for name, value in limits.items():
            if name not in THRESHOLD_KEYS and name not in RETIRED_KEYS:
                return f"{dtype}: unknown limit {name!r}; known: {', '.join(THRESHOLD_KEYS)}."
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                return f"{dtype}.{name} must be a number (or null for the default)."
    return ""


class AcceleratorPool(models.Model):
    """A set of accelerators served by the Celery workers listening on `queue`.

    `backend` is the torch device type the pool's worker runs on ("cpu", "cuda", "xpu", a
    PrivateUse1 name), or "manifest" for an accelerator whose worker is not here.
    """

    name = models.SlugField(max_length=64, unique=True)
    backend = models.CharField(max_length=32, default="cpu")
    queue = models.CharField(
        max_length=128,
        unique=True,
        blank=True,
        help_text="Celery queue its workers listen on; blank: pool.<name>.",
    )
    device = models.CharField(
        max_length=32, default="cpu", help_text='Torch device its workers use: "cpu", "cuda:0".'
    )
    dtypes = models.JSONField(
        default=default_pool_dtypes,
        blank=True,
        help_text='Serving dtypes to validate, torch names: ["bfloat16", "float16", "int8"].',
    )
    operator_manifest = models.JSONField(
        null=True,
        blank=True,
        help_text="Supported operators and dtypes, for an accelerator whose worker is not here "
        "(format: engine/stages/operators/manifests/README.md).",
    )
    trust_remote_code_orgs = models.JSONField(
        default=list,
        blank=True,
        help_text="Orgs whose shipped modeling code may run (sandboxed) on this pool.",
    )
    precision_thresholds = models.JSONField(
        default=dict,
        blank=True,
        help_text='Per-dtype overrides: {"bfloat16": {"min_top1_agreement": 0.95}}.',
    )
    real_weights_max_bytes = models.PositiveBigIntegerField(
        default=DEFAULT_REAL_WEIGHTS_MAX_BYTES,
        help_text="A mirror release with a checkpoint up to this size (bytes) is validated on "
        "its real weights at full size; larger ones on a scaled twin.",
    )
    accelerator = models.CharField(
        max_length=64,
        blank=True,
        help_text="Accelerator kind from the catalog (h200, h100, a100-80gb, mi300x, ...); "
        "blank on a cpu pool: the machine its worker runs on.",
    )
    devices_per_node = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Blank: the catalog's figure for the kind (1 for a cpu pool).",
    )
    nodes = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    intra_node_bandwidth_gb_per_s = models.FloatField(
        "Intra-node bandwidth (GB/s per direction)",
        null=True,
        blank=True,
        validators=[MinValueValidator(0.001)],
        help_text="Device-to-device GB/s (decimal) per direction inside a node; blank: the "
        "catalog's.",
    )
    inter_node_bandwidth_gb_per_s = models.FloatField(
        "Inter-node bandwidth (GB/s per device and direction)",
        null=True,
        blank=True,
        validators=[MinValueValidator(0.001)],
        help_text="Network GB/s (decimal) per device and direction across nodes; blank: the "
        "catalog's.",
    )
    engine = models.JSONField(
        default=dict,
        blank=True,
        help_text='The serving engine the serve stage launches or attaches to: {"kind": "vllm", '
        '"env": {...}, "flags": [...], "memory_fraction": 0.1}, or {"kind": "openai", '
        '"base_url": ..., "api_key_env": ..., "model": ...}; {}: none, the stage does not run '
        "(docs/stages/serve.md).",
    )
    engine_allow_private_network = models.BooleanField(
        default=False,
        help_text="Let an openai engine's base_url resolve to a private or loopback address "
        "(an admin's decision: it lets the worker reach the internal network).",
    )
    description = models.TextField(blank=True)
    enabled = models.BooleanField(default=True)
    stack = models.JSONField(
        default=dict,
        blank=True,
        editable=False,
        help_text='The software stack its workers last reported ({"torch": "2.13.0+cpu", '
        '"driver": ..., "engine": {"vllm": ...}}); a change is a StackChange.',
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self.queue:
            self.queue = f"pool.{self.name}"
        super().save(*args, **kwargs)

    def clean(self) -> None:
        """Refuse settings the stages could not read, when they are saved."""
        errors: dict[str, str] = {}
        if not isinstance(self.dtypes, list) or not all(isinstance(d, str) for d in self.dtypes):
            errors["dtypes"] = 'A list of torch dtype names, e.g. ["bfloat16", "float16"].'
        elif unknown := [d for d in self.dtypes if d not in SERVING_DTYPES]:
            errors["dtypes"] = (
                f"Unknown dtype {', '.join(map(repr, unknown))}: use torch names "
                f"({', '.join(SERVING_DTYPES)})."
            )
        if not DEVICE_PATTERN.fullmatch(self.device or ""):
            errors["device"] = 'A torch device: "cpu", "cuda", "cuda:0", "xpu:1".'
        elif self.backend not in ("manifest", self.device.partition(":")[0]):
            errors["device"] = (
                f"A {self.backend} pool's device is {self.backend} or {self.backend}:N, "
                f"not {self.device!r}."
            )
        if not isinstance(self.trust_remote_code_orgs, list):
            errors["trust_remote_code_orgs"] = 'A list of org names, e.g. ["deepseek-ai"].'
        if problem := _threshold_problem(self.precision_thresholds):
            errors["precision_thresholds"] = problem
        manifest = self.operator_manifest
        if manifest is not None and not (
            isinstance(manifest, dict) and isinstance(manifest.get("operators"), dict)
        ):
            errors["operator_manifest"] = 'An object with an "operators" map (see its README).'
        errors.update(self._layout_errors())
        errors.update(self._engine_errors())
        if errors:
            raise ValidationError(errors)

    def _engine_errors(self) -> dict[str, str]:
        """What is wrong with the pool's `engine` (`engine.stages.serve.options.
        engine_settings`), else {} with `engine` normalised as the stage reads it. An openai
        engine's `base_url` must resolve, here and now, to public addresses only, unless
        `engine_allow_private_network` is set (then it is not resolved: a name only the
        worker's network knows is private anyway); the worker checks it again before each
        run (`engine_endpoint_check`)."""
        try:
            engine = engine_settings(self.engine)
        except ValueError as err:
            return {"engine": f"{err} (see docs/stages/serve.md)."}
        if engine.get("kind") == "openai" and not self.engine_allow_private_network:
            try:
                self.engine_endpoint_check(engine)
            except outbound_http.OutboundError as err:
                return {"engine": f"base_url: {err.reason}"}
        self.engine = engine
        return {}

    def engine_endpoint_check(self, engine: Mapping[str, Any] | None = None) -> list[str]:
        """The addresses an `openai` engine's `base_url` resolves to now (`engine`, default
        the pool's, already checked by `engine_settings`), through the outbound-address guard
        (`adaptation.outbound_http.check_url` and `resolve_checked`): private, loopback and
        other internal addresses are refused unless `engine_allow_private_network`. [] for a
        pool without an openai engine.

        Raises `outbound_http.OutboundBlocked` for a refused scheme or address and
        `OutboundError` for a URL that is malformed or a name that does not resolve."""
        engine = self.engine if engine is None else engine
        if not isinstance(engine, Mapping) or engine.get("kind") != "openai":
            return []
        parsed = outbound_http.check_url(str(engine.get("base_url") or ""))
        host = parsed.raw_host.decode("ascii")
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        return outbound_http.resolve_checked(
            host, port, allow_private_network=self.engine_allow_private_network
        )

    def _layout_errors(self) -> dict[str, str]:
        """What is wrong with the pool's accelerator layout, per field.

        A cpu pool plans on the machine its worker runs on: its accelerator is blank (or
        "cpu") and that machine is one device. Any other backend runs on (or, "manifest",
        describes) accelerators the plan must know: it needs a kind the catalog knows (the
        shipped file or an admin row), else every job would fail at the plan stage.
        """
        kind = (self.accelerator or "").strip()
        try:
            known = AcceleratorKind.objects.catalog().kinds()
        except CatalogError as err:
            return {"accelerator": f"The accelerator catalog cannot be read: {err}"}
        known_text = ", ".join(known)
        if self.backend == "cpu":
            if kind not in ("", "cpu"):
                return {
                    "accelerator": f"A cpu pool plans on the machine its worker runs on: leave "
                    f'this blank (or "cpu"). To plan for {kind} without its worker here, use '
                    'backend "manifest" with an operator manifest.'
                }
            if self.devices_per_node not in (None, 1):
                return {
                    "devices_per_node": "A cpu pool's device is its worker's whole machine: "
                    "leave this blank (or 1)."
                }
            return {}
        if not kind:
            return {
                "accelerator": f"A {self.backend or '(blank)'} pool needs its accelerator kind "
                f"for the plan stage; known kinds: {known_text} (or add an accelerator kind)."
            }
        if kind == "cpu" or kind not in known:
            return {
                "accelerator": f"Unknown accelerator kind {kind!r}; known kinds: {known_text} "
                "(or add an accelerator kind)."
            }
        return {}


class AcceleratorKindQuerySet(models.QuerySet):
    def catalog(self) -> Catalog:
        """The shipped catalog (`engine.catalog.load_catalog`) with these rows applied: a row
        replaces the file's entry of the same kind, or adds one. Raises `CatalogError` when
        an entry is malformed (a row is checked when saved, so that means the file)."""
        rows = list(self)
        return load_catalog().with_entries(
            [row.catalog_entry() for row in rows], label=fmt.counted(len(rows), "admin row")
        )


class AcceleratorKind(models.Model):
    """An accelerator catalog row edited in the admin: adds a kind to the shipped catalog
    (`engine/catalog/accelerators.json`) or, with the same `kind`, replaces its entry.

    Units as entered: GiB, TB/s, TFLOP/s and GB/s (decimal, per direction); every figure
    given needs its source in `sources` ({"memory_bytes": "datasheet URL", ...}, keys as in
    the catalog file).
    """

    kind = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=128)
    vendor = models.CharField(max_length=64, blank=True)
    memory_gib = models.FloatField("Memory (GiB)", validators=[MinValueValidator(0.001)])
    memory_bandwidth_tb_per_s = models.FloatField("Memory bandwidth (TB/s)", null=True, blank=True)
    dense_bf16_tflop_per_s = models.FloatField("Dense BF16 (TFLOP/s)", null=True, blank=True)
    dense_fp8_tflop_per_s = models.FloatField(
        "Dense FP8 (TFLOP/s)",
        null=True,
        blank=True,
        help_text="Or INT8 TOP/s when the low-precision kind is int8.",
    )
    low_precision_kind = models.CharField(
        max_length=8, blank=True, choices=[("fp8", "FP8"), ("int8", "INT8")]
    )
    dtypes = models.JSONField(default=default_pool_dtypes, blank=True)
    intra_node_bandwidth_gb_per_s = models.FloatField(
        "Intra-node bandwidth (GB/s per direction)", null=True, blank=True
    )
    inter_node_bandwidth_gb_per_s = models.FloatField(
        "Inter-node bandwidth (GB/s per device and direction)", null=True, blank=True
    )
    devices_per_node = models.PositiveIntegerField(default=8, validators=[MinValueValidator(1)])
    device_resource = models.CharField(
        max_length=64, default="nvidia.com/gpu", help_text="Kubernetes extended resource name."
    )
    sources = models.JSONField(
        default=dict,
        blank=True,
        help_text="Per figure given, its source (datasheet title and address), keyed as in the "
        "catalog file: memory_bytes, memory_bandwidth_bytes_per_s, dense_bf16_flops, "
        "dense_fp8_flops, intra_node_bandwidth_bytes_per_s, inter_node_bandwidth_bytes_per_s.",
    )
    notes = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = AcceleratorKindQuerySet.as_manager()

    class Meta:
        ordering = ["kind"]

    def __str__(self) -> str:
        return self.kind

    def catalog_entry(self) -> dict[str, Any]:
        """The catalog-file entry (bytes, bytes/s, FLOP/s) for this row, entered in GiB, TB/s,
        TFLOP/s and GB/s."""

        def tera(value: float | None) -> float | None:
            return None if value is None else float(value) * TERA

        return {
            "kind": self.kind,
            "name": self.name,
            "vendor": self.vendor,
            "memory_bytes": round(self.memory_gib * GIB),
            "memory_datasheet": f"{self.memory_gib:g} GiB (admin row)",
            "memory_bandwidth_bytes_per_s": tera(self.memory_bandwidth_tb_per_s),
            "dense_bf16_flops": tera(self.dense_bf16_tflop_per_s),
            "dense_fp8_flops": tera(self.dense_fp8_tflop_per_s),
            "low_precision_kind": self.low_precision_kind or None,
            "dtypes": list(self.dtypes or []),
            "intra_node_bandwidth_bytes_per_s": gb_per_s_to_bytes_per_s(
                self.intra_node_bandwidth_gb_per_s
            ),
            "inter_node_bandwidth_bytes_per_s": gb_per_s_to_bytes_per_s(
                self.inter_node_bandwidth_gb_per_s
            ),
            "devices_per_node": self.devices_per_node,
            "device_resource": self.device_resource,
            "sources": dict(self.sources or {}),
            "notes": [line for line in (self.notes or "").splitlines() if line.strip()],
        }

    # The catalog-file key each field feeds (for errors the catalog's checks report).
    CATALOG_FIELDS = {
        "kind": "kind",
        "memory_bytes": "memory_gib",
        "memory_bandwidth_bytes_per_s": "memory_bandwidth_tb_per_s",
        "dense_bf16_flops": "dense_bf16_tflop_per_s",
        "dense_fp8_flops": "dense_fp8_tflop_per_s",
        "intra_node_bandwidth_bytes_per_s": "intra_node_bandwidth_gb_per_s",
        "inter_node_bandwidth_bytes_per_s": "inter_node_bandwidth_gb_per_s",
        "devices_per_node": "devices_per_node",
        "low_precision_kind": "low_precision_kind",
        "dtypes": "dtypes",
        "sources": "sources",
    }

    def clean(self) -> None:
        """Check the row as the catalog checks a file entry (`engine.catalog.parse_accelerator`):
        every figure given is positive and has its source in `sources` (keyed as in the file:
        "memory_bytes", "memory_bandwidth_bytes_per_s", ...), `dtypes` is a list of dtype
        names. Raises `ValidationError` on the fields at fault: every figure without a source
        at once, not one per save."""
        if not isinstance(self.dtypes, list) or not all(
            isinstance(d, str) and d for d in self.dtypes
        ):
            raise ValidationError({"dtypes": 'A list of dtype names, e.g. ["bfloat16", "fp8"].'})
        if not isinstance(self.sources, dict) or not all(
            isinstance(v, str) for v in self.sources.values()
        ):
            raise ValidationError(
                {"sources": 'Per figure, its source: {"memory_bytes": "datasheet title, URL"}.'}
            )
        if self.memory_gib is None or self.devices_per_node is None:
            return  # the field's own error says so
        entry = self.catalog_entry()
        if missing := missing_sources(entry):
            raise ValidationError(
                {
                    self.CATALOG_FIELDS[key]: f'No source for this figure: add "{key}": '
                    '"<datasheet title and address>" to sources.'
                    for key in missing
                }
            )
        try:
            parse_accelerator(entry)
        except CatalogError as err:
            field_name = self.CATALOG_FIELDS.get(err.field or "")
            message = str(err).removeprefix(f"{self.kind!r}: ")
            if "must be a positive number" in message:
                message = "Must be above 0 (or blank where the vendor does not publish it)."
            raise ValidationError({field_name: message} if field_name else message) from err


class Worker(models.Model):
    """A Celery worker process as it announced itself: host, queues, devices, heartbeat.

    `name` is the Celery node name ("cpu@host"); `devices` lists what torch sees
    ([{"index": 0, "name": "NVIDIA H200", "memory_bytes": ...}]); `cpu_cores` and
    `memory_bytes` are the host's, measured at start.
    """

    name = models.CharField(max_length=255, unique=True)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField(null=True, blank=True)
    queues = models.JSONField(default=list)
    backend = models.CharField(max_length=32, blank=True, help_text='"cuda", "cpu", ...')
    devices = models.JSONField(default=list, blank=True)
    cpu_cores = models.PositiveIntegerField(null=True, blank=True)
    memory_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    software = models.JSONField(
        default=dict,
        blank=True,
        help_text="python, celery and torch versions, and its stack (driver, serving engines).",
    )
    started_at = models.DateTimeField(default=timezone.now)
    last_heartbeat_at = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

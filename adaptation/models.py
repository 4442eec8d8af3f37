"""day0's domain: hub watches, model releases, accelerator pools, adaptation jobs and their
stage runs. Writes go through `adaptation.services`, reads through `adaptation.selectors`."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from engine.contract import DEFAULT_REAL_WEIGHTS_MAX_BYTES
from engine.registry import job_options_check


class HubKind(models.TextChoices):
    HUGGINGFACE = "huggingface", "Hugging Face Hub"
    MIRROR = "mirror", "Mirror folder"


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
    from engine.stages.precision.thresholds import RETIRED_KEYS, THRESHOLD_KEYS

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
    description = models.TextField(blank=True)
    enabled = models.BooleanField(default=True)

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
        if errors:
            raise ValidationError(errors)

    def _layout_errors(self) -> dict[str, str]:
        """What is wrong with the pool's accelerator layout, per field.

        A cpu pool plans on the machine its worker runs on: its accelerator is blank (or
        "cpu") and that machine is one device. Any other backend runs on (or, "manifest",
        describes) accelerators the plan must know: it needs a kind the catalog knows (the
        shipped file or an admin row), else every job would fail at the plan stage.
        """
        from adaptation.catalog import catalog_current
        from engine.catalog import CatalogError

        kind = (self.accelerator or "").strip()
        try:
            known = catalog_current().kinds()
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

    class Meta:
        ordering = ["kind"]

    def __str__(self) -> str:
        return self.kind

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
        from adaptation.catalog import accelerator_kind_entry
        from engine.catalog import CatalogError, missing_sources, parse_accelerator

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
        entry = accelerator_kind_entry(self)
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


class HubWatch(models.Model):
    """A hub location polled for new releases: an org/author or a repo pattern."""

    name = models.CharField(max_length=128, unique=True)
    kind = models.CharField(max_length=32, choices=HubKind.choices)
    endpoint = models.CharField(
        max_length=512,
        blank=True,
        help_text="Hub URL (blank: HF_ENDPOINT or huggingface.co) or a mirror root folder.",
    )
    author = models.CharField(max_length=128, blank=True, help_text="Org or user to list.")
    repo_pattern = models.CharField(
        max_length=256, blank=True, help_text="fnmatch pattern on the repo id; blank: all."
    )
    pool = models.ForeignKey(
        AcceleratorPool,
        on_delete=models.PROTECT,
        related_name="watches",
        help_text="Pool whose workers adapt the releases this watch finds.",
    )
    enabled = models.BooleanField(default=True)
    poll_interval_s = models.PositiveIntegerField(
        default=300,
        validators=[MinValueValidator(10)],
        help_text="Seconds between polls; errors back off exponentially from it.",
    )
    job_options = models.JSONField(
        default=dict,
        blank=True,
        help_text="Stage options for the jobs of the releases it finds (by poll or webhook), as "
        '`adapt --options` takes them: {"plan": {"context_tokens": 131072}, '
        '"stability": {"duration_s": 3600}}.',
    )
    last_polled_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    next_poll_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "hub watches"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """A mirror watch needs a readable folder and its job options must be ones the stages
        take; a typo is caught when saved, not at the next poll."""
        if self.kind == HubKind.MIRROR and not Path(self.endpoint).is_dir():
            raise ValidationError({"endpoint": f"{self.endpoint or '(blank)'} is not a folder."})
        try:
            self.job_options = job_options_check(options=self.job_options)
        except ValueError as exc:
            raise ValidationError({"job_options": str(exc)}) from exc


class Trigger(models.TextChoices):
    """How a release was found, and so what started its first job."""

    POLL = "poll", "Hub poll"
    WEBHOOK = "webhook", "Webhook"
    MANUAL = "manual", "Manual"
    API = "api", "REST API"


class ModelRelease(models.Model):
    """One repo at one revision on one hub. Never created twice for the same triple."""

    watch = models.ForeignKey(
        HubWatch, null=True, blank=True, on_delete=models.SET_NULL, related_name="releases"
    )
    hub_kind = models.CharField(max_length=32, choices=HubKind.choices)
    hub_endpoint = models.CharField(max_length=512)
    repo_id = models.CharField(max_length=256)
    revision = models.CharField(max_length=128)
    published_at = models.DateTimeField(null=True, blank=True, help_text="As the hub says.")
    discovered_at = models.DateTimeField(default=timezone.now)
    found_by = models.CharField(max_length=16, choices=Trigger.choices)
    config = models.JSONField(null=True, blank=True, help_text="config.json as fetched.")
    metadata = models.JSONField(default=dict, blank=True)
    architecture = models.CharField(max_length=128, blank=True)
    family = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-discovered_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["hub_kind", "hub_endpoint", "repo_id", "revision"],
                name="release_unique_per_hub_repo_revision",
            )
        ]

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.revision[:12]}"

    @property
    def time_to_detect(self) -> timedelta | None:
        """Discovered minus published (None when the hub gave no publication time)."""
        if self.published_at is None:
            return None
        return self.discovered_at - self.published_at


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
    software = models.JSONField(default=dict, blank=True, help_text="torch, python versions.")
    started_at = models.DateTimeField(default=timezone.now)
    last_heartbeat_at = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class JobStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class Readiness(models.TextChoices):
    """How far a release has come on a pool, lowest first (thresholds: DAY0_READINESS)."""

    NONE = "none", "Not started"
    EXPERIMENTAL = "experimental", "Experimental"
    FUNCTIONAL = "functional", "Functional"
    COMPLETE = "complete", "Complete"


class AdaptationJob(models.Model):
    """Adapting one release to one pool: an ordered list of stages run on the pool's queue.

    `stages` is the stage list fixed when the job was created; `status` is derived from the
    latest attempt of each stage by `services.job_refresh_status`.
    """

    release = models.ForeignKey(ModelRelease, on_delete=models.CASCADE, related_name="jobs")
    pool = models.ForeignKey(AcceleratorPool, on_delete=models.PROTECT, related_name="jobs")
    trigger = models.CharField(max_length=16, choices=Trigger.choices)
    stages = models.JSONField(default=list)
    options = models.JSONField(
        default=dict,
        blank=True,
        help_text='Per-job stage options: {"plan": {"context_tokens": 8192, "concurrency": 16, '
        '"dtype": "fp8"}}.',
    )
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.PENDING)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Kept by `services.job_refresh_status` from the stages (adaptation/readiness.py), so
    # reports over thousands of releases read one column instead of every stage run.
    readiness = models.CharField(max_length=16, choices=Readiness.choices, default=Readiness.NONE)
    blocking_stage = models.CharField(
        max_length=64, blank=True, help_text="The stage that keeps the job from the next level."
    )
    ready_at = models.DateTimeField(
        null=True, blank=True, help_text="When every required stage had passed (Day 0)."
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status"]), models.Index(fields=["ready_at"])]
        # What the roles grant (adaptation/roles.py): beyond add/change/view, these name the
        # actions an engineer takes on a job.
        permissions = [
            ("trigger_job", "Can trigger adaptation jobs"),
            ("cancel_job", "Can cancel adaptation jobs"),
            ("rerun_stage", "Can re-run a stage of a job"),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.release} on {self.pool})"


class StageStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    SKIPPED = "skipped", "Skipped"
    CANCELLED = "cancelled", "Cancelled"


ACTIVE_STAGE_STATUSES = (StageStatus.QUEUED, StageStatus.RUNNING)


class StageRun(models.Model):
    """One attempt of one stage of a job: the truth about that piece of work."""

    job = models.ForeignKey(AdaptationJob, on_delete=models.CASCADE, related_name="stage_runs")
    stage = models.CharField(max_length=64)
    position = models.PositiveSmallIntegerField(help_text="Index of the stage in job.stages.")
    attempt = models.PositiveIntegerField(default=1)
    status = models.CharField(
        max_length=16, choices=StageStatus.choices, default=StageStatus.PENDING
    )
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    worker_host = models.CharField(max_length=255, blank=True)
    celery_task_id = models.CharField(max_length=64, blank=True)
    retries = models.PositiveIntegerField(default=0)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    log = models.TextField(blank=True)

    class Meta:
        ordering = ["job_id", "position", "attempt"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "stage", "attempt"], name="stage_run_unique_attempt"
            )
        ]
        indexes = [models.Index(fields=["status", "heartbeat_at"])]

    def __str__(self) -> str:
        return f"{self.stage}#{self.attempt} of job {self.job_id}"

    @property
    def duration(self) -> timedelta | None:
        """Started to finished, or to now while running; None before it starts."""
        if self.started_at is None:
            return None
        end = self.finished_at or timezone.now()
        return end - self.started_at


class OperatorCheck(models.Model):
    """One ATen operator the release's scaled twin ran, checked against its pool's backend."""

    class Status(models.TextChoices):
        COVERED = "covered", "Covered"
        MISSING = "missing", "Missing"
        FALLBACK = "fallback", "Falls back to CPU"

    stage_run = models.ForeignKey(StageRun, on_delete=models.CASCADE, related_name="operators")
    pool = models.ForeignKey(AcceleratorPool, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=200, help_text='"aten::mm.default"')
    dtypes = models.JSONField(default=list)
    feature = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices)
    missing_dtypes = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["stage_run_id", "name"]
        indexes = [models.Index(fields=["pool", "status"])]

    def __str__(self) -> str:
        return f"{self.name} {self.status}"


class PrecisionResult(models.Model):
    """The twin's outputs in one dtype on the pool's device, against the float32 reference."""

    stage_run = models.ForeignKey(StageRun, on_delete=models.CASCADE, related_name="precision")
    pool = models.ForeignKey(AcceleratorPool, on_delete=models.CASCADE, related_name="+")
    dtype = models.CharField(max_length=32)
    # Null when the target's outputs held NaN/Inf: no error figure means anything then.
    max_abs_error = models.FloatField(null=True, help_text="Of logits.")
    mean_abs_error = models.FloatField(null=True, help_text="Of logits.")
    cosine_similarity = models.FloatField(null=True)
    top1_agreement = models.FloatField(null=True, help_text="Fraction of positions, 0 to 1.")
    kl_divergence = models.FloatField(null=True, help_text="Nats, reference to target.")
    passed = models.BooleanField()
    first_divergent_layer = models.IntegerField(null=True, blank=True)
    first_divergent_module = models.CharField(max_length=64, blank=True)
    first_divergent_name = models.CharField(max_length=200, blank=True)
    max_local_relative_error = models.FloatField(
        null=True, help_text="The dtype's limit on one module's own relative error."
    )
    reason = models.TextField(blank=True)

    class Meta:
        ordering = ["stage_run_id", "dtype"]
        constraints = [
            models.UniqueConstraint(fields=["stage_run", "dtype"], name="precision_once_per_dtype")
        ]

    def __str__(self) -> str:
        return f"{self.dtype} {'passed' if self.passed else 'failed'}"


class LayerDrift(models.Model):
    """Hidden-state error of one decoder layer's sub-module, target dtype against float32."""

    precision = models.ForeignKey(PrecisionResult, on_delete=models.CASCADE, related_name="layers")
    layer = models.IntegerField()
    module = models.CharField(max_length=64, help_text='"attention", "mlp", "moe", "norm"…')
    name = models.CharField(max_length=200, blank=True, help_text="The module's path in the twin.")
    max_abs_error = models.FloatField(null=True)
    relative_error = models.FloatField(null=True, help_text="Accumulated from earlier layers.")
    local_relative_error = models.FloatField(
        null=True, help_text="This module alone, fed the reference's input."
    )

    class Meta:
        ordering = ["precision_id", "layer", "id"]

    def __str__(self) -> str:
        return f"layer {self.layer} {self.module}"


class PerformancePoint(models.Model):
    """One figure of a performance curve: measured on the release's scaled twin on the pool's
    device, or predicted for the full-size model by the planner's roofline. The two are never
    one curve: `kind` and `model` ("twin" | "full-size") say which.

    `metric` is a name from the performance stage ("ttft_s", "tpot_s", "tpot_p95_s",
    "prefill_tokens_per_s", "decode_tokens_per_s", "peak_process_rss_bytes",
    "peak_device_allocated_bytes"); `unit` its unit ("s", "tokens/s", "bytes").

    Calibration rows (`engine/stages/plan/calibration.py`): the roofline's prediction of the
    twin's own points on the device that measured them (kind "predicted", model "twin", the
    same metrics), the twin's efficiency per point (kind "measured", model "twin", metrics
    "decode_efficiency" and "prefill_efficiency", unit "ratio": measured / predicted), and a
    full-size prediction corrected by the pool's running calibration (kind "predicted",
    model "full-size", metrics "calibrated_tpot_s", "calibrated_decode_tokens_per_s",
    "calibrated_ttft_s", "calibrated_prefill_tokens_per_s").
    """

    class Kind(models.TextChoices):
        MEASURED = "measured", "Measured"
        PREDICTED = "predicted", "Predicted"

    stage_run = models.ForeignKey(
        StageRun, on_delete=models.CASCADE, related_name="performance_points"
    )
    job = models.ForeignKey(
        AdaptationJob, on_delete=models.CASCADE, related_name="performance_points"
    )
    pool = models.ForeignKey(AcceleratorPool, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    model = models.CharField(max_length=16, help_text='"twin" or "full-size".')
    dtype = models.CharField(max_length=32)
    batch_size = models.PositiveIntegerField(null=True, blank=True)
    prompt_len = models.PositiveIntegerField(null=True, blank=True)
    metric = models.CharField(max_length=64)
    value = models.FloatField()
    unit = models.CharField(max_length=16)

    class Meta:
        ordering = ["stage_run_id", "kind", "dtype", "prompt_len", "batch_size", "metric"]
        indexes = [
            models.Index(fields=["job", "metric"]),
            models.Index(fields=["pool", "metric", "kind"]),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.metric}={self.value:g} {self.unit}"


# --- inbound webhooks --------------------------------------------------------------------------


class WebhookKind(models.TextChoices):
    HUGGINGFACE = "huggingface", "Hugging Face Hub"
    GENERIC = "generic", "Standard Webhooks (generic)"


class WebhookEndpoint(models.Model):
    """A URL that turns signed deliveries into adaptation jobs: `/webhooks/<kind>/<id>`.

    The id is a random UUID, so the URL itself is not guessable. The secret is shown once at
    creation and never stored in the clear: a Hub endpoint keeps an HMAC-SHA256 digest of it
    (the Hub sends the secret itself in `X-Webhook-Secret`), a generic endpoint keeps it
    encrypted (Standard Webhooks signatures need the key; `adaptation/secrets.py`).

    Hub deliveries for one repo are coalesced until it has been quiet for `quiet_period_s`
    seconds and the upload is complete; `pool` overrides the matching watch's pool (Hub) or
    `DAY0_DEFAULT_POOL` (generic) when a delivery names none.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=128, unique=True)
    kind = models.CharField(max_length=32, choices=WebhookKind.choices)
    secret_digest = models.CharField(max_length=128, blank=True, editable=False)
    secret_ciphertext = models.TextField(blank=True, editable=False)
    pool = models.ForeignKey(
        AcceleratorPool,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="webhook_endpoints",
        help_text="Pool for the jobs it starts; blank: the matching watch's pool (Hub) or the "
        "default pool (generic), unless a delivery names one.",
    )
    quiet_period_s = models.PositiveIntegerField(
        default=60,
        help_text="Hub deliveries for one repo are coalesced until it has been quiet this many "
        "seconds and the upload is complete; then one job starts at the last revision.",
    )
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    last_delivery_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_kind_display()})"


class DeliveryVerdict(models.TextChoices):
    """What day0 did with an inbound delivery."""

    ACCEPTED = "accepted", "Accepted: job started"
    COALESCING = "coalescing", "Accepted: waiting for the upload to settle"
    DUPLICATE = "duplicate", "Duplicate: no new job"
    IGNORED = "ignored", "Ignored"
    REJECTED = "rejected", "Rejected"


class WebhookDelivery(models.Model):
    """One inbound request to an endpoint, whatever became of it.

    `headers` are stored without secrets or signatures; `body` is the raw body as text (up to
    the size limit; larger bodies are refused with 413 and stored empty; a delivery refused
    before its sender proved itself keeps its first KiB only). `idempotency_key`
    is set only on the delivery that first claimed its key (a generic `webhook-id`): the
    unique constraint makes a second job for the same key impossible, even under races.
    """

    # PROTECT: deleting an endpoint must not delete its log; disable it instead.
    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.PROTECT, related_name="deliveries"
    )
    received_at = models.DateTimeField(default=timezone.now, db_index=True)
    delivery_id = models.CharField(
        max_length=255, blank=True, help_text="webhook-id (generic) or the Hub's request id."
    )
    # NULL, not "", for deliveries that claim no key: NULLs never collide in the constraint.
    idempotency_key = models.CharField(  # noqa: DJ001
        max_length=255, null=True, blank=True, editable=False
    )
    remote_addr = models.GenericIPAddressField(null=True, blank=True)
    headers = models.JSONField(default=dict, blank=True)
    body = models.TextField(blank=True)
    event = models.CharField(max_length=64, blank=True, help_text='e.g. "repo.content/update".')
    repo_id = models.CharField(max_length=256, blank=True)
    revision = models.CharField(max_length=128, blank=True)
    status_code = models.PositiveSmallIntegerField()
    verdict = models.CharField(max_length=16, choices=DeliveryVerdict.choices)
    reason = models.TextField(blank=True)
    release = models.ForeignKey(
        ModelRelease, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    job = models.ForeignKey(
        AdaptationJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-received_at", "-id"]
        verbose_name_plural = "webhook deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "idempotency_key"], name="webhook_delivery_idempotency_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.endpoint.name} {self.received_at:%Y-%m-%d %H:%M:%S} {self.verdict}"


class PendingUpload(models.Model):
    """Hub deliveries for one repo, coalesced while its upload goes on: one job starts, pinned
    to `revision` (the last head sha seen), once the repo has been quiet for the endpoint's
    `quiet_period_s` and the hub shows the upload complete (config present, every shard the
    index names present)."""

    class Status(models.TextChoices):
        WAITING = "waiting", "Waiting for the upload to settle"
        STARTED = "started", "Job started"
        DUPLICATE = "duplicate", "Revision already adapted"
        ABANDONED = "abandoned", "Abandoned"

    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.PROTECT, related_name="pending_uploads"
    )
    watch = models.ForeignKey(
        HubWatch, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    pool = models.ForeignKey(AcceleratorPool, on_delete=models.PROTECT, related_name="+")
    hub_endpoint = models.CharField(max_length=512)
    repo_id = models.CharField(max_length=256)
    revision = models.CharField(max_length=128)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.WAITING)
    deliveries = models.PositiveIntegerField(default=1)
    first_event_at = models.DateTimeField(default=timezone.now)
    last_event_at = models.DateTimeField(default=timezone.now)
    checks = models.PositiveIntegerField(default=0, help_text="Completeness checks made.")
    last_check_at = models.DateTimeField(null=True, blank=True)
    last_check_error = models.TextField(blank=True)
    release = models.ForeignKey(
        ModelRelease, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    job = models.ForeignKey(
        AdaptationJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-last_event_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "repo_id"],
                condition=models.Q(status="waiting"),
                name="pending_upload_one_waiting_per_repo",
            )
        ]

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.revision[:12]} ({self.status})"


# --- outbound notifications ---------------------------------------------------------------------


class Team(models.Model):
    """A group of people who subscribe to job events together."""

    name = models.CharField(max_length=128, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="teams")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class NotificationEvent(models.TextChoices):
    STAGE_FAILED = "stage.failed", "Stage failed"
    JOB_SUCCEEDED = "job.succeeded", "Job succeeded"
    JOB_FAILED = "job.failed", "Job failed"
    # The managers' weekly summary (adaptation/reports.py), sent to subscriptions that opt in.
    REPORT_WEEKLY = "report.weekly", "Weekly summary"


class NotificationFormat(models.TextChoices):
    GENERIC = "generic", "JSON signed with Standard Webhooks headers"
    SLACK = "slack", "Slack-compatible incoming webhook"


def default_notification_events() -> list[str]:
    """A new subscription's events: every job event (the weekly summary is opted into)."""
    return [
        choice.value for choice in NotificationEvent if choice != NotificationEvent.REPORT_WEEKLY
    ]


class NotificationSubscription(models.Model):
    """A team's subscription: job events of the chosen pools (all when none) sent to `url`.

    A generic subscription signs each message with its `whsec_…` secret (stored encrypted,
    shown once). Addresses that resolve to private, loopback, link-local or reserved networks
    are refused unless `allow_private_network` (an admin's decision) is set.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="subscriptions")
    name = models.CharField(max_length=128)
    url = models.URLField(max_length=1024)
    format = models.CharField(
        max_length=16, choices=NotificationFormat.choices, default=NotificationFormat.GENERIC
    )
    events = models.JSONField(
        default=default_notification_events,
        help_text='Event names: "stage.failed", "job.succeeded", "job.failed".',
    )
    pools = models.ManyToManyField(
        AcceleratorPool, blank=True, related_name="+", help_text="Blank: every pool."
    )
    secret_ciphertext = models.TextField(blank=True, editable=False)
    allow_private_network = models.BooleanField(
        default=False,
        help_text="Deliver even when the URL resolves to a private or loopback address "
        "(an admin's decision: it lets requests reach the internal network).",
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["team__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="subscription_unique_per_team")
        ]

    def __str__(self) -> str:
        return f"{self.team.name}: {self.name}"


class NotificationDelivery(models.Model):
    """One event sent (or being sent) to one subscription, with its attempts.

    `message_id` is the Standard Webhooks `webhook-id`, the same on every retry so the
    receiver can drop repeats; `dedupe_key` ("job.failed:job=12") makes the same event for
    the same subject one delivery per subscription.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed (gave up)"
        BLOCKED = "blocked", "Blocked (private address)"

    subscription = models.ForeignKey(
        NotificationSubscription, on_delete=models.CASCADE, related_name="deliveries"
    )
    event = models.CharField(max_length=32, choices=NotificationEvent.choices)
    dedupe_key = models.CharField(max_length=128)
    message_id = models.CharField(max_length=64, unique=True)
    job = models.ForeignKey(
        AdaptationJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    stage_run = models.ForeignKey(
        StageRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "notification deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["subscription", "dedupe_key"], name="notification_once_per_subject"
            )
        ]

    def __str__(self) -> str:
        return f"{self.event} to {self.subscription} ({self.status})"


# --- known limitations, release notes, readiness ---------------------------------------------


class Severity(models.TextChoices):
    """How much a limitation keeps a release from serving, most severe first."""

    BLOCKER = "blocker", "Blocker"
    MAJOR = "major", "Major"
    MINOR = "minor", "Minor"
    INFO = "info", "Info"


class LimitationStatus(models.TextChoices):
    OPEN = "open", "Open"
    MITIGATED = "mitigated", "Mitigated"
    RESOLVED = "resolved", "Resolved"


class KnownLimitation(models.Model):
    """Something users of a release must know before deploying it: raised by a stage from its
    findings (`key` set, e.g. "operators:missing:aten::_grouped_mm") or written by a person
    (`key` blank, `author` set). `pool` null means every pool. `body` is Markdown, rendered
    safely (no raw HTML). A stage re-run that no longer finds the problem marks its note
    resolved (`resolved_at`)."""

    release = models.ForeignKey(ModelRelease, on_delete=models.CASCADE, related_name="limitations")
    pool = models.ForeignKey(
        AcceleratorPool,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="limitations",
        help_text="Blank: every pool.",
    )
    title = models.CharField(max_length=200)
    body = models.TextField(blank=True, help_text="Markdown.")
    severity = models.CharField(max_length=16, choices=Severity.choices, default=Severity.MAJOR)
    status = models.CharField(
        max_length=16, choices=LimitationStatus.choices, default=LimitationStatus.OPEN
    )
    key = models.CharField(
        max_length=200,
        blank=True,
        help_text="For notes a stage raised: what it found, so a re-run updates or resolves "
        "the same note.",
    )
    stage = models.CharField(max_length=64, blank=True, help_text="The stage that raised it.")
    stage_run = models.ForeignKey(
        StageRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["release_id", "status", "severity", "-updated_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["release", "pool", "key"],
                condition=~models.Q(key=""),
                name="limitation_one_per_stage_finding",
            ),
            # NULLs never collide in the one above: notes for every pool need their own.
            models.UniqueConstraint(
                fields=["release", "key"],
                condition=~models.Q(key="") & models.Q(pool__isnull=True),
                name="limitation_one_per_finding_all_pools",
            ),
        ]
        indexes = [models.Index(fields=["release", "status"])]

    def __str__(self) -> str:
        return f"{self.get_severity_display()}: {self.title}"


class ReleaseNotes(models.Model):
    """One version of a release's notes on one pool, written by the `release_notes` stage:
    configuration notes, performance recommendations, precision summary, known limitations
    and what was not validated. `markdown` is the generated document; `sections` the same
    content as data for the pages. Versions count up per (release, pool); people's additions
    live in `ReleaseNotesAdditions` and survive regeneration."""

    release = models.ForeignKey(ModelRelease, on_delete=models.CASCADE, related_name="notes")
    pool = models.ForeignKey(AcceleratorPool, on_delete=models.CASCADE, related_name="+")
    job = models.ForeignKey(AdaptationJob, on_delete=models.CASCADE, related_name="notes")
    stage_run = models.ForeignKey(
        StageRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    version = models.PositiveIntegerField()
    markdown = models.TextField()
    sections = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["release_id", "pool_id", "-version"]
        verbose_name_plural = "release notes"
        constraints = [
            models.UniqueConstraint(
                fields=["release", "pool", "version"], name="release_notes_version_unique"
            )
        ]

    def __str__(self) -> str:
        return f"notes v{self.version} of {self.release} on {self.pool}"


class ReleaseNotesAdditions(models.Model):
    """What people added to a release's notes on a pool (Markdown): kept across every
    regeneration and printed after the generated part."""

    release = models.ForeignKey(ModelRelease, on_delete=models.CASCADE, related_name="+")
    pool = models.ForeignKey(AcceleratorPool, on_delete=models.CASCADE, related_name="+")
    body = models.TextField(blank=True, help_text="Markdown.")
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "release notes additions"
        constraints = [
            models.UniqueConstraint(fields=["release", "pool"], name="notes_additions_unique")
        ]

    def __str__(self) -> str:
        return f"additions to {self.release} on {self.pool}"

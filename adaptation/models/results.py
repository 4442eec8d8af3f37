"""Rows a stage's result is stored as, for pages and queries: operator checks, precision
per dtype and layer, performance points."""

from __future__ import annotations

from django.db import models

from adaptation.models.jobs import AdaptationJob, StageRun
from adaptation.models.pools import AcceleratorPool


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
    device, or predicted for the full-size model by the planner's step-time model. The two are never
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

    Serving-engine rows (the `serve` stage's load sweep, docs/stages/serve.md): `engine`
    names the engine ("vllm"; blank for every in-process row above) and `engine_version` its
    version; one row per sweep level and metric, kind "measured", model "twin" (or "release"
    for the real weights), `concurrency` the level's concurrent requests, `prompt_len` the
    sweep's input tokens, `output_len` its output tokens, `tp_size` the TP the engine ran at,
    no `batch_size` (the engine batches); metrics "ttft_s_p50", "ttft_s_p95", "tpot_s_p50",
    "tpot_s_p95", "e2e_s_p99" (s), "output_tokens_per_s" (tokens/s), "requests_per_s"
    (requests/s) and "errors" (requests). The serve stage's full-size run adds the same rows
    measured on the engine serving the full-size model with random weights: kind "measured",
    model "full-size", `load_format` "dummy" (blank on every other row), one set per workload
    (`prompt_len`, `output_len`) and TP degree (`tp_size`): measured · engine · full size ·
    dummy weights, speed and memory only (random weights say nothing of precision). Readers
    of the in-process curves keep to the performance stage's runs.
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
    model = models.CharField(
        max_length=16,
        help_text='"twin", "full-size" (predicted, or measured on an engine with dummy weights) '
        'or "release" (its real weights, measured).',
    )
    dtype = models.CharField(max_length=32)
    batch_size = models.PositiveIntegerField(null=True, blank=True)
    prompt_len = models.PositiveIntegerField(null=True, blank=True)
    concurrency = models.PositiveIntegerField(
        null=True, blank=True, help_text="Concurrent requests of a serving engine's sweep level."
    )
    engine = models.CharField(
        max_length=32,
        blank=True,
        help_text='The serving engine that measured it ("vllm"); blank: in process.',
    )
    engine_version = models.CharField(max_length=64, blank=True)
    output_len = models.PositiveIntegerField(
        null=True, blank=True, help_text="Output tokens of each request of a serving sweep."
    )
    tp_size = models.PositiveIntegerField(
        null=True, blank=True, help_text="Tensor-parallel size the serving engine ran at."
    )
    load_format = models.CharField(
        max_length=16,
        blank=True,
        help_text='How the engine got its weights: "dummy" (random, from the config alone: '
        "speed and memory at full size, nothing of precision); blank: the checkpoint's.",
    )
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

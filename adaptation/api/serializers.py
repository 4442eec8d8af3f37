"""What the API reads and answers. Output serializers shape rows (never write); Input
serializers check a command's body before the view hands it to a service."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from adaptation.api.filters import ID_MAX
from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    AttemptEnd,
    Culprit,
    FailureClass,
    JobStatus,
    KnownLimitation,
    ModelRelease,
    StageRun,
    SuiteRun,
    WebhookEndpoint,
    WebhookKind,
)
from adaptation.page_links import page_url
from adaptation.presenters.analysis import analysed_config, latest_analysis_run
from adaptation.presenters.pools import device_warning_text, device_warnings
from adaptation.selectors.inventory import PoolInventory, WorkerState
from adaptation.selectors.limitations import release_open_limitations_all
from adaptation.services.errors import ServiceError
from adaptation.services.pools import pool_get
from adaptation.services.queueing import unsent_stage_runs
from adaptation.services.suites import suite_definition
from adaptation.webhooks.endpoints import webhook_url_path
from engine.registry import job_options_check, stage_list_check
from engine.stages.analyze.result import AnalysisResult

# A result summary keeps a string up to this many characters.
SUMMARY_TEXT_CHARS = 300

# The config.json keys a release's config summary shows, with the JSON type each must have
# (a value of another type is shown as null).
CONFIG_SUMMARY_KEYS: dict[str, tuple[type, ...]] = {
    "model_type": (str,),
    "architectures": (list,),
    "hidden_size": (int,),
    "num_hidden_layers": (int,),
    "num_attention_heads": (int,),
    "num_key_value_heads": (int,),
    "intermediate_size": (int,),
    "vocab_size": (int,),
    "max_position_embeddings": (int,),
    "torch_dtype": (str,),
}


def result_summary(result: Any) -> dict[str, Any]:
    """The top-level scalars of a stage result (strings cut to `SUMMARY_TEXT_CHARS`);
    lists and objects are left to the stage run's detail, which has the whole result."""
    if not isinstance(result, Mapping):
        return {}
    summary: dict[str, Any] = {}
    for key, value in result.items():
        if isinstance(value, str):
            summary[str(key)] = value[:SUMMARY_TEXT_CHARS]
        elif value is None or isinstance(value, bool | int | float):
            summary[str(key)] = value
    return summary


def config_summary(config: Any) -> dict[str, Any] | None:
    """The release's `config.json` figures of `CONFIG_SUMMARY_KEYS` (null where missing or
    of another type), plus `quantization_method` from `quantization_config`. None without a
    config."""
    if not isinstance(config, Mapping):
        return None
    summary: dict[str, Any] = {}
    for key, kinds in CONFIG_SUMMARY_KEYS.items():
        value = config.get(key)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        summary[key] = value if ok else None
    if isinstance(summary["architectures"], list):
        summary["architectures"] = [str(a) for a in summary["architectures"]]
    quantization = config.get("quantization_config")
    method = quantization.get("quant_method") if isinstance(quantization, Mapping) else None
    summary["quantization_method"] = method if isinstance(method, str) else None
    return summary


def latest_stage_runs(job: AdaptationJob) -> list[StageRun]:
    """The latest attempt of each of the job's stages, in stage order, from its prefetched
    stage runs."""
    latest: dict[int, StageRun] = {}
    for run in sorted(job.stage_runs.all(), key=lambda r: (r.position, r.attempt)):
        latest[run.position] = run
    return [latest[p] for p in sorted(latest)]


@extend_schema_field(
    {
        "type": "object",
        "additionalProperties": {
            "oneOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}],
            "nullable": True,
        },
        "description": "The result's top-level numbers, texts and flags.",
    }
)
class ResultSummaryField(serializers.Field):
    """A stage run's result summary (`result_summary`; {} before it has a result),
    read-only."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(read_only=True, source="*", **kwargs)

    def to_representation(self, value: StageRun) -> dict[str, Any]:
        return result_summary(value.result)


# --- stage runs -------------------------------------------------------------------------------


class StageRunAttemptOutput(serializers.Serializer):
    """One time a worker ran a stage run (`StageRun.attempts`): a lost or transient attempt
    is retried on the same run."""

    n = serializers.IntegerField(read_only=True, help_text="1 for the first, and so on.")
    worker_host = serializers.CharField(read_only=True, help_text='The Celery node ("cpu@host").')
    pid = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="The process that ran it on that host."
    )
    started_at = serializers.DateTimeField(read_only=True, allow_null=True)
    ended_at = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="Null while it runs."
    )
    ended = serializers.ChoiceField(
        choices=AttemptEnd.choices,
        read_only=True,
        allow_null=True,
        help_text="How it ended; null while it runs.",
    )
    reason = serializers.CharField(
        read_only=True, allow_blank=True, help_text="Why it ended (the error's first line)."
    )
    culprit = serializers.ChoiceField(
        choices=Culprit.choices,
        read_only=True,
        allow_null=True,
        help_text="What its end is put down to; null when that cannot be told.",
    )
    oom_kills_at_start = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        help_text="The worker cgroup's OOM-kill count when it started (null: unknown).",
    )


class FailureClassField(serializers.ChoiceField):
    """Whose fault a failed run is (`StageRun.failure_class`); blank unless failed."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            choices=FailureClass.choices,
            allow_blank=True,
            read_only=True,
            help_text="A failed run's class: infrastructure (time limit, lost worker, host out "
            "of memory, broker/hub/network unavailable, engine did not start for a host "
            "reason, a day0 error) or release (config, unsupported feature, precision, no "
            "fit, engine refuses the architecture); blank unless failed.",
            **kwargs,
        )


# What every stage-run output shows of the attempt itself.
_STAGE_RUN_FIELDS = [
    "stage",
    "position",
    "attempt",
    "status",
    "queued_at",
    "started_at",
    "finished_at",
    "heartbeat_at",
    "worker_host",
    "retries",
    "error",
    "failure_class",
    "result_summary",
    "attempts",
]


class StageAttemptOutput(serializers.ModelSerializer):
    """The latest attempt of one stage of a job, as a job's detail lists them."""

    result_summary = ResultSummaryField()
    failure_class = FailureClassField()
    attempts = StageRunAttemptOutput(many=True, read_only=True)

    class Meta:
        model = StageRun
        fields = ["id", *_STAGE_RUN_FIELDS]
        read_only_fields = fields


class StageBriefOutput(serializers.ModelSerializer):
    """A stage's latest attempt in a job list: name, status, attempt."""

    class Meta:
        model = StageRun
        fields = ["stage", "status", "attempt"]
        read_only_fields = fields


class StageRunOutput(serializers.ModelSerializer):
    """One attempt of one stage (any attempt, not only the latest)."""

    release = serializers.IntegerField(source="job.release_id", read_only=True)
    repo_id = serializers.CharField(source="job.release.repo_id", read_only=True)
    pool = serializers.CharField(source="job.pool.name", read_only=True)
    result_summary = ResultSummaryField()
    failure_class = FailureClassField()
    attempts = StageRunAttemptOutput(many=True, read_only=True)

    class Meta:
        model = StageRun
        fields = ["id", "job", "release", "repo_id", "pool", *_STAGE_RUN_FIELDS]
        read_only_fields = fields


class StageRunDetailOutput(StageRunOutput):
    """One attempt with its whole result and log excerpt."""

    result = serializers.JSONField(
        read_only=True, allow_null=True, help_text="The stage's whole result (null until done)."
    )

    class Meta(StageRunOutput.Meta):
        fields = [*StageRunOutput.Meta.fields, "result", "log"]
        read_only_fields = fields


# --- jobs -------------------------------------------------------------------------------------


class JobBriefOutput(serializers.ModelSerializer):
    """A job in a release's detail: its pool, status, readiness and each stage's latest
    attempt."""

    pool = serializers.CharField(source="pool.name", read_only=True)
    stages = serializers.SerializerMethodField()

    class Meta:
        model = AdaptationJob
        fields = [
            "id",
            "pool",
            "status",
            "trigger",
            "created_at",
            "started_at",
            "finished_at",
            "readiness",
            "blocking_stage",
            "ready_at",
            "stages",
        ]
        read_only_fields = fields

    @extend_schema_field(StageBriefOutput(many=True))
    def get_stages(self, job: AdaptationJob) -> list[dict[str, Any]]:
        return StageBriefOutput(latest_stage_runs(job), many=True).data


class JobOutput(JobBriefOutput):
    """A job in a list: a brief job with its release, who asked for it and its options."""

    repo_id = serializers.CharField(source="release.repo_id", read_only=True)
    revision = serializers.CharField(source="release.revision", read_only=True)
    requested_by = serializers.CharField(
        source="requested_by.get_username", read_only=True, allow_null=True, default=None
    )
    stage_names = serializers.ListField(
        source="stages", child=serializers.CharField(), read_only=True
    )
    options = serializers.JSONField(read_only=True, help_text="Per-stage options.")

    class Meta(JobBriefOutput.Meta):
        fields = [
            "id",
            "release",
            "repo_id",
            "revision",
            "pool",
            "status",
            "trigger",
            "requested_by",
            "stage_names",
            "options",
            "created_at",
            "started_at",
            "finished_at",
            "readiness",
            "blocking_stage",
            "ready_at",
            "stages",
        ]
        read_only_fields = fields


class JobDetailOutput(JobOutput):
    """A job with the latest attempt of each stage in full, and the stages queued but not yet
    handed to the broker (`unsent_stages`: it was unreachable; day0 sends them when it is
    back, within `DAY0_REAP_EVERY_S`)."""

    unsent_stages = serializers.SerializerMethodField()

    class Meta(JobOutput.Meta):
        fields = [*JobOutput.Meta.fields, "unsent_stages"]
        read_only_fields = fields

    @extend_schema_field(StageAttemptOutput(many=True))
    def get_stages(self, job: AdaptationJob) -> list[dict[str, Any]]:
        return StageAttemptOutput(latest_stage_runs(job), many=True).data

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_unsent_stages(self, job: AdaptationJob) -> list[str]:
        return [run.stage for run in unsent_stage_runs(job)]


class StrictPrimaryKeyRelatedField(serializers.PrimaryKeyRelatedField):
    """A row id that is a whole number (a JSON integer, or its digits as text), from 1 to
    `ID_MAX`: DRF's field would hand `3.7` (or `true`) to the database, which reads it as
    row 3 (or 1)."""

    default_error_messages = {
        **serializers.PrimaryKeyRelatedField.default_error_messages,
        "incorrect_type": "Incorrect type. Expected a whole-number id, received {data_type}.",
    }

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str) and data.isascii() and data.isdigit():
            data = int(data)
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("incorrect_type", data_type=type(data).__name__)
        if not 1 <= data <= ID_MAX:
            self.fail("does_not_exist", pk_value=data)
        return super().to_internal_value(data)


class JobCreateInput(serializers.Serializer):
    """Start a job for a release on a pool. Each refusal names its field: an unknown
    release, pool (or a disabled one) or stage, options a stage refuses. A job for the same
    release on the same pool that has not ended refuses it (409) unless `allow_duplicate`."""

    release = StrictPrimaryKeyRelatedField(
        queryset=ModelRelease.objects.all(), help_text="The release's id."
    )
    pool = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text="An enabled pool's name; blank or absent: DAY0_DEFAULT_POOL.",
    )
    stages = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        allow_empty=False,
        help_text="Stage names to run, in order; absent: every stage.",
    )
    options = serializers.DictField(
        child=serializers.DictField(),
        required=False,
        help_text='Per-stage options: {"plan": {"context_tokens": 8192}}.',
    )
    allow_duplicate = serializers.BooleanField(
        required=False,
        default=False,
        help_text=(
            "Start the job even while another job for this release on this pool is pending "
            "or running. False or absent: that is refused with 409 (code duplicate_job), "
            "naming the job that has not ended."
        ),
    )

    def validate_stages(self, value: list[str]) -> list[str]:
        """The stages in the registry's order (`engine.registry.stage_list_check`): an
        unknown or repeated one, or one without a stage it needs, is refused here."""
        try:
            return stage_list_check(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from exc

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """The pool as a row (`pool_get`: the default when blank or absent); the options
        checked as `job_create` will check them (`job_options_check`). Each refusal is under
        its field."""
        try:
            attrs["pool"] = pool_get(name=attrs.get("pool") or None)
        except ServiceError as exc:
            raise serializers.ValidationError({"pool": [str(exc)]}) from exc
        if "options" in attrs:
            try:
                job_options_check(options=attrs["options"], stages=attrs.get("stages"))
            except ValueError as exc:
                raise serializers.ValidationError({"options": [str(exc)]}) from exc
        return attrs


# --- releases ---------------------------------------------------------------------------------


class ReleaseOutput(serializers.ModelSerializer):
    """A release in a list, with its newest job's id and status."""

    watch = serializers.CharField(source="watch.name", read_only=True, allow_null=True)
    latest_job = serializers.IntegerField(
        source="latest_job_id", read_only=True, allow_null=True, help_text="Newest job's id."
    )
    status = serializers.ChoiceField(
        source="latest_job_status",
        choices=JobStatus.choices,
        read_only=True,
        allow_null=True,
        help_text="The newest job's status; null without a job.",
    )

    class Meta:
        model = ModelRelease
        fields = [
            "id",
            "repo_id",
            "revision",
            "hub_kind",
            "hub_endpoint",
            "watch",
            "found_by",
            "published_at",
            "discovered_at",
            "architecture",
            "family",
            "latest_job",
            "status",
        ]
        read_only_fields = fields


class ConfigSummaryOutput(serializers.Serializer):
    """The figures of the release's config.json most readers want (null when absent)."""

    model_type = serializers.CharField(allow_null=True)
    architectures = serializers.ListField(child=serializers.CharField(), allow_null=True)
    hidden_size = serializers.IntegerField(allow_null=True)
    num_hidden_layers = serializers.IntegerField(allow_null=True)
    num_attention_heads = serializers.IntegerField(allow_null=True)
    num_key_value_heads = serializers.IntegerField(allow_null=True)
    intermediate_size = serializers.IntegerField(allow_null=True)
    vocab_size = serializers.IntegerField(allow_null=True)
    max_position_embeddings = serializers.IntegerField(allow_null=True)
    torch_dtype = serializers.CharField(allow_null=True)
    quantization_method = serializers.CharField(allow_null=True)


class AnalysisOutput(serializers.Serializer):
    """The release's latest successful `analyze` attempt and its whole result."""

    stage_run = serializers.IntegerField()
    job = serializers.IntegerField()
    finished_at = serializers.DateTimeField(allow_null=True)
    family = serializers.CharField(allow_null=True)
    architecture = serializers.CharField(allow_null=True)
    result = serializers.JSONField(help_text="The analyze stage's result, as stored.")


class LimitationOutput(serializers.ModelSerializer):
    """A known limitation of a release: raised by a stage from what it found (`stage`, `key`
    set) or written by a person (`author`); `pool` null means every pool; `body` is Markdown.
    `title` and `body` are the words the release page shows (a stage's note worded by its
    template now: `KnownLimitation.shown_title`). `status_changed_at` and `status_changed_by`
    tell its latest status change (both null: never changed; `status_changed_by` null with a
    time: a stage re-run changed it)."""

    title = serializers.CharField(source="shown_title", read_only=True)
    body = serializers.CharField(source="shown_body", read_only=True, help_text="Markdown.")
    pool = serializers.CharField(source="pool.name", read_only=True, allow_null=True, default=None)
    author = serializers.CharField(
        source="author.get_username", read_only=True, allow_null=True, default=None
    )
    status_changed_at = serializers.SerializerMethodField()
    status_changed_by = serializers.SerializerMethodField()

    def _latest_change(self, note: KnownLimitation) -> Any:
        # `status_changes` comes prefetched newest first (selectors.limitations).
        return next(iter(note.status_changes.all()), None)

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_status_changed_at(self, note: KnownLimitation) -> str | None:
        change = self._latest_change(note)
        return serializers.DateTimeField().to_representation(change.changed_at) if change else None

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_status_changed_by(self, note: KnownLimitation) -> str | None:
        change = self._latest_change(note)
        return (change.changed_by_name or None) if change else None

    class Meta:
        model = KnownLimitation
        fields = [
            "id",
            "title",
            "severity",
            "status",
            "pool",
            "stage",
            "key",
            "author",
            "body",
            "created_at",
            "updated_at",
            "status_changed_at",
            "status_changed_by",
        ]
        read_only_fields = fields


class ReleaseDetailOutput(ReleaseOutput):
    """A release with its analysis, config summary, jobs (each with its readiness) and open
    known limitations (most severe first)."""

    analysis = serializers.SerializerMethodField()
    config_summary = serializers.SerializerMethodField()
    jobs = JobBriefOutput(many=True, read_only=True)
    limitations = serializers.SerializerMethodField()

    class Meta(ReleaseOutput.Meta):
        fields = [*ReleaseOutput.Meta.fields, "analysis", "config_summary", "jobs", "limitations"]
        read_only_fields = fields

    @extend_schema_field(LimitationOutput(many=True))
    def get_limitations(self, release: ModelRelease) -> list[dict[str, Any]]:
        return LimitationOutput(release_open_limitations_all(release=release), many=True).data

    def _analysis_run(self, release: ModelRelease) -> StageRun | None:
        cache = self.context.setdefault("_analysis_runs", {})
        if release.pk not in cache:
            cache[release.pk] = latest_analysis_run(release)
        return cache[release.pk]

    @extend_schema_field(AnalysisOutput(allow_null=True))
    def get_analysis(self, release: ModelRelease) -> dict[str, Any] | None:
        run = self._analysis_run(release)
        if run is None:
            return None
        analysis = AnalysisResult.from_stored(run.result)
        return AnalysisOutput(
            {
                "stage_run": run.pk,
                "job": run.job_id,
                "finished_at": run.finished_at,
                "family": analysis.family,
                "architecture": analysis.architecture,
                # The row as stored: the API shows every figure the stage wrote.
                "result": dict(run.result) if isinstance(run.result, Mapping) else {},
            }
        ).data

    @extend_schema_field(ConfigSummaryOutput(allow_null=True))
    def get_config_summary(self, release: ModelRelease) -> dict[str, Any] | None:
        run = self._analysis_run(release)
        config = analysed_config(release, run) if run else release.config
        summary = config_summary(config)
        return None if summary is None else ConfigSummaryOutput(summary).data


# --- pools ------------------------------------------------------------------------------------


class DeviceOutput(serializers.Serializer):
    """One device a worker reported through torch."""

    index = serializers.IntegerField(allow_null=True)
    name = serializers.CharField(allow_null=True)
    type = serializers.CharField(allow_null=True)
    memory_bytes = serializers.IntegerField(allow_null=True)


class WorkerOutput(serializers.Serializer):
    """A worker serving the pool: live, stale (no heartbeat for DAY0_WORKER_STALE_S) or
    stopped, with the stage runs it runs now."""

    name = serializers.CharField(source="worker.name")
    hostname = serializers.CharField(source="worker.hostname")
    state = serializers.ChoiceField(choices=["live", "stale", "stopped"])
    backend = serializers.CharField(source="worker.backend")
    devices = serializers.SerializerMethodField()
    cpu_cores = serializers.IntegerField(source="worker.cpu_cores", allow_null=True)
    memory_bytes = serializers.IntegerField(source="worker.memory_bytes", allow_null=True)
    started_at = serializers.DateTimeField(source="worker.started_at")
    last_heartbeat_at = serializers.DateTimeField(source="worker.last_heartbeat_at")
    heartbeat_age_s = serializers.FloatField()
    running_stage_runs = serializers.SerializerMethodField()
    software = serializers.DictField(
        source="worker.software",
        help_text="What the worker reported of its software: torch, python and celery "
        "versions and, once it reports its stack, `driver` (null: no accelerator; else "
        '{"cuda": ..., "nvidia": ...}) and `engines` (per pool name, its serving engine\'s '
        'versions: {"vllm": "0.32.0", "torch": ...}).',
    )

    @extend_schema_field(DeviceOutput(many=True))
    def get_devices(self, state: WorkerState) -> list[dict[str, Any]]:
        devices = []
        for device in state.worker.devices or []:
            if not isinstance(device, Mapping):
                continue
            index, memory = device.get("index"), device.get("memory_bytes")
            devices.append(
                {
                    "index": index if isinstance(index, int) else None,
                    "name": str(device["name"]) if device.get("name") else None,
                    "type": str(device["type"]) if device.get("type") else None,
                    "memory_bytes": memory if isinstance(memory, int) else None,
                }
            )
        return DeviceOutput(devices, many=True).data

    @extend_schema_field(serializers.ListField(child=serializers.IntegerField()))
    def get_running_stage_runs(self, state: WorkerState) -> list[int]:
        return [run.pk for run in state.running]


def engine_output(engine: Any) -> dict[str, Any]:
    """A pool's serving `engine` as the API shows it: every setting as stored, except `env`,
    whose values may be credentials (a hub token, an API key the engine reads), so only its
    variable NAMES are shown, sorted: `{"kind": "vllm", "env": ["HF_TOKEN",
    "VLLM_CPU_KVCACHE_SPACE"], ...}`. The values are read and set in the admin only."""
    if not isinstance(engine, Mapping):
        return {}
    shown = dict(engine)
    if "env" in shown:
        env = shown["env"]
        shown["env"] = sorted(str(name) for name in env) if isinstance(env, Mapping) else []
    return shown


class _InventoryAttribute(serializers.Field):
    """A pool's field read from its inventory (the view's `inventory_of`, one per pool): the
    `PoolInventory` attribute `source` names (the field's own name when not given)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(read_only=True, **kwargs)

    def get_attribute(self, instance: AcceleratorPool) -> Any:
        return getattr(self.context["inventory_of"](instance), self.source)


class InventoryInteger(_InventoryAttribute, serializers.IntegerField):
    pass


class InventoryFloat(_InventoryAttribute, serializers.FloatField):
    pass


class InventoryFlag(_InventoryAttribute, serializers.BooleanField):
    pass


class InventoryText(_InventoryAttribute, serializers.CharField):
    pass


class InventoryMoment(_InventoryAttribute, serializers.DateTimeField):
    pass


class PoolOutput(serializers.ModelSerializer):
    """A pool with its layout, workers (live first), devices and queue, as the pools page
    shows it (`adaptation.selectors.inventory.pool_inventory`), and its serving `engine`
    (docs/stages/serve.md; set in the admin, as every pool field) with its `env` as the list
    of its variables' names, never their values (`engine_output`)."""

    engine = serializers.SerializerMethodField()
    layout_devices = InventoryInteger(source="devices_declared", allow_null=True)
    layout_error = InventoryText()
    devices_reported = InventoryInteger()
    devices_held = InventoryInteger()
    devices_free = InventoryInteger()
    has_live_worker = InventoryFlag()
    queue_depth = InventoryInteger(
        source="queued_stage_runs", help_text="Stage runs queued for this pool."
    )
    oldest_queued_at = InventoryMoment(allow_null=True)
    oldest_wait_s = InventoryFloat(allow_null=True)
    warnings = serializers.SerializerMethodField()
    workers = serializers.SerializerMethodField()
    stack = serializers.DictField(
        read_only=True,
        help_text='The software stack the pool serves with ({"torch", "driver", "engine"}): '
        "what its newest live worker reported; {} before any report (docs/operations.md).",
    )

    class Meta:
        model = AcceleratorPool
        fields = [
            "id",
            "name",
            "enabled",
            "backend",
            "device",
            "queue",
            "dtypes",
            "accelerator",
            "devices_per_node",
            "nodes",
            "description",
            "engine",
            "engine_allow_private_network",
            "layout_devices",
            "layout_error",
            "devices_reported",
            "devices_held",
            "devices_free",
            "has_live_worker",
            "queue_depth",
            "oldest_queued_at",
            "oldest_wait_s",
            "warnings",
            "workers",
            "stack",
        ]
        read_only_fields = fields

    def _inventory(self, pool: AcceleratorPool) -> PoolInventory:
        """The pool's inventory, made by the view's `inventory_of` (one per pool)."""
        return self.context["inventory_of"](pool)

    @extend_schema_field(
        serializers.DictField(
            help_text=(
                "The pool's serving engine (docs/stages/serve.md); `env` lists the names of "
                "the engine's extra environment variables, never their values."
            )
        )
    )
    def get_engine(self, pool: AcceleratorPool) -> dict[str, Any]:
        return engine_output(pool.engine)

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_warnings(self, pool: AcceleratorPool) -> list[str]:
        return [device_warning_text(w) for w in device_warnings(self._inventory(pool))]

    @extend_schema_field(WorkerOutput(many=True))
    def get_workers(self, pool: AcceleratorPool) -> list[dict[str, Any]]:
        return WorkerOutput(self._inventory(pool).workers, many=True).data


# --- webhook endpoints ------------------------------------------------------------------------


class WebhookEndpointOutput(serializers.ModelSerializer):
    """A webhook endpoint and the path deliveries are posted to. Its secret is never shown
    again after creation."""

    pool = serializers.CharField(source="pool.name", read_only=True, allow_null=True)
    created_by = serializers.CharField(
        source="created_by.get_username", read_only=True, allow_null=True, default=None
    )
    url = serializers.SerializerMethodField()

    class Meta:
        model = WebhookEndpoint
        fields = [
            "id",
            "name",
            "kind",
            "url",
            "pool",
            "quiet_period_s",
            "enabled",
            "created_by",
            "created_at",
            "last_delivery_at",
        ]
        read_only_fields = fields

    @extend_schema_field(
        serializers.CharField(help_text="Path to post deliveries to: /webhooks/<kind>/<id>.")
    )
    def get_url(self, endpoint: WebhookEndpoint) -> str:
        return webhook_url_path(endpoint)


class WebhookEndpointCreatedOutput(WebhookEndpointOutput):
    """A new endpoint with its secret: shown this once, never again."""

    secret = serializers.SerializerMethodField()

    class Meta(WebhookEndpointOutput.Meta):
        fields = [*WebhookEndpointOutput.Meta.fields, "secret"]
        read_only_fields = fields

    @extend_schema_field(
        serializers.CharField(
            help_text="The Hub's shared secret, or the Standard Webhooks whsec_ signing key; "
            "shown once."
        )
    )
    def get_secret(self, endpoint: WebhookEndpoint) -> str:
        return self.context["secret"]


class WebhookEndpointCreateInput(serializers.Serializer):
    """A new endpoint: its name, kind, and optionally its pool and quiet period."""

    name = serializers.CharField(max_length=128)
    kind = serializers.ChoiceField(choices=WebhookKind.choices)
    pool = serializers.SlugRelatedField(
        slug_field="name",
        queryset=AcceleratorPool.objects.all(),
        required=False,
        allow_null=True,
        help_text="Pool name for the jobs it starts; absent: the watch's or default pool.",
    )
    quiet_period_s = serializers.IntegerField(
        required=False,
        min_value=0,
        help_text="Seconds a repo must be quiet before its coalesced Hub upload starts a job.",
    )


# --- standard-suite runs ----------------------------------------------------------------------


class SuiteRunCreateInput(serializers.Serializer):
    """Start a run of a suite on a pool: one job per reference release (docs/suite.md).
    Each refusal is under its field."""

    # Required, unlike a job's: a suite run is one job per entry on the pool, too much to
    # start on the default pool by an empty body.
    pool = serializers.CharField(help_text="An enabled pool's name.")
    suite = serializers.SlugField(
        required=False, default="standard", help_text='The suite\'s name; absent: "standard".'
    )
    stages = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        allow_empty=False,
        help_text="Run only these stages (in registry order); absent: every stage.",
    )

    # The stage list is checked as a job's is, under "stages".
    validate_stages = JobCreateInput.validate_stages

    def validate_pool(self, value: str) -> AcceleratorPool:
        """The enabled pool named `value` (`pool_get`)."""
        try:
            return pool_get(name=value)
        except ServiceError as exc:
            raise serializers.ValidationError(str(exc)) from exc

    def validate_suite(self, value: str) -> str:
        """A suite the checkout defines, its file and folders readable (`suite_definition`)."""
        try:
            suite_definition(value)
        except ServiceError as exc:
            raise serializers.ValidationError(str(exc)) from exc
        return value


class SuiteJobOutput(serializers.ModelSerializer):
    """A job of a suite run: its entry, release and status."""

    entry = serializers.CharField(source="suite_entry", read_only=True)
    repo_id = serializers.CharField(source="release.repo_id", read_only=True)

    class Meta:
        model = AdaptationJob
        fields = ["id", "entry", "release", "repo_id", "status", "readiness", "blocking_stage"]
        read_only_fields = fields


class SuiteRunOutput(serializers.ModelSerializer):
    """A run of a suite on a pool: what started it, the pool's stack then, the run it is
    compared with (`previous`), its jobs and its matrix page."""

    pool = serializers.CharField(source="pool.name", read_only=True)
    # Plain text, not an enum: the jobs' "trigger" enum has other values (one name each).
    trigger = serializers.CharField(
        read_only=True, help_text='What started it: "manual", "api" or "stack-upgrade".'
    )
    requested_by = serializers.CharField(
        source="requested_by.get_username", read_only=True, allow_null=True, default=None
    )
    stack = serializers.JSONField(
        read_only=True, help_text="The pool's software stack when the run started."
    )
    jobs = SuiteJobOutput(many=True, read_only=True)
    page_url = serializers.SerializerMethodField()

    class Meta:
        model = SuiteRun
        fields = [
            "id",
            "suite",
            "pool",
            "trigger",
            "requested_by",
            "created_at",
            "stack",
            "previous",
            "jobs",
            "page_url",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.URLField(help_text="The run's matrix page."))
    def get_page_url(self, run: SuiteRun) -> str:
        return page_url(reverse("adaptation:suite_run", args=[run.pk]))


class SuiteCellOutput(serializers.Serializer):
    """One stage of one entry's job: its state (passed, regressed, failed, skipped, running,
    queued, pending, cancelled, not-run), the failure's class, the regressions' metric keys,
    the state it is compared with and how this one differs (newly-failing, fixed,
    newly-regressed, still-failing, or "")."""

    stage = serializers.CharField()
    state = serializers.CharField()
    failure_class = serializers.CharField()
    attempt = serializers.IntegerField()
    regressions = serializers.ListField(child=serializers.CharField())
    previous_state = serializers.CharField(
        allow_null=True,
        help_text=(
            "The entry's state at this stage in the previous run; when that run did not run "
            "the stage (not in its job, or cancelled), in the newest earlier run that did. "
            "Null when no run before has it."
        ),
    )
    previous_run = serializers.IntegerField(
        source="previous_run_id",
        allow_null=True,
        help_text="The suite run `previous_state` is from (null with it).",
    )
    change = serializers.CharField()


class SuiteRowOutput(serializers.Serializer):
    """One entry of the run: its family shapes, release, job and cells in stage order."""

    entry = serializers.CharField()
    shapes = serializers.ListField(child=serializers.CharField())
    release = serializers.IntegerField(source="release_id")
    repo_id = serializers.CharField()
    job = serializers.IntegerField(source="job_id")
    job_status = serializers.CharField()
    previous_job = serializers.IntegerField(source="previous_job_id", allow_null=True)
    cells = SuiteCellOutput(many=True)


class SuiteRunDetailOutput(SuiteRunOutput):
    """A suite run with its matrix: a row per entry, a cell per stage."""

    matrix = serializers.SerializerMethodField()

    class Meta(SuiteRunOutput.Meta):
        fields = [*SuiteRunOutput.Meta.fields, "matrix"]
        read_only_fields = fields

    @extend_schema_field(SuiteRowOutput(many=True))
    def get_matrix(self, run: SuiteRun) -> list[dict[str, Any]]:
        return SuiteRowOutput(self.context["matrix"].rows, many=True).data

"""API views: thin viewsets that read through `adaptation.selectors` and `inventory` and
write through `adaptation.services` (and `webhooks.endpoints`).

Lists are paginated (`?page=&page_size=`), filtered (see `filters`) and ordered
(`?ordering=field` or `-field`); each action needs the permission its view's
`action_permissions` names (`permissions.ActionPermission`).
"""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, ProtectedError, QuerySet
from django.urls import reverse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import (
    AuthenticationFailed,
    NotAuthenticated,
    NotFound,
    PermissionDenied,
    ValidationError,
)
from rest_framework.filters import SearchFilter
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from adaptation.api import filters, plan_serializers, serializers
from adaptation.api.exceptions import Conflict, DuplicateJob
from adaptation.api.permissions import READ_API, ActionPermission
from adaptation.catalog import pool_layout
from adaptation.models import (
    AcceleratorKind,
    AcceleratorPool,
    AdaptationJob,
    ModelRelease,
    StageRun,
    SuiteRun,
    SuiteTrigger,
    Trigger,
    WebhookEndpoint,
    Worker,
)
from adaptation.page_links import job_page_url
from adaptation.plan_requests import PlanRequestError, plan_and_workload
from adaptation.presenters.suites import suite_matrix
from adaptation.roles import CANCEL_JOB, RERUN_STAGE, TRIGGER_JOB
from adaptation.selectors import inventory
from adaptation.selectors.jobs import jobs_with_stage_runs, stage_runs_with_jobs
from adaptation.selectors.releases import releases_with_latest_job
from adaptation.selectors.suites import (
    suite_definition_or_none,
    suite_run_jobs,
    suite_run_lookback_jobs,
    suite_runs,
)
from adaptation.services.errors import ServiceError
from adaptation.services.jobs import (
    DuplicateJobError,
    job_cancel,
    job_create,
    job_rerun_stage,
)
from adaptation.services.queueing import unsent_stage_runs
from adaptation.services.suites import suite_start
from adaptation.webhooks.endpoints import EndpointError, webhook_endpoint_create
from engine.catalog import CatalogError
from engine.stages.plan.errors import NoFittingPlan, PlanInputError
from engine.stages.plan.run import no_fit_result

CONFLICT = OpenApiResponse(description="The job's state does not allow this now (see message).")
DUPLICATE = OpenApiResponse(
    description='A job for this release on this pool is pending or running: code "duplicate_job", '
    'and "job" names it ({"id", "status", "url", "page_url"}). Send "allow_duplicate": true '
    "to start another anyway."
)


class ThrottleRefusalsMixin:
    """Count refused requests against the caller's rate too: DRF checks throttles only
    after authentication and permissions pass, so anonymous callers, bad tokens and
    forbidden calls would never be slowed down. A caller over its rate gets 429 instead."""

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        try:
            super().initial(request, *args, **kwargs)
        except (AuthenticationFailed, NotAuthenticated, PermissionDenied):
            self.check_throttles(request)
            raise


class ReleaseViewSet(ThrottleRefusalsMixin, viewsets.ReadOnlyModelViewSet):
    """Model releases found on the hubs (one per repo and revision), newest first."""

    queryset = ModelRelease.objects.all()
    permission_classes = [ActionPermission]
    filterset_class = filters.ReleaseFilter
    filter_backends = [
        *viewsets.ReadOnlyModelViewSet.filter_backends,
        SearchFilter,
        filters.StableOrderingFilter,
    ]
    search_fields = ["repo_id"]
    ordering_fields = ["discovered_at", "published_at", "repo_id", "id"]
    ordering = ["-discovered_at", "-id"]

    def get_queryset(self) -> QuerySet[ModelRelease]:
        return releases_with_latest_job(with_jobs=self.action == "retrieve")

    def get_serializer_class(self) -> type[BaseSerializer]:
        if self.action == "retrieve":
            return serializers.ReleaseDetailOutput
        return serializers.ReleaseOutput


class JobViewSet(
    ThrottleRefusalsMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Adaptation jobs: list, detail with each stage's latest attempt, create, cancel, and
    re-run a stage (with the stages after it)."""

    queryset = AdaptationJob.objects.all()
    permission_classes = [ActionPermission]
    action_permissions = {"create": TRIGGER_JOB, "cancel": CANCEL_JOB, "rerun": RERUN_STAGE}
    filterset_class = filters.JobFilter
    filter_backends = [*viewsets.GenericViewSet.filter_backends, filters.StableOrderingFilter]
    ordering_fields = ["created_at", "started_at", "finished_at", "status", "id"]
    ordering = ["-created_at", "-id"]

    def get_queryset(self) -> QuerySet[AdaptationJob]:
        return jobs_with_stage_runs()

    def get_serializer_class(self) -> type[BaseSerializer]:
        if self.action == "list":
            return serializers.JobOutput
        if self.action == "create":
            return serializers.JobCreateInput
        return serializers.JobDetailOutput

    def _detail(self, job: AdaptationJob, *, code: int = status.HTTP_200_OK) -> Response:
        job = self.get_queryset().get(pk=job.pk)
        return Response(serializers.JobDetailOutput(job).data, status=code)

    @extend_schema(
        request=serializers.JobCreateInput,
        responses={
            201: serializers.JobDetailOutput,
            202: serializers.JobDetailOutput,
            409: DUPLICATE,
        },
        summary="Start a job for a release on a pool",
    )
    def create(self, request: Request) -> Response:
        """Start a job (trigger "api", requested by the caller) for a release on a pool
        (absent: `DAY0_DEFAULT_POOL`), with every stage unless `stages` names some, and
        per-stage `options`. Its first stage is queued at once: 201, or 202 when the broker
        could not take it (the job is saved; `unsent_stages` names it; day0 sends it when the
        broker is back). 409 while a job for the release on the pool is pending or running,
        unless `allow_duplicate` is true. Needs `trigger_job`."""
        data = self._validated(serializers.JobCreateInput, request)
        try:
            job = job_create(
                release=data["release"],
                pool=data["pool"],
                trigger=Trigger.API,
                requested_by=request.user,
                stages=data.get("stages"),
                options=data.get("options"),
                allow_duplicate=data["allow_duplicate"],
            )
        except DuplicateJobError as exc:
            raise self._duplicate(request, exc) from exc
        # 202: saved and queued, but the broker has not taken the first stage yet (it is down).
        sent = not unsent_stage_runs(job)
        return self._detail(job, code=status.HTTP_201_CREATED if sent else status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=None,
        responses={200: serializers.JobDetailOutput, 409: CONFLICT},
        summary="Cancel a job",
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Cancel a job that has not finished: its pending, queued and running stages are
        cancelled, a running worker is asked to stop and its result discarded. 409 for a
        job already finished. Needs `cancel_job`."""
        job = self.get_object()
        try:
            job = job_cancel(job=job, by=request.user)
        except ServiceError as exc:
            raise Conflict(str(exc)) from exc
        return self._detail(job)

    @extend_schema(
        request=None,
        responses={202: serializers.JobDetailOutput, 409: CONFLICT},
        parameters=[
            OpenApiParameter(
                "stage", OpenApiTypes.STR, OpenApiParameter.PATH, description="A stage of the job."
            )
        ],
        summary="Re-run a stage of a job and the stages after it",
    )
    @action(detail=True, methods=["post"], url_path=r"stages/(?P<stage>[\w-]+)/rerun")
    def rerun(self, request: Request, pk: str | None = None, stage: str = "") -> Response:
        """Queue a new attempt of `stage` and of every stage after it (earlier attempts are
        kept). 404 for a stage the job does not have; 409 while the job runs or when an
        earlier stage has not succeeded. Needs `rerun_stage`."""
        job = self.get_object()
        if stage not in job.stages:
            raise NotFound(f"Job {job.pk} has no stage {stage!r}; it has {', '.join(job.stages)}.")
        try:
            job_rerun_stage(job=job, stage=stage)
        except ServiceError as exc:
            raise Conflict(str(exc)) from exc
        return self._detail(job, code=status.HTTP_202_ACCEPTED)

    @staticmethod
    def _duplicate(request: Request, exc: DuplicateJobError) -> DuplicateJob:
        """The 409 naming the job that has not ended, with its API and page URLs."""
        job = exc.job
        return DuplicateJob(
            f'{exc} Send "allow_duplicate": true to start another anyway.',
            extra={
                "job": {
                    "id": job.pk,
                    "status": job.status,
                    "url": request.build_absolute_uri(reverse("api:job-detail", args=[job.pk])),
                    "page_url": request.build_absolute_uri(job_page_url(job)),
                }
            },
        )

    @staticmethod
    def _validated(serializer_class: type[BaseSerializer], request: Request) -> dict[str, Any]:
        serializer = serializer_class(data=request.data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data


class StageRunViewSet(ThrottleRefusalsMixin, viewsets.ReadOnlyModelViewSet):
    """Every attempt of every stage; the detail has the whole result and the log excerpt."""

    queryset = StageRun.objects.all()
    permission_classes = [ActionPermission]
    filterset_class = filters.StageRunFilter
    filter_backends = [*viewsets.ReadOnlyModelViewSet.filter_backends, filters.StableOrderingFilter]
    ordering_fields = ["id", "queued_at", "started_at", "finished_at", "position", "attempt"]
    ordering = ["-id"]

    def get_queryset(self) -> QuerySet[StageRun]:
        runs = stage_runs_with_jobs()
        return runs.defer(None) if self.action == "retrieve" else runs

    def get_serializer_class(self) -> type[BaseSerializer]:
        if self.action == "retrieve":
            return serializers.StageRunDetailOutput
        return serializers.StageRunOutput


class PoolViewSet(ThrottleRefusalsMixin, viewsets.ReadOnlyModelViewSet):
    """Accelerator pools with their workers (live, stale, stopped), devices and queue."""

    queryset = AcceleratorPool.objects.all()
    permission_classes = [ActionPermission]
    serializer_class = serializers.PoolOutput
    filterset_class = filters.PoolFilter
    filter_backends = [*viewsets.ReadOnlyModelViewSet.filter_backends, filters.StableOrderingFilter]
    ordering_fields = ["name", "id"]
    ordering = ["name"]

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """A page of pools, their inventories read together: the same few queries for two
        pools or fifty."""
        pools = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        self._inventories = self._read_inventories(list(pools or []))
        return self.get_paginated_response(self.get_serializer(pools, many=True).data)

    @staticmethod
    def _read_inventories(pools: list[AcceleratorPool]) -> dict[int, inventory.PoolInventory]:
        """`pools`' inventories by pool id, with the workers and the catalog read once."""
        try:
            catalog = AcceleratorKind.objects.catalog()
        except CatalogError:
            catalog = None  # each pool then shows the error
        inventories = inventory.pool_inventories(
            pools=pools,
            layout_of=pool_layout,
            now=timezone.now(),
            workers=list(Worker.objects.all()),
            catalog=catalog,
        )
        return {item.pool.pk: item for item in inventories}

    def get_serializer_context(self) -> dict[str, Any]:
        """An `inventory_of(pool)`: from those `list` read together, else read for the one
        pool asked for."""
        context = super().get_serializer_context()
        made: dict[int, inventory.PoolInventory] = getattr(self, "_inventories", {})

        def inventory_of(pool: AcceleratorPool) -> inventory.PoolInventory:
            if pool.pk not in made:
                made.update(self._read_inventories([pool]))
            return made[pool.pk]

        context["inventory_of"] = inventory_of
        return context


class WebhookEndpointViewSet(
    ThrottleRefusalsMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Inbound webhook endpoints: the admin's (reading them needs `view_webhookendpoint`,
    which only the admin role holds; creating `add_`, deleting `delete_`). Secrets are shown
    once, in the creation's answer. An endpoint that has received deliveries is not deleted
    (409): its deliveries are its log; disable it instead."""

    queryset = WebhookEndpoint.objects.select_related("pool", "created_by")
    permission_classes = [ActionPermission]
    action_permissions = {
        "create": "adaptation.add_webhookendpoint",
        "destroy": "adaptation.delete_webhookendpoint",
    }
    filterset_class = filters.WebhookEndpointFilter
    filter_backends = [*viewsets.GenericViewSet.filter_backends, filters.StableOrderingFilter]
    ordering_fields = ["name", "created_at", "last_delivery_at"]
    ordering = ["name"]

    def get_serializer_class(self) -> type[BaseSerializer]:
        if self.action == "create":
            return serializers.WebhookEndpointCreateInput
        return serializers.WebhookEndpointOutput

    @extend_schema(
        request=serializers.WebhookEndpointCreateInput,
        responses={201: serializers.WebhookEndpointCreatedOutput},
        summary="Create a webhook endpoint (its secret is in this answer only)",
    )
    def create(self, request: Request) -> Response:
        """Create an endpoint; the answer carries its URL path and its secret, which is not
        stored in the clear and cannot be shown again. Needs `add_webhookendpoint`."""
        serializer = serializers.WebhookEndpointCreateInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            endpoint, secret = webhook_endpoint_create(
                name=data["name"],
                kind=data["kind"],
                pool=data.get("pool"),
                quiet_period_s=data.get("quiet_period_s"),
                created_by=request.user,
            )
        except EndpointError as exc:
            raise ServiceError(str(exc)) from exc
        output = serializers.WebhookEndpointCreatedOutput(endpoint, context={"secret": secret})
        return Response(output.data, status=status.HTTP_201_CREATED)

    @extend_schema(
        responses={
            204: None,
            409: OpenApiResponse(
                description="The endpoint has received deliveries: disable it instead."
            ),
        },
        summary="Delete a webhook endpoint that never received a delivery",
    )
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Delete an endpoint that has received no delivery (one made by mistake). One that
        has keeps them as its log (`on_delete=PROTECT`): 409, disable it instead (in the
        admin: it then answers 404). Needs `delete_webhookendpoint`."""
        endpoint = self.get_object()
        refusal = Conflict(
            f"Endpoint {endpoint.name!r} has received deliveries, which are kept as its log: "
            "disable it instead (uncheck Enabled in the admin), and it answers 404."
        )
        # Asked first: the delete's own refusal would load every delivery that protects it.
        if endpoint.deliveries.exists() or endpoint.pending_uploads.exists():
            raise refusal
        try:
            endpoint.delete()
        except ProtectedError as exc:  # a delivery arrived meanwhile
            raise refusal from exc
        return Response(status=status.HTTP_204_NO_CONTENT)


class SuiteRunViewSet(
    ThrottleRefusalsMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Runs of a suite of reference releases on a pool (docs/suite.md): list (`?pool=`,
    `?suite=`), detail with the matrix, and start one."""

    queryset = SuiteRun.objects.all()
    permission_classes = [ActionPermission]
    action_permissions = {"create": TRIGGER_JOB}
    filterset_class = filters.SuiteRunFilter
    filter_backends = [*viewsets.GenericViewSet.filter_backends, filters.StableOrderingFilter]
    ordering_fields = ["created_at", "id"]
    ordering = ["-created_at", "-id"]

    def get_queryset(self) -> QuerySet[SuiteRun]:
        return suite_runs().prefetch_related(
            Prefetch("jobs", queryset=AdaptationJob.objects.select_related("release"))
        )

    def get_serializer_class(self) -> type[BaseSerializer]:
        if self.action == "create":
            return serializers.SuiteRunCreateInput
        if self.action == "retrieve":
            return serializers.SuiteRunDetailOutput
        return serializers.SuiteRunOutput

    @extend_schema(summary="List suite runs, newest first")
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Suite runs, newest first, each with its jobs; `?pool=`, `?suite=` and
        `?trigger=` narrow it."""
        return super().list(request, *args, **kwargs)

    @extend_schema(summary="A suite run with its matrix")
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """A suite run with its matrix: a row per entry (family shapes, release, job), a cell
        per stage with its state and how it compares with the previous run."""
        run = self.get_object()
        jobs = suite_run_jobs(run)
        previous_jobs = suite_run_jobs(run.previous)
        matrix = suite_matrix(
            run=run,
            jobs=jobs,
            previous_jobs=previous_jobs,
            suite=suite_definition_or_none(run.suite),
            earlier_jobs=suite_run_lookback_jobs(run=run, jobs=jobs, previous_jobs=previous_jobs),
        )
        output = serializers.SuiteRunDetailOutput(run, context={"matrix": matrix})
        return Response(output.data)

    @extend_schema(
        request=serializers.SuiteRunCreateInput,
        responses={201: serializers.SuiteRunOutput, 202: serializers.SuiteRunOutput},
        summary="Run a suite on a pool",
    )
    def create(self, request: Request) -> Response:
        """Start a run of a suite (default "standard") on a pool (required): trigger "api",
        one job per reference release, linked to the previous run of the suite on the pool.
        201, or 202 when the broker could not take the jobs' first stages (saved; day0 sends
        them when it is back). 400 naming the field for a missing pool, an unknown or
        disabled one, an unknown suite or stage. Needs `trigger_job`."""
        serializer = serializers.SuiteRunCreateInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        run = suite_start(
            pool=data["pool"],
            trigger=SuiteTrigger.API,
            suite=data["suite"],
            requested_by=request.user,
            stages=data.get("stages"),
        )
        run = self.get_queryset().get(pk=run.pk)
        sent = not any(unsent_stage_runs(job) for job in run.jobs.all())
        return Response(
            serializers.SuiteRunOutput(run).data,
            status=status.HTTP_201_CREATED if sent else status.HTTP_202_ACCEPTED,
        )


class PlanViewSet(ThrottleRefusalsMixin, viewsets.GenericViewSet):
    """Plans computed on request, as `manage.py plan` computes them: nothing is stored."""

    permission_classes = [ActionPermission]
    # A plan reads and computes, it starts nothing: whoever reads the API may ask for one.
    action_permissions = {"create": READ_API}
    serializer_class = plan_serializers.PlanCreateInput

    @extend_schema(
        request=plan_serializers.PlanCreateInput,
        responses={200: plan_serializers.PlanOutput},
        summary="Plan a release or a config on a pool, and predict a workload on the plan",
    )
    def create(self, request: Request) -> Response:
        """The plan of a release (its newest analysis) or a config on a pool or on N devices
        of a catalog kind: the split with the fewest devices that fits, or the `split` given,
        with memory per device, predicted decode and launch commands; with `input_len` and
        `output_len`, the workload's prediction on that split (`workload`). 200 also when
        nothing fits: the plan is then `{"fits": false, "reason", "suggestions", ...}` and
        `workload` null. 400 under the field for a bad value. Needs a role."""
        serializer = plan_serializers.PlanCreateInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        inputs = data["inputs"]
        try:
            plan, workload = plan_and_workload(
                data["analysis"],
                data["layout"],
                data["catalog"],
                inputs,
                release=data["release_name"],
                pool=data.get("pool"),
            )
        except NoFittingPlan as exc:
            options = {
                "context_tokens": inputs.context_tokens,
                "concurrency": inputs.concurrency,
                "dtype": inputs.dtype,
            }
            plan = no_fit_result(
                exc,
                data["analysis"],
                data["layout"],
                data["catalog"],
                options,
                release=data["release_name"],
            )
            if inputs.split is not None:
                plan["split"] = inputs.split.label()
            workload = None
        except PlanRequestError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from exc
        except (PlanInputError, CatalogError) as exc:
            raise ValidationError({"non_field_errors": [str(exc)]}) from exc
        plan["note"] = data["note"]
        plan["analysis_note"] = data["analysis_note"]
        return Response(plan_serializers.PlanOutput({"plan": plan, "workload": workload}).data)

"""django-filter FilterSets of the API's lists, and their ordering; each list also takes
`ordering` over its view's `ordering_fields` (and releases `search`), see the views.

A filter given blank (`?since=`, `?status=`) is a 400 unless it takes free text: django-filter
would read it as no filter at all, while the schema says a time, an id, a choice or a
boolean."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import django_filters as filters
from django import forms
from django.core.exceptions import ImproperlyConfigured
from django.db.models import QuerySet
from django_filters.fields import IsoDateTimeField
from drf_spectacular.utils import extend_schema_field
from rest_framework.exceptions import ValidationError
from rest_framework.filters import OrderingFilter

from adaptation.models import (
    AcceleratorPool,
    AdaptationJob,
    HubKind,
    JobStatus,
    ModelRelease,
    StageRun,
    StageStatus,
    SuiteRun,
    SuiteTrigger,
    Trigger,
    WebhookEndpoint,
    WebhookKind,
)


class StableOrderingFilter(OrderingFilter):
    """`?ordering=field,-other` over the view's `ordering_fields` (an explicit list, never
    "__all__"), with the row id added last so that rows equal on the chosen fields keep one
    order from page to page.

    DRF's `OrderingFilter` drops fields it does not know and silently falls back to the
    default order; here an unknown field is a 400 naming the allowed ones, and the schema
    lists them (an enum)."""

    @staticmethod
    def allowed_fields(view: Any) -> list[str]:
        """The view's `ordering_fields`. Raises `ImproperlyConfigured` unless it is a list
        of field names."""
        fields = getattr(view, "ordering_fields", None)
        if not isinstance(fields, list | tuple) or not all(
            isinstance(f, str) and f != "__all__" for f in fields
        ):
            raise ImproperlyConfigured(
                f"{type(view).__name__}.ordering_fields must list the fields to order by."
            )
        return list(fields)

    def get_ordering(self, request, queryset, view) -> list[str] | None:
        params = request.query_params.get(self.ordering_param)
        terms = [term.strip() for term in (params or "").split(",") if term.strip()]
        if not terms:
            ordering = self.get_default_ordering(view)
        else:
            allowed = self.allowed_fields(view)
            unknown = [t for t in terms if (t[1:] if t.startswith("-") else t) not in allowed]
            if unknown:
                raise ValidationError(
                    {
                        self.ordering_param: [
                            f"Cannot order by {', '.join(map(repr, unknown))}; order by "
                            f"{', '.join(allowed)} (a leading - for descending)."
                        ]
                    }
                )
            ordering = terms
        if ordering and not any(f.lstrip("-") in ("id", "pk") for f in ordering):
            ordering = [*ordering, "-id"]
        return ordering

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        """`ordering` as a comma-separated list of the allowed fields, each optionally with
        a leading "-"."""
        allowed = self.allowed_fields(view)
        return [
            {
                "name": self.ordering_param,
                "required": False,
                "in": "query",
                "description": "Order by these fields, comma-separated; a leading - for "
                "descending.",
                "schema": {
                    "type": "array",
                    "items": {
                        "type": "string",
                        "enum": [term for f in allowed for term in (f, f"-{f}")],
                    },
                },
                "style": "form",
                "explode": False,
            }
        ]


# Row ids are positive 64-bit integers; anything else is a 400, not a database error.
ID_MAX = 2**63 - 1


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": ID_MAX})
class IdFilter(filters.Filter):
    """A row id: a whole number from 1 to `ID_MAX`."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", ID_MAX)
        super().__init__(*args, **kwargs)


class UtcIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 time, in UTC: PostgreSQL refuses some offsets Python reads (+23:56)."""

    def to_python(self, value: object) -> datetime | None:
        parsed = super().to_python(value)
        if parsed is None:
            return None
        try:
            return parsed.astimezone(UTC)
        except OverflowError:  # year 1 ahead of UTC, or year 9999 behind it
            raise forms.ValidationError("Out of range.", code="invalid") from None


class SinceFilter(filters.IsoDateTimeFilter):
    """At or after an ISO 8601 time (`field_name` >= it)."""

    field_class = UtcIsoDateTimeField

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("lookup_expr", "gte")
        super().__init__(*args, **kwargs)


class FilterSet(filters.FilterSet):
    """django-filter's FilterSet, refusing a blank value for a filter that takes no free
    text (`BLANK_MESSAGE` on the parameter)."""

    BLANK_MESSAGE = "Give a value, or leave the parameter out."

    def is_valid(self) -> bool:
        valid = super().is_valid()
        for name, definition in self.filters.items():
            value = self.data.get(name)
            if isinstance(definition, filters.CharFilter) or value is None or value.strip():
                continue
            self.form.add_error(name, forms.ValidationError(self.BLANK_MESSAGE, code="blank"))
            valid = False
        return valid


class ReleaseFilter(FilterSet):
    """Releases by org, the status of their newest job, discovery time, hub and family."""

    org = filters.CharFilter(
        method="filter_org",
        label='Org or user: repo ids starting with "<org>/" (ignoring case).',
    )
    status = filters.ChoiceFilter(
        field_name="latest_job_status",
        choices=JobStatus.choices,
        label="Status of the release's newest job.",
    )
    since = SinceFilter(
        field_name="discovered_at", label="Discovered at or after this ISO 8601 time."
    )
    hub = filters.ChoiceFilter(field_name="hub_kind", choices=HubKind.choices, label="Hub kind.")
    family = filters.CharFilter(field_name="family", label='Model family, e.g. "llama".')
    architecture = filters.CharFilter(field_name="architecture", label="Architecture class.")

    class Meta:
        model = ModelRelease
        fields = ["org", "status", "since", "hub", "family", "architecture"]

    def filter_org(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        """Repo ids under `value`, ignoring case as the Hub and the watches do."""
        return queryset.filter(repo_id__istartswith=f"{value.strip('/')}/")


class JobFilter(FilterSet):
    """Jobs by status, pool (name), release (id), trigger and creation time."""

    status = filters.ChoiceFilter(choices=JobStatus.choices, label="Job status.")
    pool = filters.CharFilter(field_name="pool__name", label="Pool name.")
    release = IdFilter(field_name="release_id", label="Release id.")
    trigger = filters.ChoiceFilter(choices=Trigger.choices, label="What started the job.")
    created_since = SinceFilter(
        field_name="created_at", label="Created at or after this ISO 8601 time."
    )

    class Meta:
        model = AdaptationJob
        fields = ["status", "pool", "release", "trigger", "created_since"]


class StageRunFilter(FilterSet):
    """Stage runs (every attempt) by job, stage name, status and pool."""

    job = IdFilter(field_name="job_id", label="Job id.")
    stage = filters.CharFilter(field_name="stage", label='Stage name, e.g. "plan".')
    status = filters.ChoiceFilter(choices=StageStatus.choices, label="Stage run status.")
    pool = filters.CharFilter(field_name="job__pool__name", label="Pool name.")

    class Meta:
        model = StageRun
        fields = ["job", "stage", "status", "pool"]


class PoolFilter(FilterSet):
    """Pools by whether they are enabled and by backend."""

    enabled = filters.BooleanFilter(label="Enabled pools only (true) or disabled ones (false).")
    backend = filters.CharFilter(label='Torch backend, "cpu", "cuda", ... or "manifest".')

    class Meta:
        model = AcceleratorPool
        fields = ["enabled", "backend"]


class WebhookEndpointFilter(FilterSet):
    """Webhook endpoints by kind and whether they are enabled."""

    kind = filters.ChoiceFilter(choices=WebhookKind.choices, label="Delivery format.")
    enabled = filters.BooleanFilter(label="Enabled endpoints only (true) or not (false).")

    class Meta:
        model = WebhookEndpoint
        fields = ["kind", "enabled"]


class SuiteRunFilter(FilterSet):
    """Suite runs by pool (name), suite and what started them."""

    pool = filters.CharFilter(field_name="pool__name", label="Pool name.")
    suite = filters.CharFilter(field_name="suite", label='Suite name, e.g. "standard".')
    trigger = filters.ChoiceFilter(choices=SuiteTrigger.choices, label="What started the run.")

    class Meta:
        model = SuiteRun
        fields = ["pool", "suite", "trigger"]

"""Reads of hub watches."""

from __future__ import annotations

from django.db.models import (
    QuerySet,
)

from adaptation.models import (
    HubWatch,
)


def watches_with_errors() -> QuerySet[HubWatch]:
    """Enabled watches whose last poll failed."""
    return HubWatch.objects.filter(enabled=True).exclude(last_error="")

"""Which accelerator pool a job runs on."""

from __future__ import annotations

from django.conf import settings

from adaptation.models import (
    AcceleratorPool,
)
from adaptation.services.errors import ServiceError


def pool_get(*, name: str | None = None) -> AcceleratorPool:
    """The enabled pool called `name` (default: `DAY0_DEFAULT_POOL`).

    Raises `ServiceError` naming the known pools when there is none.
    """
    name = name or settings.DAY0_DEFAULT_POOL
    try:
        return AcceleratorPool.objects.get(name=name, enabled=True)
    except AcceleratorPool.DoesNotExist:
        known = ", ".join(
            AcceleratorPool.objects.filter(enabled=True).values_list("name", flat=True)
        )
        raise ServiceError(f"No enabled pool {name!r}; enabled pools: {known or 'none'}.") from None

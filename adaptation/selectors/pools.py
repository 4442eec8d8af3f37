"""Reads of accelerator pools by name and state (a pool's live inventory, its workers and
queue, is `selectors.inventory`)."""

from __future__ import annotations

from django.db.models import QuerySet

from adaptation.models import AcceleratorPool


def pools_enabled() -> QuerySet[AcceleratorPool]:
    """The enabled pools, by name."""
    return AcceleratorPool.objects.filter(enabled=True).order_by("name")


def pool_by_name(name: str) -> AcceleratorPool | None:
    """The pool called `name`, or None."""
    return AcceleratorPool.objects.filter(name=name).first()

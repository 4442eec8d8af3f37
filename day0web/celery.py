"""The Celery app. Workers start with `celery -A day0web worker -Q pool.<name>`."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "day0web.settings")

app = Celery("day0web")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"])

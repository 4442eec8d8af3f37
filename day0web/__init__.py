"""day0's Django project. The Celery app loads with it (Celery's Django pattern: tasks bind to
it), except in an engine-only command (`manage.py analyze`), which sends no task: manage.py
marks those with DAY0_ENGINE_ONLY=1, sparing them Celery's imports (about a quarter second)."""

import os

if os.environ.get("DAY0_ENGINE_ONLY") != "1":
    from day0web.celery import app as celery_app

    __all__ = ("celery_app",)

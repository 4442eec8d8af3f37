"""The Celery tasks the app sends messages to, looked up by name.

`workers/` (the Celery side) imports the app to load rows and store results; the app sends
to the tasks by their registered names, so it never imports `workers/` back. The names are
those of `workers.tasks`. In a process that is not a worker (the web server, `manage.py`
commands, beat), the task modules `day0web.celery` autodiscovers are imported on the first
lookup (Celery imports them only when a worker starts).
"""

from __future__ import annotations

from celery import Task, current_app

RUN_STAGE = "day0.run_stage"
SETTLE_UPLOAD = "day0.settle_upload"
DELIVER_NOTIFICATION = "day0.deliver_notification"


def worker_task(name: str) -> Task:
    """The registered task called `name` on the current Celery app (`day0web.celery.app`).
    Raises `KeyError` for a name no task module registers."""
    if name not in current_app.tasks:
        # Autodiscovered modules load with the worker; anywhere else, load them now.
        current_app.loader.import_default_modules()
    return current_app.tasks[name]

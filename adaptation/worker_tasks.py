"""The Celery tasks the app sends messages to, looked up by name.

`workers/` (the Celery side) imports the app to load rows and store results; the app sends
to the tasks by their registered names, so it never imports `workers/` back. The names are
those of `workers.tasks`; an unknown name raises `KeyError` (the worker side was not loaded:
`day0web.celery` autodiscovers it).
"""

from __future__ import annotations

from celery import Task, current_app

RUN_STAGE = "day0.run_stage"
SETTLE_UPLOAD = "day0.settle_upload"
DELIVER_NOTIFICATION = "day0.deliver_notification"


def worker_task(name: str) -> Task:
    """The registered task called `name` on the current Celery app (`day0web.celery.app`)."""
    return current_app.tasks[name]

"""The app reaches the worker's tasks by name from any process, not only a worker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A fresh process, as `manage.py adapt`, the web server or beat are: nothing has imported
# `workers.tasks` (the test session itself has, through its fixtures).
SCRIPT = """
import django, os, sys
os.environ["DJANGO_SETTINGS_MODULE"] = "day0web.settings"
django.setup()
assert "workers.tasks" not in sys.modules
from adaptation.worker_tasks import DELIVER_NOTIFICATION, RUN_STAGE, SETTLE_UPLOAD, worker_task
print(",".join(worker_task(name).name for name in (RUN_STAGE, SETTLE_UPLOAD, DELIVER_NOTIFICATION)))
"""


def test_a_process_that_is_not_a_worker_finds_the_tasks():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "day0.run_stage,day0.settle_upload,day0.deliver_notification"

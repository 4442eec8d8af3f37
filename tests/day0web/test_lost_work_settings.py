"""The knobs of lost work (day0web/lost_work.py), checked together at start-up: the heartbeat,
the stale threshold, the reaper's period, the 60 s resume bound and the broker's visibility
timeout against the longest stage hard time limit."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from day0web.lost_work import (
    default_visibility_timeout_s,
    longest_stage_time_limit_s,
    lost_work_check,
    lost_work_problems,
)
from engine.registry import STAGES

pytestmark = pytest.mark.django_db(False)

DEFAULTS = {
    "heartbeat_every_s": 5,
    "stale_heartbeat_s": 30,
    "reap_every_s": 10,
    "resume_within_s": 60,
    "visibility_timeout_s": 3060,
    "longest_time_limit_s": 2760,
}


def test_the_defaults_agree():
    assert lost_work_problems(**DEFAULTS) == []
    lost_work_check(**DEFAULTS)


def test_the_default_visibility_timeout_outlasts_the_longest_stage():
    longest = max(stage.time_limit_s for stage in STAGES)
    # the serve stage's: the twin's 1,560 s and the full-size run's default budget of 1,200 s
    assert longest_stage_time_limit_s() == longest == 2760
    assert default_visibility_timeout_s() == 3060


def test_a_stale_threshold_within_two_heartbeats_is_refused():
    assert lost_work_problems(**{**DEFAULTS, "heartbeat_every_s": 15}) == [
        "DAY0_STALE_HEARTBEAT_S=30 must exceed 2 x DAY0_HEARTBEAT_EVERY_S=15: a live stage "
        "would look lost after one late heartbeat."
    ]


def test_lost_work_waiting_past_the_resume_bound_is_refused_unless_raised():
    slow = {**DEFAULTS, "stale_heartbeat_s": 300}
    assert lost_work_problems(**slow) == [
        "DAY0_STALE_HEARTBEAT_S=300 + DAY0_REAP_EVERY_S=10 is 310 s, longer than "
        "DAY0_RESUME_WITHIN_S=60: lost work would wait that long (lower them, or raise "
        "DAY0_RESUME_WITHIN_S to accept slower resumes)."
    ]
    assert lost_work_problems(**{**slow, "resume_within_s": 310}) == []
    assert lost_work_problems(**{**DEFAULTS, "stale_heartbeat_s": 50, "reap_every_s": 11}) != []


def test_a_visibility_timeout_below_the_longest_stage_is_refused():
    assert lost_work_problems(**{**DEFAULTS, "visibility_timeout_s": 3599 // 3}) == [
        "DAY0_VISIBILITY_TIMEOUT_S=1199 is below the longest stage hard time limit (2760 s): "
        "the broker would hand a live stage's message to a second worker."
    ]
    assert lost_work_problems(**{**DEFAULTS, "visibility_timeout_s": 2760}) == []


def test_the_check_names_every_problem():
    with pytest.raises(ImproperlyConfigured) as refused:
        lost_work_check(**{**DEFAULTS, "heartbeat_every_s": 20, "visibility_timeout_s": 60})
    assert "DAY0_HEARTBEAT_EVERY_S=20" in str(refused.value)
    assert "DAY0_VISIBILITY_TIMEOUT_S=60" in str(refused.value)


def settings_of(tmp_path, code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "day0web.settings",
        "DAY0_VAR_DIR": str(tmp_path),
        **env,
    }
    setup = "import django; django.setup(); from django.conf import settings"
    return subprocess.run(
        [sys.executable, "-c", f"{setup}; {code}"],
        env=environ, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_settings_refuse_a_slow_configuration_at_start(tmp_path):
    done = settings_of(
        tmp_path, "print(settings.DAY0_STALE_HEARTBEAT_S)", DAY0_STALE_HEARTBEAT_S="300"
    )
    assert done.returncode != 0
    assert "ImproperlyConfigured: DAY0_STALE_HEARTBEAT_S=300 + DAY0_REAP_EVERY_S=10" in done.stderr


def test_settings_give_redis_the_visibility_timeout_and_beat_the_reaper_period(tmp_path):
    code = (
        "print(settings.CELERY_BROKER_TRANSPORT_OPTIONS, "
        "settings.CELERY_BEAT_SCHEDULE['reap-stale-stage-runs']['schedule'], "
        "settings.DAY0_HEARTBEAT_EVERY_S, settings.DAY0_STALE_HEARTBEAT_S, "
        "settings.DAY0_STAGE_MAX_ATTEMPTS)"
    )
    done = settings_of(tmp_path, code, CELERY_BROKER_URL="redis://127.0.0.1:6379/15")
    assert done.stdout.strip() == "{'visibility_timeout': 3060} 10.0 5 30 3", done.stderr
    done = settings_of(
        tmp_path,
        code,
        CELERY_BROKER_URL="redis://127.0.0.1:6379/15",
        DAY0_VISIBILITY_TIMEOUT_S="7200",
        DAY0_REAP_EVERY_S="5",
    )
    assert done.stdout.strip() == "{'visibility_timeout': 7200} 5.0 5 30 3", done.stderr

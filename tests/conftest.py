"""Fixtures shared by the whole suite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.hubs.kinds import HUB_KIND_SPECS
from tests.fakehub import fake_hub  # noqa: F401  (the local Hub fixture, for every test)

DATA_DIR = Path(__file__).parent / "data"
REALCONFIGS_DIR = DATA_DIR / "realconfigs"


def load_realconfig(name: str) -> dict:
    """A real published config.json from tests/data/realconfigs (file name without .json)."""
    return json.loads((REALCONFIGS_DIR / f"{name}.json").read_text())


@pytest.fixture
def staff_user(django_user_model):
    return django_user_model.objects.create_user(
        username="ada", password="correct horse battery", is_staff=True, is_superuser=True
    )


@pytest.fixture
def logged_in_client(client, staff_user):
    client.force_login(staff_user)
    return client


@pytest.fixture(autouse=True)
def isolated_hf_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """No real endpoint, token or cache leaks in: each test gets its own download cache, and
    no hub kind's endpoint or token variable (`engine.hubs.kinds`) is set."""
    hub_variables = {v for s in HUB_KIND_SPECS for v in (s.endpoint_variable, s.token_variable)}
    for name in [*sorted(hub_variables - {""}), "HF_HUB_OFFLINE", "HF_HOME"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))


@pytest.fixture(autouse=True)
def mirror_roots_with_tmp(settings, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Mirror watches may read the test run's temporary folders (`tmp_path`), besides the
    configured roots (`DAY0_MIRROR_ROOTS`)."""
    settings.DAY0_MIRROR_ROOTS = [
        *settings.DAY0_MIRROR_ROOTS,
        str(tmp_path_factory.getbasetemp()),
    ]


# Short performance and stability runs for tests that run whole jobs on real workers (the
# defaults, a 64-batch sweep over two prompt lengths and a 20 s stability run, are `make run`'s).
# The stability steps are small, so 3 s still give the leak fit many steps. Their drift is not
# judged (a limit of +1000%): steps of about 50 ms of CPU time on a shared 2-core host drift
# +50% whenever a neighbour starts beside the last quarter (seen: +54% with another pytest
# running). These tests are about whole jobs going through; the drift verdict has its own
# tests, with a deliberate slowdown (tests/engine/stages/stability/test_stability.py).
QUICK_MEASUREMENTS = {
    "performance": {"max_batch_size": 4, "prompt_lens": [16], "repeats": 3, "prefill_repeats": 1},
    "stability": {
        "duration_s": 3,
        "batch_size": 2,
        "prompt_len": 16,
        "decode_steps": 4,
        "max_step_time_drift": 10.0,
    },
}


@pytest.fixture
def quick_measurements(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Jobs created during the test, polled ones included, get `QUICK_MEASUREMENTS` as their
    performance and stability options (a job's own options for a stage win). Returns them."""
    from adaptation.services import releases
    from adaptation.services.jobs import job_create

    create = job_create

    def job_create(*, options=None, stages=None, **kwargs):
        quick = {k: v for k, v in QUICK_MEASUREMENTS.items() if stages is None or k in stages}
        return create(options={**quick, **(options or {})}, stages=stages, **kwargs)

    monkeypatch.setattr(releases, "job_create", job_create)
    return QUICK_MEASUREMENTS


@pytest.fixture
def fetch_analyze_readiness(settings) -> dict[str, list[str]]:
    """Readiness levels a two-stage job (fetch, analyze) can reach, for tests of the Day-0
    clock and reports built on such jobs: under the default levels a job that does not run
    plan, operators, precision... never gets past `none`."""
    settings.DAY0_READINESS = {
        "experimental": ["fetch", "analyze"],
        "functional": [],
        "complete": [],
    }
    return settings.DAY0_READINESS

"""Starting a suite run: `manage.py suite run|list`, the pools page's button and the API, each
with its permissions and refusals."""

from __future__ import annotations

import io
import json
import logging

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.urls import reverse

from adaptation.models import AdaptationJob, StageStatus, SuiteRun, SuiteTrigger
from adaptation.services.suites import suite_start
from engine.suites import suite_load
from tests.factories import cpu_pool

pytestmark = pytest.mark.django_db

ENTRIES = len(suite_load("standard").entries)


def test_suite_run_command_starts_one_job_per_entry():
    cpu_pool()
    out = io.StringIO()
    call_command("suite", "run", "--pool", "cpu", "--stages", "analyze", "fetch", stdout=out)
    run = SuiteRun.objects.get()
    assert run.trigger == SuiteTrigger.MANUAL and run.pool.name == "cpu"
    text = out.getvalue()
    assert text.startswith(f"Suite run {run.pk}: standard on pool cpu (queue pool.cpu), ")
    assert f"{ENTRIES} jobs" in text
    assert f"Matrix: {settings.DAY0_PUBLIC_URL}/suite-runs/{run.pk}/" in text
    jobs = AdaptationJob.objects.filter(suite_run=run)
    assert jobs.count() == ENTRIES
    for job in jobs:
        assert job.stages == ["fetch", "analyze"]  # registry order
        assert job.stage_runs.get(stage="fetch").status == StageStatus.QUEUED
        assert f"job {job.pk}" in text

    out = io.StringIO()
    call_command("suite", "run", "--stages", "fetch", "--format", "json", stdout=out)
    second = json.loads(out.getvalue())
    assert second["previous"] == run.pk and second["pool"] == "cpu"
    assert len(second["jobs"]) == ENTRIES


def test_suite_run_command_refusals():
    cpu_pool()
    with pytest.raises(CommandError, match="No enabled pool 'tpu'"):
        call_command("suite", "run", "--pool", "tpu")
    with pytest.raises(CommandError, match="No suite 'nightly'"):
        call_command("suite", "run", "--suite", "nightly")
    with pytest.raises(CommandError, match="Unknown stage 'warp'"):
        call_command("suite", "run", "--stages", "warp")
    assert not SuiteRun.objects.exists()


def test_suite_list_command():
    """People read the shapes in the pages' words under a header line; `--format json` keeps
    the slugs for machines."""
    out = io.StringIO()
    call_command("suite", "list", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == f"standard: Standard adaptation suite ({ENTRIES} entries)"
    assert lines[1].split() == ["entry", "family", "shapes", "folder"]
    assert len(lines) == 2 + ENTRIES
    kimi = next(line for line in lines if line.strip().startswith("mla-moe-kimi "))
    assert "MLA + MoE, quantized checkpoint" in kimi and "mla-moe," not in kimi
    llama = next(line for line in lines if line.strip().startswith("dense-gqa-llama "))
    assert llama.split()[1:4] == ["dense", "GQA", "demo/hub/meta-llama/Llama-3.1-8B"]
    # Columns line up under the header.
    assert lines[1].index("family shapes") == kimi.index("MLA + MoE")
    assert lines[1].index("folder") == kimi.index("demo/hub/moonshotai/Kimi-K2-Instruct")
    assert any(
        "hybrid-linear-attention" in line and "demo/suite/Qwen/Qwen3-Next-80B-A3B-Instruct" in line
        for line in lines
    )

    out = io.StringIO()
    call_command("suite", "list", "--format", "json", stdout=out)
    [standard] = json.loads(out.getvalue())
    assert standard["name"] == "standard" and len(standard["entries"]) == ENTRIES
    kimi = next(e for e in standard["entries"] if e["name"] == "mla-moe-kimi")
    assert kimi == {
        "name": "mla-moe-kimi",
        "shapes": ["mla-moe", "quantized"],
        "folder": "demo/hub/moonshotai/Kimi-K2-Instruct",
    }


def test_suite_run_command_does_not_echo_the_services_info_log(caplog):
    """The service's "Suite standard run N on cpu (manual): 7 jobs" line is what the
    command prints itself: it reaches the log (stderr) only with -v 2."""
    cpu_pool()
    caplog.set_level(logging.INFO)
    out = io.StringIO()
    call_command("suite", "run", "--pool", "cpu", "--stages", "fetch", stdout=out)
    assert out.getvalue().startswith("Suite run ")
    assert not [r for r in caplog.records if r.name.startswith("adaptation")]
    # The level is put back: the service logs as before outside the command.
    assert logging.getLogger("adaptation.services.suites").isEnabledFor(logging.INFO)

    call_command("suite", "-v", "2", "run", "--pool", "cpu", "--stages", "fetch", stdout=out)
    [line] = [r.getMessage() for r in caplog.records if r.name == "adaptation.services.suites"]
    assert line.startswith("Suite standard run ") and line.endswith(f"(manual): {ENTRIES} jobs")


def test_pools_page_button_for_engineers_only(client, cast):
    cpu_pool()
    client.force_login(cast.mona)
    page = client.get(reverse("adaptation:pool_list")).content.decode()
    assert 'href="/pools/cpu/suites/standard/"' in page
    assert 'id="suite-run-cpu"' not in page
    assert client.post(reverse("adaptation:suite_run_start", args=["cpu"])).status_code == 403

    client.force_login(cast.eli)
    page = client.get(reverse("adaptation:pool_list")).content.decode()
    assert 'id="suite-run-cpu"' in page and 'name="csrfmiddlewaretoken"' in page
    assert client.get(reverse("adaptation:suite_run_start", args=["cpu"])).status_code == 405
    response = client.post(reverse("adaptation:suite_run_start", args=["cpu"]))
    run = SuiteRun.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("adaptation:suite_run", args=[run.pk])
    assert run.requested_by == cast.eli and run.trigger == SuiteTrigger.MANUAL
    assert run.jobs.count() == ENTRIES


def test_the_button_refuses_a_disabled_pool_with_its_reason(client, cast):
    pool = cpu_pool()
    pool.enabled = False
    pool.save(update_fields=["enabled"])
    client.force_login(cast.eli)
    response = client.post(reverse("adaptation:suite_run_start", args=["cpu"]), follow=True)
    assert response.redirect_chain[-1][0] == reverse("adaptation:pool_list")
    assert "Pool &#x27;cpu&#x27; is disabled" in response.content.decode()
    assert not SuiteRun.objects.exists()


def test_api_starts_and_lists_suite_runs(cast):
    cpu_pool()
    url = reverse("api:suite-run-list")
    assert cast.api(None).post(url, {}, format="json").status_code == 401
    assert cast.api("nina").get(url).status_code == 403
    assert cast.api("mona").post(url, {"pool": "cpu"}, format="json").status_code == 403

    # Inside the test's transaction the broker is not reached yet: 201, nothing unsent.
    response = cast.api("eli").post(url, {"pool": "cpu", "stages": ["fetch"]}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    run = SuiteRun.objects.get()
    assert body["id"] == run.pk and body["trigger"] == "api" and body["requested_by"] == "eli"
    assert body["previous"] is None and body["suite"] == "standard" and body["pool"] == "cpu"
    assert len(body["jobs"]) == ENTRIES
    entries = {entry.name for entry in suite_load("standard").entries}
    assert {job["entry"] for job in body["jobs"]} == entries
    assert body["page_url"].endswith(f"/suite-runs/{run.pk}/")

    second = suite_start(pool=run.pool, trigger=SuiteTrigger.MANUAL, stages=["fetch"])
    listed = cast.api("mona").get(url, {"pool": "cpu"}).json()
    assert [r["id"] for r in listed["results"]] == [second.pk, run.pk]
    assert listed["results"][0]["previous"] == run.pk
    assert cast.api("mona").get(url, {"pool": "h200"}).json()["results"] == []

    detail = cast.api("mona").get(reverse("api:suite-run-detail", args=[second.pk])).json()
    assert len(detail["matrix"]) == ENTRIES
    row = detail["matrix"][0]
    assert row["entry"] == "dense-gqa-llama" and row["shapes"] == ["dense-gqa"]
    assert row["cells"] == [
        {
            "stage": "fetch",
            "state": "queued",
            "failure_class": "",
            "attempt": 1,
            "regressions": [],
            "previous_state": "queued",
            "previous_run": run.pk,
            "change": "",
        }
    ]


def test_api_refusals(cast):
    cpu_pool()
    url = reverse("api:suite-run-list")
    eli = cast.api("eli")
    # An empty body starts nothing: a whole suite on the default pool is asked for by name.
    response = eli.post(url, {}, format="json")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["pool"]
    response = eli.post(url, {"pool": "tpu"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["pool"][0].startswith("No enabled pool 'tpu'")
    response = eli.post(url, {"pool": "cpu", "suite": "nightly"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["suite"][0].startswith("No suite 'nightly'")
    response = eli.post(url, {"pool": "cpu", "stages": ["fetch", "warp"]}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid" and list(error["fields"]) == ["stages"]
    assert "'warp'" in error["fields"]["stages"][0]
    assert not SuiteRun.objects.exists()

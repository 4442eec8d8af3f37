"""`make run`'s demo, in real Chromium: the demo hub's six real releases, polled and adapted
by the real stages, shown on the board; one release page opened.

The demo's jobs run on the `cpu` pool, whose one device is the worker's machine (here, this
one): the twins' operators and precision pass for all six, while the `plan` of a release
larger than the machine fails with what would fit, and its performance and stability stages
are skipped (its release notes still run, saying what blocked). On a 24 GiB machine only
gpt-oss-20b fits and goes on through performance and stability (shortened here by
`quick_measurements`; `make run` uses the defaults); the expected outcome is worked out for
the machine the test runs on."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command

from adaptation.models import AdaptationJob, JobStatus, ModelRelease, StageRun, StageStatus
from day0web.celery import app
from engine.architecture import analyze_config
from engine.stages.plan.errors import NoFittingPlan
from engine.stages.plan.layout import PoolLayout
from engine.stages.plan.planner import plan_release
from tests.factories import cpu_pool

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DEMO_HUB = Path(__file__).resolve().parents[2] / "demo" / "hub"
DEMO_REPOS = {
    "Qwen/Qwen2.5-72B-Instruct",
    "Qwen/Qwen3-235B-A22B-Instruct-2507",
    "deepseek-ai/DeepSeek-V3",
    "meta-llama/Llama-3.1-8B",
    "moonshotai/Kimi-K2-Instruct",
    "openai/gpt-oss-20b",
}


def fits_this_machine(repo_id: str) -> bool:
    """Whether the demo release `repo_id` fits the cpu pool (this machine, one device) at the
    plan's defaults."""
    config = json.loads((DEMO_HUB / repo_id / "config.json").read_text())
    try:
        plan_release(analyze_config(config).to_dict(), PoolLayout("cpu", devices_per_node=1))
    except NoFittingPlan:
        return False
    return True


@pytest.fixture
def stages_run_in_process() -> Iterator[None]:
    """Celery in eager mode: each queued stage runs in this process as it is enqueued, as a
    worker would run it (the end-to-end tests use a real worker process), with a worker
    process's torch threads (`DAY0_TORCH_THREADS`, `day0web.celery.limit_torch_threads`): the
    measured stages' timings on a busy 2-core host stall with more."""
    import torch
    from django.conf import settings

    threads = torch.get_num_threads()
    torch.set_num_threads(settings.DAY0_TORCH_THREADS)
    app.conf.task_always_eager = True
    try:
        yield
    finally:
        app.conf.task_always_eager = False
        torch.set_num_threads(threads)


def test_demo_hub_releases_are_adapted_and_shown(
    live_server, page, stages_run_in_process, settings, tmp_path, quick_measurements
):
    from playwright.sync_api import expect

    # The shipped demo hub as it is in git (a folder a user dropped in is not part of it).
    settings.DAY0_DEMO_HUB_DIR = tmp_path / "hub"
    for repo_id in DEMO_REPOS:
        shutil.copytree(DEMO_HUB / repo_id, settings.DAY0_DEMO_HUB_DIR / repo_id)
    cpu_pool()  # a transactional test's flush removed the migration's row
    call_command("load_demo", verbosity=0)
    call_command("poll_hubs")
    assert set(ModelRelease.objects.values_list("repo_id", flat=True)) == DEMO_REPOS
    fits = {repo_id: fits_this_machine(repo_id) for repo_id in DEMO_REPOS}
    assert not fits["moonshotai/Kimi-K2-Instruct"]  # ~1 TB of weights: no test machine holds it
    statuses = dict(AdaptationJob.objects.values_list("release__repo_id", "status"))
    failures = StageRun.objects.filter(status=StageStatus.FAILED).values_list(
        "job__release__repo_id", "stage", "error"
    )
    assert statuses == {
        repo_id: JobStatus.SUCCEEDED if fits[repo_id] else JobStatus.FAILED
        for repo_id in DEMO_REPOS
    }, list(failures)

    page.goto(f"{live_server.url}/accounts/login/")
    page.get_by_label("Username").fill("demo")
    page.get_by_label("Password").fill("day0-demo")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Release board")).to_be_visible()

    shown = set(
        page.locator("#board-table tbody th.release a[id^='release-link-']").all_inner_texts()
    )
    assert shown == DEMO_REPOS
    # A release whose plan does not fit this machine has a blocker note saying what would.
    for release in ModelRelease.objects.all():
        badge = page.locator(f"#limitation-count-{release.pk}")
        if not fits[release.repo_id]:
            expect(badge).to_have_class(re.compile(r"severity-blocker"))
    for stage in ("fetch", "analyze", "operators", "precision"):
        cells = page.locator(f"#board-table td[data-stage='{stage}']").all_inner_texts()
        assert len(cells) == 6 and all("Succeeded" in text for text in cells)
    plan_cells = page.locator("#board-table td[data-stage='plan']").all_inner_texts()
    assert sorted("Succeeded" in text for text in plan_cells) == sorted(fits.values())
    # a release that fits goes on through the measured stages on its twin; the others skip
    # them; every release gets its notes (a blocked one's say what blocked it)
    for stage in ("performance", "stability"):
        cells = page.locator(f"#board-table td[data-stage='{stage}']").all_inner_texts()
        assert sorted("Succeeded" in text for text in cells) == sorted(fits.values())
        assert sum("Skipped" in text for text in cells) == list(fits.values()).count(False)
    cells = page.locator("#board-table td[data-stage='release_notes']").all_inner_texts()
    assert len(cells) == 6 and all("Succeeded" in text for text in cells)
    expect(page.locator("#board-table caption")).to_contain_text("Checking for new releases")

    page.get_by_role("link", name="moonshotai/Kimi-K2-Instruct").click()
    expect(page.get_by_role("heading", name="moonshotai/Kimi-K2-Instruct", level=1)).to_be_visible()
    size = page.get_by_role("table", name="Size and memory")
    expect(size.get_by_role("row", name=re.compile("^Total params"))).to_contain_text(
        "1,026.4 B params"
    )
    expect(size.get_by_role("row", name=re.compile("^KV cache per token"))).to_contain_text(
        "70,272 bytes/token"
    )
    # Attention, position encoding and experts are folded under one line, a click away.
    expect(page.locator("#analysis-more summary")).to_contain_text("Attention, position encoding")
    page.locator("#analysis-more summary").click()
    expect(page.get_by_role("table", name="Attention")).to_contain_text("MLA")
    # The plan on the cpu pool: the reason it does not fit, and what would.
    reason = page.get_by_text("moonshotai/Kimi-K2-Instruct does not fit 1 x cpu").first
    expect(reason).to_be_visible()
    expect(reason).to_contain_text("more devices would fit")

    # Operators and precision, measured on the twin on the cpu pool, with the drift chart.
    # The cpu pool runs every operator: no problem table, the covered list folded in a line.
    assert page.locator("#operators-problems").count() == 0
    covered = page.locator("#operators-covered summary")
    expect(covered).to_contain_text("are covered on cpu")
    covered.click()
    operators = page.get_by_role("table", name="Operators covered")
    expect(operators).to_contain_text("aten::")
    assert "Missing" not in operators.inner_text()
    precision = page.get_by_role("table", name="Precision per dtype")
    for dtype in ("bfloat16", "float16"):
        row = precision.get_by_role("row", name=re.compile(f"^{dtype}"))
        expect(row).to_contain_text("Passed")
        expect(row).to_contain_text("mean relative logit error")  # what the verdict rests on
    expect(page.locator("#precision-drift-chart .main-svg").first).to_be_visible()
    page.screenshot(path="/tmp/day0-demo-kimi.png", full_page=True)
    page.locator("#validation").screenshot(path="/tmp/day0-demo-kimi-validation.png")

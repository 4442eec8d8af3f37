"""The release page: header, analysis with units, stage timeline, live refresh."""

from __future__ import annotations

import copy
import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from adaptation.models import StageRun
from tests.factories import make_job, make_release
from tests.web.sample_results import (
    DEEPSEEK_V3_ANALYSIS,
    FETCH_RESULT,
    NEW_FAMILY_ANALYSIS,
)

pytestmark = pytest.mark.django_db


def page_url(release) -> str:
    return reverse("adaptation:release_detail", args=[release.pk])


def row_value(html: str, label: str) -> str:
    """The value cell (text only) of the analysis row labelled `label`."""
    match = re.search(
        rf'<th scope="row">{re.escape(label)}</th>\s*<td class="value">(.*?)</td>\s*'
        r'<td class="provenance-cell">(.*?)</td>',
        html,
        re.S,
    )
    assert match, f"no analysis row {label!r}"
    return " ".join(re.sub(r"<[^>]+>", " ", match[1]).split())


def row_source(html: str, label: str) -> str:
    match = re.search(
        rf'<th scope="row">{re.escape(label)}</th>\s*<td class="value">.*?</td>\s*'
        r'<td class="provenance-cell">(.*?)</td>',
        html,
        re.S,
    )
    assert match
    return match[1]


def analysed_release(result: dict | None = None, **release_fields):
    release = make_release(**release_fields)
    make_job(
        release=release,
        statuses={"fetch": "succeeded", "analyze": "succeeded"},
        results={"fetch": FETCH_RESULT, "analyze": result or DEEPSEEK_V3_ANALYSIS},
    )
    return release


def test_release_page_requires_login(client):
    release = make_release()
    response = client.get(page_url(release))
    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))


def test_unknown_release_is_404(logged_in_client):
    assert (
        logged_in_client.get(reverse("adaptation:release_detail", args=[999999])).status_code == 404
    )


def test_header_shows_release_and_time_to_detect(logged_in_client):
    published = timezone.now() - timedelta(hours=3)
    release = make_release(
        repo_id="deepseek-ai/DeepSeek-V3",
        published_at=published,
        discovered_at=published + timedelta(minutes=4, seconds=30),
    )
    html = logged_in_client.get(page_url(release)).content.decode()
    assert "<h1>deepseek-ai/DeepSeek-V3</h1>" in html
    assert f"<code>{release.revision}</code>" in html
    assert "Hugging Face Hub" in html and "https://huggingface.co" in html
    assert "4 m 30 s" in html and "(discovered \N{MINUS SIGN} published)" in html
    assert published.strftime("%Y-%m-%d %H:%M:%S") + " UTC" in html


def test_header_without_publication_time(logged_in_client):
    release = make_release(published_at=None)
    html = logged_in_client.get(page_url(release)).content.decode()
    assert "published time unknown" in html
    assert "unknown (no publication time)" in html


def test_analysis_figures_have_units_and_sources(logged_in_client):
    html = logged_in_client.get(page_url(analysed_release())).content.decode()

    assert row_value(html, "Total params") == "671.0 B params"
    assert row_value(html, "Active params") == (
        "36.6 B params per token, excluding the input embedding"
    )
    assert row_value(html, "Extra params") == (
        "13.5 B params multi-token prediction (MTP) modules: 1; not in total params"
    )
    assert row_value(html, "KV cache per token") == "70,272 bytes/token"
    assert row_value(html, "KV cache at max context").startswith("10.7 GiB")
    assert row_value(html, "Weight bytes") == "641.3 GiB"
    assert row_value(html, "Checkpoint size") == "641.3 GiB"
    assert row_source(html, "Weight bytes") == "computed from config"
    assert row_source(html, "Checkpoint size") == "as published in the index"
    assert row_source(html, "Total params") == "computed from config"
    assert row_value(html, "Max context") == "163,840 tokens"
    assert row_value(html, "Vocabulary") == "129,280 tokens"
    assert row_value(html, "Layers") == "61"
    assert row_value(html, "Hidden size") == "7,168"
    assert row_value(html, "Attention heads") == "128"
    assert row_value(html, "KV heads") == "128"
    assert row_value(html, "Head dim") == "192"
    assert row_value(html, "Architecture") == "DeepseekV3ForCausalLM"
    assert row_value(html, "Model type") == "deepseek_v3"
    assert row_value(html, "Family") == "deepseek_v3"
    assert row_value(html, "Attention kind") == "MLA"
    assert row_value(html, "MLA KV LoRA rank") == "512"
    assert row_value(html, "MLA Q LoRA rank") == "1,536"
    assert row_value(html, "Layer pattern") == "full x 61"
    assert "Sliding-window layers" not in html  # zero counts are left out
    assert row_value(html, "RoPE type") == "yarn"
    assert row_value(html, "RoPE factor") == "40"
    assert row_value(html, "RoPE theta") == "10,000"
    assert row_value(html, "Routed experts") == "256"
    assert row_value(html, "Experts per token") == "8"
    assert row_value(html, "Shared experts") == "1"
    assert row_value(html, "Dense layers") == "3"
    assert row_value(html, "Expert FFN size") == "2,048"
    assert row_value(html, "Router scoring") == "sigmoid"
    assert row_value(html, "Quantization") == "fp8 (e4m3, 8-bit)"
    assert row_value(html, "Scale block") == "128 x 128"
    assert row_value(html, "Modules not quantized") == "none"
    assert row_value(html, "Quantized params") == "680.6 B params"
    assert row_value(html, "Scale bytes") == "0.155 GiB"
    assert row_value(html, "Weight bytes by dtype") == (
        "F8_E4M3: 633.8 GiB, BF16: 7.3 GiB, F32: 0.155 GiB"
    )
    assert row_value(html, "Stored dtype") == "bfloat16"
    assert "How these figures are counted" in html
    assert "none is measured yet" in html
    assert "1 MTP (next-token-prediction) module(s): 13,463,426,304 params in extra_params" in html
    assert "Nothing: the release matches a known family." in html


def test_new_family_analysis(logged_in_client):
    html = logged_in_client.get(page_url(analysed_release(NEW_FAMILY_ANALYSIS))).content.decode()

    assert row_value(html, "Family") == "novel_moe — not a known family"
    assert row_value(html, "Mixture of experts") == "dense (no experts)"
    assert row_value(html, "Quantization") == "none declared (weights in their stored dtype)"
    assert row_value(html, "Total params") == "3.61 B params"
    # keys the result does not have show a dash instead of failing
    assert row_value(html, "KV cache per token") == "—"
    assert row_value(html, "Hidden size") == "—"
    assert row_value(html, "RoPE theta") == "—"
    assert row_value(html, "Checkpoint size") == "—"
    new = html[html.index("What is new against known families") :]
    assert (
        '<th scope="row">attention</th>'
        "<td>Sliding window of 4,096 tokens on 3 of every 4 layers</td>" in new
    )
    assert "RoPE type &#x27;llama3&#x27; with factor 8 on a new family" in new


def test_latest_succeeded_analysis_is_shown(logged_in_client):
    release = analysed_release()
    newer = copy.deepcopy(DEEPSEEK_V3_ANALYSIS)
    newer["total_params"] = 685000000000
    job = make_job(
        release=release,
        statuses={"fetch": "succeeded", "analyze": "succeeded"},
        results={"analyze": newer},
    )
    StageRun.objects.create(
        job=job, stage="analyze", position=1, attempt=2, status="failed", error="boom"
    )
    html = logged_in_client.get(page_url(release)).content.decode()
    assert row_value(html, "Total params") == "685.0 B params"
    assert f"attempt 1 of job {job.pk}" in html


def test_no_analysis_yet(logged_in_client):
    release = make_release()
    make_job(release=release, statuses={"fetch": "running"})
    html = logged_in_client.get(page_url(release)).content.decode()
    assert "No successful analysis yet; it appears here when the analyze stage succeeds." in html


def test_timeline_shows_every_attempt_and_full_errors(logged_in_client):
    release = make_release()
    error = (
        "Traceback (most recent call last):\n"
        '  File "workers/stages/analyze.py", line 40, in run\n'
        "    raise StageFailed(reason)\n"
        "StageFailed: config.json has no 'hidden_size' and no known default for <model_type 'x'>"
    )
    job = make_job(
        release=release,
        statuses={"fetch": "succeeded", "analyze": "failed"},
        errors={"analyze": error},
    )
    StageRun.objects.filter(job=job, stage="fetch").update(
        log="10:00:01 fetched config.json\n10:00:02 fetched model.safetensors.index.json",
        retries=1,
    )
    StageRun.objects.create(job=job, stage="analyze", position=1, attempt=2, status="pending")

    html = logged_in_client.get(page_url(release)).content.decode()

    escaped = (
        error.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("'", "&#x27;")
        .replace('"', "&quot;")
    )
    assert f'<pre class="error">{escaped}</pre>' in html
    assert '<details id="log-' in html and "<summary>Log excerpt</summary>" in html
    assert "10:00:02 fetched model.safetensors.index.json" in html
    analyze_block = html[html.index(f'id="job-{job.pk}-stage-analyze"') :]
    attempts = re.findall(r'<tbody id="run-\d+">\s*<tr>\s*<td>(\d+)</td>', analyze_block)
    assert attempts == ["1", "2"]
    assert "worker-1" in html
    assert f'action="{reverse("adaptation:stage_rerun", args=[job.pk, "analyze"])}"' in html
    assert "csrfmiddlewaretoken" in html


def test_newest_job_first(logged_in_client):
    release = make_release()
    first = make_job(release=release, statuses={"fetch": "failed"})
    second = make_job(release=release, created_at=timezone.now() + timedelta(seconds=5))
    html = logged_in_client.get(page_url(release)).content.decode()
    assert html.index(f'id="job-{second.pk}"') < html.index(f'id="job-{first.pk}"')


def test_job_panel_polls_while_running_and_stops_when_done(logged_in_client):
    release = make_release()
    job = make_job(release=release, statuses={"fetch": "succeeded", "analyze": "running"})
    url = page_url(release)

    running = logged_in_client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert "<html" not in running
    assert running.lstrip().startswith('<section id="job-panel"')
    assert f'hx-get="{url}"' in running and 'hx-trigger="every 3s"' in running
    assert (
        'id="analysis" class="analysis" aria-labelledby="analysis-title" hx-swap-oob="true"'
        in running
    )
    assert "disabled" in running  # no re-run while the job runs

    StageRun.objects.filter(job=job, stage="analyze").update(
        status="succeeded", finished_at=timezone.now(), result=DEEPSEEK_V3_ANALYSIS
    )
    done = logged_in_client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert "hx-trigger" not in done and "hx-get" not in done
    assert row_value(done, "Total params") == "671.0 B params"


def test_full_release_page_polls_while_running(logged_in_client):
    release = make_release()
    make_job(release=release, statuses={"fetch": "queued"})
    html = logged_in_client.get(page_url(release)).content.decode()
    assert "<html" in html and 'hx-trigger="every 3s"' in html


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            "deepseek-ai__DeepSeek-V3",
            {"Attention kind": "MLA", "KV cache per token": "70,272 bytes/token"},
        ),
        ("openai__gpt-oss-20b", {"Sliding window": "128 tokens", "Active params": "3.61 B params"}),
        ("meta-llama__Llama-3.1-8B", {"Mixture of experts": "dense (no experts)"}),
    ],
)
def test_page_renders_the_real_engine_result(logged_in_client, config, expected):
    """The page lays out what the analysis engine really returns for published configs."""
    from tests.conftest import load_realconfig
    from workers.stages.architecture import analyze_config

    result = analyze_config(load_realconfig(config)).to_dict()
    result["new_against_known"] = [{"aspect": "family", "detail": "first of its family"}]
    html = logged_in_client.get(page_url(analysed_release(result))).content.decode()

    for label, value in expected.items():
        assert row_value(html, label).startswith(value)
    assert "first of its family" in html

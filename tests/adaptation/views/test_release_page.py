"""The release page: header, analysis with units, stage timeline, live refresh."""

from __future__ import annotations

import copy
import json
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from adaptation.models import StageRun
from tests import dom
from tests.factories import make_job, make_release
from tests.sample_results import (
    DEEPSEEK_V3_ANALYSIS,
    FETCH_RESULT,
    NEW_FAMILY_ANALYSIS,
)

pytestmark = pytest.mark.django_db


def page_url(release) -> str:
    return reverse("adaptation:release_detail", args=[release.pk])


def analysis_rows(html: str) -> list[tuple[str, dom.Element, dom.Element]]:
    """Every row of the analysis tables, in page order: its label (the row header's text),
    its value cell and its source cell."""
    found = []
    for row in dom.find_all(html, "tr"):
        cells = row.elements
        if (
            len(cells) == 3
            and cells[0].tag == "th"
            and cells[0].get("scope") == "row"
            and cells[1].classes == ["value"]
            and cells[2].classes == ["provenance-cell"]
        ):
            found.append((cells[0].text, cells[1], cells[2]))
    return found


def analysis_row(html: str, label: str) -> tuple[dom.Element, dom.Element]:
    """The value and source cells of the first analysis row labelled `label`."""
    for shown, value, source in analysis_rows(html):
        if shown == label:
            return value, source
    raise AssertionError(f"no analysis row {label!r}")


def row_value(html: str, label: str) -> str:
    """The value cell (text only) of the analysis row labelled `label`: the figure and its
    note, laid out apart."""
    return " ".join(analysis_row(html, label)[0].strings)


def row_source(html: str, label: str) -> str:
    """The source cell (text) of the analysis row labelled `label`."""
    return analysis_row(html, label)[1].text


def all_sources(html: str) -> dict[str, str]:
    """Every analysis row's label and source, in page order."""
    return {label: source.text for label, _, source in analysis_rows(html)}


def analysed_release(result: dict | None = None, *, config: dict | None = None, **release_fields):
    """A release whose job fetched `config` (default DeepSeek-V3's) and analysed it."""
    release = make_release(**release_fields)
    fetch = {**FETCH_RESULT, "config": config} if config is not None else FETCH_RESULT
    make_job(
        release=release,
        statuses={"fetch": "succeeded", "analyze": "succeeded"},
        results={"fetch": fetch, "analyze": result or DEEPSEEK_V3_ANALYSIS},
    )
    return release


def engine_release(config_name: str, *, config: dict | None = None, **release_fields):
    """A release analysed by the real engine from a published config."""
    from engine.architecture import analyze_config
    from tests.conftest import load_realconfig

    config = config or load_realconfig(config_name)
    result = analyze_config(config).to_dict()
    return analysed_release(result, config=config, **release_fields)


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
    assert "not measured (the measured ones are under" in html
    assert "1 MTP (next-token-prediction) module: 13,463,426,304 params in extra_params" in html
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
    # the aspect "rope" is not repeated at the start of its detail
    assert (
        '<th scope="row">rope</th><td>type &#x27;llama3&#x27; with factor 8 on a new family</td>'
        in new
    )
    # a missing figure has no source
    assert row_source(html, "Hidden size") == ""
    assert row_source(html, "KV cache per token") == ""


def test_new_against_known_does_not_repeat_the_aspect_in_its_detail(logged_in_client):
    result = copy.deepcopy(DEEPSEEK_V3_ANALYSIS)
    result["new_against_known"] = [
        {"aspect": "family", "detail": "family deepseek_v3 has not been seen before"},
        {"aspect": "RoPE type", "detail": "RoPE type not seen before: yarn"},
        {"aspect": "MoE layout", "detail": "MoE layout: 256 experts, top 8"},
        {"aspect": "config keys", "detail": "keys no known family uses: q_lora_rank"},
        {"aspect": "attention", "detail": "attentions differ"},
    ]
    html = logged_in_client.get(page_url(analysed_release(result))).content.decode()
    assert dom.rows(html, "table.new-table tbody") == [
        ["family", "deepseek_v3 has not been seen before"],
        ["RoPE type", "not seen before: yarn"],
        ["MoE layout", "256 experts, top 8"],
        ["config keys", "keys no known family uses: q_lora_rank"],
        ["attention", "attentions differ"],
    ]


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
        '  File "engine/stages/analyze/run.py", line 40, in run\n'
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
    analyze_block = dom.find(html, f"#job-{job.pk}-stage-analyze")
    attempts = [dom.text(run, "tr > td") for run in analyze_block.select('tbody[id^="run-"]')]
    assert attempts == ["1", "2"]
    assert "worker-1" in html
    assert f'action="{reverse("adaptation:stage_rerun", args=[job.pk, "analyze"])}"' in html
    assert "csrfmiddlewaretoken" in html


def test_timeline_lists_the_workers_that_ran_a_stage(logged_in_client):
    release = make_release()
    job = make_job(release=release, statuses={"fetch": "succeeded", "analyze": "succeeded"})
    fetch = job.stage_runs.get(stage="fetch")
    StageRun.objects.filter(pk=fetch.pk).update(
        attempts=[
            {
                "n": 1,
                "worker_host": "cpu@box",
                "pid": 4242,
                "started_at": "2025-01-01T12:00:00+00:00",
                "ended_at": "2025-01-01T12:00:09+00:00",
                "ended": "worker-lost",
                "reason": "killed by signal 9 (SIGKILL)",
                "culprit": "infrastructure",
                "oom_kills_at_start": 0,
            },
            {
                "n": 2,
                "worker_host": "cpu@box",
                "pid": 4343,
                "started_at": "2025-01-01T12:00:10+00:00",
                "ended_at": "2025-01-01T12:00:12+00:00",
                "ended": "succeeded",
                "reason": "",
                "culprit": None,
                "oom_kills_at_start": 0,
            },
        ]
    )

    html = logged_in_client.get(page_url(release)).content.decode()

    def item(n: int) -> str:
        start = html.index(f'<li id="run-{fetch.pk}-attempt-{n}">')
        return html[start : html.index("</li>", start)].split(">", 1)[1]

    assert item(1) == (
        "<strong>#1</strong> cpu@box (pid 4242), 12:00:00\u201312:00:09 UTC: "
        '<span class="badge attempt-worker-lost">worker lost</span>: killed by signal 9 (SIGKILL) '
        "<span class=\"muted\">(the infrastructure's fault, not the release's)</span>"
    )
    assert item(2) == (
        "<strong>#2</strong> cpu@box (pid 4343), 12:00:10\u201312:00:12 UTC: "
        '<span class="badge attempt-succeeded">succeeded</span>'
    )
    # A stage run once by one worker lists nothing more.
    assert f'id="run-{job.stage_runs.get(stage="analyze").pk}-attempts"' not in html


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
    from engine.architecture import analyze_config
    from tests.conftest import load_realconfig

    result = analyze_config(load_realconfig(config)).to_dict()
    result["new_against_known"] = [{"aspect": "family", "detail": "first of its family"}]
    html = logged_in_client.get(page_url(analysed_release(result))).content.decode()

    for label, value in expected.items():
        assert row_value(html, label).startswith(value)
    assert "first of its family" in html


def test_sources_say_read_only_for_what_deepseek_v3_config_holds(logged_in_client):
    html = logged_in_client.get(page_url(analysed_release())).content.decode()
    sources = all_sources(html)

    read = "read from config"
    computed = "computed from config"
    # config.json holds these keys with these values
    for label in (
        "Architecture",
        "Model type",
        "Stored dtype",
        "Tied input/output embeddings",
        "Layers",
        "Hidden size",
        "Attention heads",
        "KV heads",
        "Dense FFN size",
        "Vocabulary",
        "Max context",
        "MLA Q LoRA rank",
        "MLA KV LoRA rank",
        "MLA QK head dim without RoPE",
        "MLA QK RoPE head dim",
        "MLA V head dim",
        "RoPE type",
        "RoPE factor",
        "RoPE theta",
        "RoPE original max position embeddings",
        "Routed experts",
        "Experts per token",
        "Shared experts",
        "Expert FFN size",
        "Router scoring",
        "Expert groups",
        "Groups per token",
        "Method",
        "Format",
        "Scale block",
        "Activation scheme",
    ):
        assert sources[label] == read, label
    # no head_dim key: nope + rope head dims; the rest the engine works out
    for label in (
        "Head dim",
        "Family",
        "Quantization",
        "Attention kind",
        "Layer pattern",
        "Full-attention layers",
        "Layers with a KV cache",
        "MoE layers",
        "Dense layers",
        "Dense layer indices",
        "Bits per weight",
        "Modules not quantized",
        "Quantized params",
        "Total params",
        "KV cache per token",
    ):
        assert sources[label] == computed, label
    assert sources["Checkpoint size"] == "as published in the index"


@pytest.mark.parametrize(
    ("config_name", "sources"),
    [
        (
            "meta-llama__Llama-3.1-8B",
            {
                "Head dim": "computed from config",  # hidden_size / heads: no head_dim key
                "KV heads": "read from config",
                "Attention kind": "computed from config",
                "Mixture of experts": "computed from config",
                "RoPE type": "read from config",  # rope_scaling.rope_type "llama3"
                "Dense FFN size": "read from config",
            },
        ),
        (
            "openai__gpt-oss-20b",
            {
                "Head dim": "read from config",
                "Sliding window": "read from config",
                "Full-attention layers": "computed from config",
                "Sliding-window layers": "computed from config",
                "Expert FFN size": "read from config",  # its intermediate_size
                "Routed experts": "read from config",  # num_local_experts
                "Dense layers": "computed from config",
                "Scale group size": "computed from config",
                "Stored dtype": "",  # no torch_dtype: "—", no source
            },
        ),
        (
            "Qwen__Qwen3-235B-A22B-Instruct-2507",
            {
                "RoPE type": "computed from config",  # no rope_scaling: the default
                "RoPE factor": "computed from config",
                "RoPE theta": "read from config",
                "Head dim": "read from config",
            },
        ),
    ],
)
def test_sources_of_real_configs(logged_in_client, config_name, sources):
    html = logged_in_client.get(page_url(engine_release(config_name))).content.decode()
    shown = all_sources(html)
    for label, source in sources.items():
        assert shown[label] == source, label


@pytest.mark.parametrize(
    "config_name", ["openai__gpt-oss-20b", "Qwen__Qwen3-235B-A22B-Instruct-2507"]
)
def test_no_dense_ffn_size_when_every_layer_is_moe(logged_in_client, config_name):
    html = logged_in_client.get(page_url(engine_release(config_name))).content.decode()
    assert "Dense FFN size" not in html
    assert row_value(html, "Dense layers") == "0"


def test_dense_ffn_size_for_moe_with_dense_layers_and_dense_models(logged_in_client):
    deepseek = logged_in_client.get(page_url(analysed_release())).content.decode()
    assert row_value(deepseek, "Dense FFN size") == "18,432"
    llama = engine_release("meta-llama__Llama-3.1-8B")
    assert row_value(logged_in_client.get(page_url(llama)).content.decode(), "Dense FFN size") == (
        "14,336"
    )


def test_sources_read_the_text_config_of_a_multimodal_config(logged_in_client):
    from tests.conftest import load_realconfig

    text = load_realconfig("meta-llama__Llama-3.1-8B")
    dtype = text.pop("torch_dtype")
    text.pop("architectures")
    wrapper = {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "torch_dtype": dtype,
        "text_config": text,
        "vision_config": {"hidden_size": 1024, "num_hidden_layers": 24},
    }
    html = logged_in_client.get(page_url(engine_release("", config=wrapper))).content.decode()
    shown = all_sources(html)
    assert row_value(html, "Layers") == "32"
    assert shown["Layers"] == "read from config"  # text_config.num_hidden_layers
    assert shown["Hidden size"] == "read from config"
    assert shown["Stored dtype"] == "read from config"  # the wrapper's torch_dtype
    assert shown["Architecture"] == "read from config"
    assert shown["Head dim"] == "computed from config"


def test_the_release_config_is_what_sources_are_checked_against(logged_in_client):
    """The stored `release.config` wins over the fetch result's copy."""
    from tests.conftest import load_realconfig

    config = load_realconfig("deepseek-ai__DeepSeek-V3")
    release = analysed_release(config={"model_type": "deepseek_v3"})
    release.config = config
    release.save(update_fields=["config"])
    html = logged_in_client.get(page_url(release)).content.decode()
    assert row_source(html, "Layers") == "read from config"

    bare = analysed_release(config={"model_type": "deepseek_v3"})
    html = logged_in_client.get(page_url(bare)).content.decode()
    assert row_source(html, "Layers") == "computed from config"
    assert row_source(html, "Model type") == "read from config"


def test_figure_config_keys_cover_the_engine_key_spellings():
    """The page's figure → config key map keeps up with the keys the engine reads."""
    from adaptation.presenters.figure_sources import FIGURE_CONFIG_KEYS
    from engine.architecture.config_reader import KEY_ALIASES
    from engine.architecture.moe import (
        EXPERT_COUNT_KEYS,
        SHARED_COUNT_KEYS,
        TOP_K_KEYS,
    )

    figures = {
        "hidden_size": "hidden_size",
        "num_hidden_layers": "num_layers",
        "num_attention_heads": "num_attention_heads",
        "num_key_value_heads": "num_kv_heads",
        "intermediate_size": "intermediate_size",
        "max_position_embeddings": "max_position_embeddings",
        "vocab_size": "vocab_size",
    }
    for key, figure in figures.items():
        assert {key, *KEY_ALIASES.get(key, ())} <= set(FIGURE_CONFIG_KEYS[figure]), key
    assert set(EXPERT_COUNT_KEYS) <= set(FIGURE_CONFIG_KEYS["moe.num_experts"])
    assert set(TOP_K_KEYS) <= set(FIGURE_CONFIG_KEYS["moe.experts_per_token"])
    assert set(SHARED_COUNT_KEYS) <= set(FIGURE_CONFIG_KEYS["moe.num_shared_experts"])


def test_sliding_window_kv_is_shown_freed_and_kept(logged_in_client):
    """gpt-oss-20b's sliding layers: the page gives KV at max context both ways, freed (vLLM,
    SGLang by default) and full-length kept, each the engine's figure in GiB."""
    from engine.architecture import analyze_config
    from tests.conftest import load_realconfig

    result = analyze_config(load_realconfig("openai__gpt-oss-20b")).to_dict()
    freed = result["kv_cache_bytes_at_max_context"]
    kept = result["kv_cache_bytes_at_max_context_kept"]
    assert kept > freed
    html = logged_in_client.get(page_url(engine_release("openai__gpt-oss-20b"))).content.decode()
    assert row_value(html, "KV cache at max context").startswith(f"{freed / 2**30:.1f} GiB")
    assert row_value(html, "KV cache at max context, full-length KV kept").startswith(
        f"{kept / 2**30:.1f} GiB"
    )
    assert "Parameters counted by" not in html  # day0's own family table: nothing to say


def test_an_unknown_model_type_is_marked_estimated_with_its_assumptions(logged_in_client):
    config = {
        "model_type": "never_seen_lm",
        "architectures": ["NeverSeenForCausalLM"],
        "hidden_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "intermediate_size": 4096,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
    }
    html = logged_in_client.get(page_url(engine_release("", config=config))).content.decode()
    assert row_value(html, "Parameters counted by") == "estimated"
    assert "num_key_value_heads" in row_value(html, "Assumed (estimate)")


def test_a_layer_kind_day0_does_not_know_shows_as_an_assumption(logged_in_client):
    """MiniMax-M3's published config: transformers reads its layer_types as
    "minimax_m3_sparse" on layers 3-59, a kind day0 counts from a guess."""
    from tests.conftest import DATA_DIR

    config = json.loads(
        (DATA_DIR / "unknown_layer_kinds" / "MiniMaxAI__MiniMax-M3.json").read_text()
    )
    html = logged_in_client.get(page_url(engine_release("", config=config))).content.decode()
    assert row_value(html, "Parameters counted by") == "transformers meta-device build"
    assumed = row_value(html, "Assumed (estimate)")
    assert (
        "estimated: layer kind 'minimax_m3_sparse' is not known to day0; counted as full "
        "attention on 57 layers (3-59)"
    ) in assumed.replace("&#x27;", "'")
    assert row_value(html, "Layers with a KV cache") == "60"

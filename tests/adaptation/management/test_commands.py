"""The management commands: output on real configs, exit codes on bad input."""

from __future__ import annotations

import io
import json
import logging

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from adaptation.models import AdaptationJob, HubKind, StageStatus
from tests.conftest import REALCONFIGS_DIR
from tests.factories import make_job, make_watch

REQUIRED_KEYS = {
    "architecture", "model_type", "num_layers", "hidden_size", "num_attention_heads",
    "num_kv_heads", "head_dim", "attention", "vocab_size", "rope", "moe", "total_params",
    "active_params", "extra_params", "weight_bytes", "kv_cache_bytes_per_token",
    "kv_cache_bytes_at_max_context", "max_position_embeddings",
}  # fmt: skip


def analyze_json(target: str) -> dict:
    out = io.StringIO()
    call_command("analyze", target, "--format", "json", stdout=out)
    return json.loads(out.getvalue())


def test_analyze_prints_the_analysis_of_a_config_file():
    result = analyze_json(str(REALCONFIGS_DIR / "deepseek-ai__DeepSeek-V3.json"))
    assert result.keys() >= REQUIRED_KEYS
    assert result["architecture"] == "DeepseekV3ForCausalLM"
    assert result["attention"]["kind"] == "MLA"
    assert result["rope"]["type"] == "yarn" and result["rope"]["factor"] == 40
    assert result["moe"]["num_experts"] == 256
    assert result["moe"]["experts_per_token"] == 8
    assert result["moe"]["num_shared_experts"] == 1
    assert result["total_params"] == 671_026_404_352
    assert result["kv_cache_bytes_per_token"] == 70_272
    assert result["extra_params"] > 0  # the MTP layer, kept out of total_params


def test_analyze_reads_a_release_folder_and_a_hub_repo(tmp_path, fake_hub, monkeypatch):
    config = (REALCONFIGS_DIR / "openai__gpt-oss-20b.json").read_bytes()
    folder = tmp_path / "openai" / "gpt-oss-20b"
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes(config)
    assert analyze_json(str(folder))["total_params"] == 20_914_757_184

    fake_hub.add_repo("openai/gpt-oss-20b", {"config.json": config})
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    assert analyze_json("openai/gpt-oss-20b")["active_params"] == 3_608_307_264


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b'{"model_type": "llama",', "is not valid JSON"),
        (b'{"model_type": "mystery", "num_hidden_layers": 2}', "hidden_size"),
        (b"[1, 2]", "not an object"),
    ],
)
def test_analyze_refuses_bad_input_with_one_line(tmp_path, content, reason):
    path = tmp_path / "model.json"
    path.write_bytes(content)
    with pytest.raises(CommandError) as info:
        call_command("analyze", str(path), "--format", "json")
    assert reason in str(info.value)
    assert "\n" not in str(info.value)


def test_analyze_refuses_a_target_that_is_neither_path_nor_repo():
    with pytest.raises(CommandError, match="neither an existing path nor a Hub repo id"):
        call_command("analyze", "no such thing")


@pytest.mark.django_db
def test_adapt_without_wait_creates_a_manual_job(tmp_path):
    folder = tmp_path / "meta-llama" / "Llama-3.1-8B"
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes(
        (REALCONFIGS_DIR / "meta-llama__Llama-3.1-8B.json").read_bytes()
    )
    out = io.StringIO()
    call_command("adapt", str(folder / "config.json"), "--format", "json", stdout=out)
    summary = json.loads(out.getvalue())
    job = AdaptationJob.objects.get(pk=summary["job"])
    assert job.trigger == "manual" and job.release.found_by == "manual"
    assert job.release.repo_id == "meta-llama/Llama-3.1-8B"
    names = [s["name"] for s in summary["stages"]]
    assert names == [
        "fetch", "analyze", "operators", "precision", "plan", "distributed", "serve",
        "performance", "stability", "release_notes",
    ]  # fmt: skip
    assert [s["status"] for s in summary["stages"]] == ["queued"] + ["pending"] * 9
    assert job.options == {}


@pytest.mark.django_db
def test_adapt_refuses_an_unknown_pool(tmp_path):
    folder = tmp_path / "a" / "b"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    with pytest.raises(CommandError, match="No enabled pool 'tpu'; enabled pools: cpu"):
        call_command("adapt", str(folder), "--pool", "tpu")


@pytest.mark.django_db
def test_adapt_refuses_a_second_job_while_one_has_not_ended(tmp_path):
    """`manage.py adapt` exits with the `CommandError`'s returncode (Django's
    `run_from_argv`), its reason on stderr."""
    from adaptation.services.jobs import job_cancel

    folder = tmp_path / "meta-llama" / "Llama-3.1-8B"
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes(
        (REALCONFIGS_DIR / "meta-llama__Llama-3.1-8B.json").read_bytes()
    )
    call_command("adapt", str(folder), stdout=io.StringIO())
    first = AdaptationJob.objects.get()
    assert first.status == "running"  # its fetch is queued; no worker has taken it
    with pytest.raises(CommandError) as info:
        call_command("adapt", str(folder), stdout=io.StringIO())
    assert info.value.returncode == 4  # EXIT_DUPLICATE
    assert str(info.value) == (
        f"Job {first.pk} for meta-llama/Llama-3.1-8B@{first.release.revision[:12]} on pool cpu "
        "is still running. Pass --allow-duplicate to start another anyway."
    )
    assert AdaptationJob.objects.count() == 1

    call_command("adapt", str(folder), "--allow-duplicate", stdout=io.StringIO())
    assert AdaptationJob.objects.filter(release=first.release).count() == 2
    for job in AdaptationJob.objects.all():
        job_cancel(job=job)
    call_command("adapt", str(folder), stdout=io.StringIO())  # the others have ended
    assert AdaptationJob.objects.count() == 3


@pytest.mark.django_db
def test_rerun_command_queues_a_new_attempt_and_refuses_bad_requests():
    job = make_job(statuses={"fetch": "succeeded", "analyze": "failed"})
    out = io.StringIO()
    call_command("rerun", str(job.pk), "analyze", stdout=out)
    assert "Queued analyze attempt 2" in out.getvalue()
    assert job.stage_runs.get(stage="analyze", attempt=2).status == StageStatus.QUEUED
    with pytest.raises(CommandError, match="still running"):
        call_command("rerun", str(job.pk), "fetch")
    with pytest.raises(CommandError, match="No job 999999"):
        call_command("rerun", "999999", "fetch")


@pytest.mark.django_db
def test_poll_hubs_exits_non_zero_when_a_hub_fails(tmp_path):
    make_watch(name="gone", endpoint=str(tmp_path / "missing"))
    err = io.StringIO()
    with pytest.raises(CommandError, match=r"^1 of 1 polled watch failed\.$"):
        call_command("poll_hubs", stdout=io.StringIO(), stderr=err)
    assert err.getvalue().startswith("gone: poll failed: ")


# `.invalid` never resolves (RFC 2606): a ModelScope watch polled with no network.
OFFLINE_MODELSCOPE = "https://day0-hub.invalid"


@pytest.mark.django_db
@pytest.mark.parametrize("verbosity", [1, 2])
def test_poll_hubs_prints_an_unreachable_hub_s_error_once(monkeypatch, caplog, tmp_path, verbosity):
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", OFFLINE_MODELSCOPE)
    monkeypatch.setenv("DAY0_VAR_DIR", str(tmp_path / "var"))
    make_watch(name="ms-qwen", kind=HubKind.MODELSCOPE, endpoint=OFFLINE_MODELSCOPE, author="Qwen")
    (tmp_path / "mirror").mkdir()
    make_watch(name="ok-mirror", endpoint=str(tmp_path / "mirror"))
    out, err = io.StringIO(), io.StringIO()
    with caplog.at_level(logging.INFO), pytest.raises(CommandError) as raised:
        call_command("poll_hubs", "--force", verbosity=verbosity, stdout=out, stderr=err)

    assert err.getvalue() == (
        f"ms-qwen: poll failed: listing models of Qwen on {OFFLINE_MODELSCOPE}: cannot reach"
        f" {OFFLINE_MODELSCOPE}: the name does not resolve. The hub or the network is at"
        " fault, not the release: check the network, proxy and MODELSCOPE_ENDPOINT; retry"
        " later.\n"
    )
    assert out.getvalue() == "ok-mirror: 0 new releases\n"
    # The exit status, not the error again.
    assert str(raised.value) == "1 of 2 polled watches failed."
    logged = [r.getMessage() for r in caplog.records if "cannot reach" in r.getMessage()]
    if verbosity == 1:
        assert logged == []
    else:  # the log lines, with the exception's class, for whoever debugs it
        assert any("NetworkError(" in line for line in logged)
    # The loggers are as they were after the command.
    assert logging.getLogger("engine.hubs").level == logging.NOTSET


def test_analyze_text_output_has_units_and_says_it_is_computed():
    out = io.StringIO()
    call_command("analyze", str(REALCONFIGS_DIR / "openai__gpt-oss-20b.json"), stdout=out)
    text = out.getvalue()
    assert "20.9 B params (20,914,757,184)" in text
    assert "49,152 bytes/token at bf16" in text
    assert "layer_pattern=(sliding, full) x 12" in text
    assert text.rstrip().endswith("Every figure is computed from the config (nothing measured).")


def test_analyze_names_a_folder_without_config(tmp_path):
    folder = tmp_path / "org" / "model"
    folder.mkdir(parents=True)
    with pytest.raises(CommandError, match=r"model has no config\.json file"):
        call_command("analyze", str(folder))


def test_analyze_refuses_json_nested_too_deeply(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000)
    with pytest.raises(CommandError, match="nested too deeply"):
        call_command("analyze", str(path))


@pytest.mark.parametrize("timeout", ["0", "-1", "soon"])
def test_adapt_refuses_a_timeout_that_is_not_positive(timeout):
    with pytest.raises(CommandError, match="--timeout"):
        call_command("adapt", "org/model", "--wait", "--timeout", timeout)


@pytest.mark.django_db
def test_load_demo_keeps_what_was_changed_since(settings):
    from django.contrib.auth import get_user_model

    from adaptation.models import HubWatch

    call_command("load_demo", stdout=io.StringIO())
    HubWatch.objects.filter(name="demo-hub").update(enabled=False, poll_interval_s=600)
    user = get_user_model().objects.get(username="demo")
    user.set_password("a new secret phrase")
    user.save()

    call_command("load_demo", stdout=io.StringIO())
    watch = HubWatch.objects.get(name="demo-hub")
    assert (watch.enabled, watch.poll_interval_s) == (False, 600)
    assert watch.endpoint == str(settings.DAY0_DEMO_HUB_DIR)
    user.refresh_from_db()
    assert user.check_password("a new secret phrase")


def release_folder(tmp_path):
    folder = tmp_path / "meta-llama" / "Llama-3.1-8B"
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes(
        (REALCONFIGS_DIR / "meta-llama__Llama-3.1-8B.json").read_bytes()
    )
    return folder


@pytest.mark.django_db
def test_adapt_options_set_any_stages_options_merged_with_the_plan_flags(tmp_path):
    out = io.StringIO()
    options = {
        "stability": {"duration_s": 5},
        "performance": {"max_batch_size": 8, "prompt_lens": [16]},
        "plan": {"concurrency": 2},
    }
    call_command(
        "adapt", str(release_folder(tmp_path)), "--options", json.dumps(options),
        "--context", "4096", "--format", "json", stdout=out,
    )  # fmt: skip
    job = AdaptationJob.objects.get(pk=json.loads(out.getvalue())["job"])
    assert job.options == {
        "stability": {"duration_s": 5.0},
        "performance": {"max_batch_size": 8, "prompt_lens": [16]},
        "plan": {"concurrency": 2, "context_tokens": 4096},
    }


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"stability": {"duration_s": 5}', "--options is not valid JSON: Expecting ',' delimiter"),
        ('["stability"]', "--options must be a JSON object mapping stage names to objects"),
        ('{"stability": 5}', "--options must be a JSON object mapping stage names"),
        ('{"warp": {"x": 1}}', "Options for stage 'warp', which this job does not run"),
        ('{"stability": {"duration_s": -1}}', "stability options: duration_s must be a number"),
        ('{"performance": {"max_batch": 4}}', "unknown performance option max_batch"),
        ('{"fetch": {"x": 1}}', "fetch options: the fetch stage takes no options"),
        ('{"plan": {"context_tokens": 2048}}', "context_tokens given both in --options and as"),
    ],
)
def test_adapt_refuses_bad_options_in_one_line_before_creating_anything(tmp_path, text, words):
    with pytest.raises(CommandError) as info:
        call_command("adapt", str(release_folder(tmp_path)), "--options", text, "--context", "512")
    assert words in str(info.value)
    assert "\n" not in str(info.value)
    assert not AdaptationJob.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("status", "queued_ago_s", "warned"),
    [
        ("queued", 20, True),  # queued 20 s ago and still queued: no worker took it
        ("queued", 2, False),  # just queued
        ("running", 60, False),  # a worker runs it, however long ago it was queued
    ],
)
def test_adapt_wait_warns_only_about_a_stage_queued_for_over_15_s(status, queued_ago_s, warned):
    from datetime import timedelta

    from django.utils import timezone

    from adaptation.management.commands.adapt import Command

    job = make_job(statuses={"fetch": status})
    job.stage_runs.filter(stage="fetch").update(
        queued_at=timezone.now() - timedelta(seconds=queued_ago_s)
    )
    out = io.StringIO()
    command = Command(stdout=out)
    command._follow(job, timeout=0.01, echo=True)
    assert ("still queued after" in out.getvalue()) is warned, out.getvalue()


@pytest.mark.django_db
def test_adapt_wait_stops_when_the_job_is_cancelled(tmp_path, monkeypatch, capsys):
    from adaptation.management.commands import adapt
    from adaptation.services.jobs import job_cancel

    folder = tmp_path / "meta-llama" / "Llama-3.1-8B"
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes(
        (REALCONFIGS_DIR / "meta-llama__Llama-3.1-8B.json").read_bytes()
    )

    def cancel_while_waiting(_seconds):  # someone cancels the job from the board
        job_cancel(job=AdaptationJob.objects.get())

    monkeypatch.setattr(adapt.time, "sleep", cancel_while_waiting)
    with pytest.raises(SystemExit) as exit_info:
        call_command("adapt", str(folder), "--wait", "--timeout", "600", stdout=io.StringIO())
    assert exit_info.value.code == 3
    assert f"Job {AdaptationJob.objects.get().pk} was cancelled." in capsys.readouterr().err

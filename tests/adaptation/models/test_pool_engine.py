"""A pool's serving engine (`AcceleratorPool.engine`, docs/stages/serve.md): checked and
normalised when saved, an attached endpoint through the outbound-address guard (private
addresses only with a superuser's leave), given to the migrated cpu pool, shown by the admin
and the API, and handed to the worker's serve stage (with the engine's Python) after the
guard has looked again."""

from __future__ import annotations

import importlib
import json
import os

import pytest
from django.apps import apps
from django.conf import settings
from django.core.exceptions import ValidationError
from django.test import override_settings

from adaptation.models import AcceleratorPool, StageStatus
from engine.contract import StageDefinition
from tests.adaptation.api.conftest import results
from tests.adaptation.notifications.conftest import fake_getaddrinfo
from tests.factories import cpu_pool, make_job
from workers import runner

pytestmark = pytest.mark.django_db

MIGRATION = importlib.import_module("adaptation.migrations.0008_pool_engine_serve_points")
CPU_ENGINE = {"kind": "vllm", "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}, "memory_fraction": 0.1}
PUBLIC = "engine.example.test"


def errors_of(pool: AcceleratorPool) -> dict:
    with pytest.raises(ValidationError) as err:
        pool.full_clean()
    return err.value.message_dict


def engine_pool(engine: dict, **fields) -> AcceleratorPool:
    return AcceleratorPool(**({"name": "serving", "backend": "cpu", "engine": engine} | fields))


# --- the model ---------------------------------------------------------------------------------


def test_the_migrated_cpu_pool_serves_with_vllms_cpu_build():
    assert AcceleratorPool.objects.get(name="cpu").engine == CPU_ENGINE


def test_the_data_migration_sets_only_an_empty_engine_of_an_existing_cpu_pool():
    pool = AcceleratorPool.objects.get(name="cpu")
    AcceleratorPool.objects.filter(pk=pool.pk).update(engine={})
    MIGRATION.cpu_pool_engine(apps, None)
    assert AcceleratorPool.objects.get(pk=pool.pk).engine == CPU_ENGINE
    attached = {"kind": "openai", "base_url": "https://llm.example.com/v1"}
    AcceleratorPool.objects.filter(pk=pool.pk).update(engine=attached)
    MIGRATION.cpu_pool_engine(apps, None)
    assert AcceleratorPool.objects.get(pk=pool.pk).engine == attached
    AcceleratorPool.objects.filter(pk=pool.pk).delete()
    MIGRATION.cpu_pool_engine(apps, None)
    assert not AcceleratorPool.objects.filter(name="cpu").exists()


def test_the_test_factorys_cpu_pool_has_no_engine():
    assert cpu_pool().engine == {}


@pytest.mark.parametrize(
    ("engine", "words"),
    [
        ({"kind": "tgi"}, "engine kind must be one of vllm, sglang, openai, got 'tgi'"),
        ({"kind": "vllm", "memory_fraction": 1.5}, "engine memory_fraction must be in (0, 1]"),
        ({"kind": "vllm", "flags": ["--port=9000"]}, "engine flag --port=9000 is set by day0"),
        (
            {"kind": "vllm", "flags": ["--load-format", "dummy"]},
            "engine flag --load-format is set by day0 itself (the checkpoint, its load format",
        ),
        (
            {"kind": "vllm", "full_size": {"decode_heavy": [16, 0]}},
            "engine full_size decode_heavy must be [input tokens, output tokens]",
        ),
        (
            {"kind": "vllm", "full_size": {"input_tokens": 128, "tokens": 1}},
            "unknown engine full_size option tokens",
        ),
        ({"kind": "vllm", "env": {"LD_PRELOAD": "x.so"}}, "engine env may not set LD_PRELOAD"),
        ({"kind": "openai"}, "an openai engine needs base_url"),
        (["vllm"], "engine must be an object, got list"),
    ],
)
def test_an_engine_the_stage_cannot_read_is_refused_on_the_field(engine, words):
    [message] = errors_of(engine_pool(engine))["engine"]
    assert words in message
    assert message.endswith("(see docs/stages/serve.md).")


def test_an_engine_is_stored_normalised():
    pool = engine_pool(
        {
            "kind": "vllm",
            "memory_fraction": 1,
            "start_timeout_s": 120,
            "python": " /x/python ",
            "full_size": {"input_tokens": 256, "decode_heavy": None, "prefill_heavy": (512, 8)},
        }
    )
    pool.full_clean()
    pool.save()
    assert AcceleratorPool.objects.get(pk=pool.pk).engine == {
        "kind": "vllm",
        "python": "/x/python",
        "memory_fraction": 1.0,
        "start_timeout_s": 120,
        "full_size": {"input_tokens": 256, "decode_heavy": None, "prefill_heavy": [512, 8]},
    }
    none = engine_pool({}, name="plain")
    none.full_clean()
    assert none.engine == {}


@pytest.mark.parametrize(
    ("base_url", "shown"),
    [
        ("http://127.0.0.1:8000/v1", "127.0.0.1 resolves to 127.0.0.1, a loopback address"),
        ("http://[::1]:8000", "::1 resolves to ::1, a loopback address"),
        ("http://10.0.0.7:8000", "10.0.0.7 resolves to 10.0.0.7, a private address"),
    ],
)
def test_an_attached_endpoint_on_an_internal_address_is_refused(base_url, shown):
    [message] = errors_of(engine_pool({"kind": "openai", "base_url": base_url}))["engine"]
    assert message.startswith(f"base_url: {shown}; requests to private networks are refused")


def test_a_name_resolving_to_an_internal_address_is_refused(monkeypatch):
    fake_getaddrinfo(monkeypatch, {PUBLIC: ["93.184.216.34", "192.168.0.10"]})
    [message] = errors_of(engine_pool({"kind": "openai", "base_url": f"https://{PUBLIC}/v1"}))[
        "engine"
    ]
    assert f"{PUBLIC} resolves to 192.168.0.10, a private address" in message


def test_an_attached_endpoint_is_accepted_where_allowed_or_public(monkeypatch):
    loopback = engine_pool(
        {"kind": "openai", "base_url": "http://127.0.0.1:8000/v1/", "model": "twin"},
        engine_allow_private_network=True,
    )
    loopback.full_clean()
    assert loopback.engine == {
        "kind": "openai",
        "model": "twin",
        "base_url": "http://127.0.0.1:8000/v1",
    }
    asked = fake_getaddrinfo(monkeypatch, {PUBLIC: ["93.184.216.34"]})
    public = engine_pool({"kind": "openai", "base_url": f"https://{PUBLIC}"}, name="public")
    public.full_clean()
    assert asked == [PUBLIC]
    assert public.engine_endpoint_check() == ["93.184.216.34"]


def test_an_unresolvable_endpoint_is_refused_when_saved():
    pool = engine_pool({"kind": "openai", "base_url": "http://no-such-host.invalid/v1"})
    [message] = errors_of(pool)["engine"]
    assert message.startswith("base_url: no-such-host.invalid does not resolve")


# --- the admin and the API ---------------------------------------------------------------------


def pool_form(pool: AcceleratorPool, **changes) -> dict:
    """The admin change form of `pool` as posted, with `changes` (JSON fields as objects)."""
    data = {
        "name": pool.name,
        "backend": pool.backend,
        "queue": pool.queue,
        "device": pool.device,
        "enabled": "on",
        "description": pool.description,
        "accelerator": pool.accelerator,
        "devices_per_node": "",
        "nodes": pool.nodes,
        "intra_node_bandwidth_gb_per_s": "",
        "inter_node_bandwidth_gb_per_s": "",
        "dtypes": json.dumps(pool.dtypes),
        "operator_manifest": "",
        "trust_remote_code_orgs": "[]",
        "precision_thresholds": "{}",
        "real_weights_max_bytes": pool.real_weights_max_bytes,
        "engine": json.dumps(pool.engine),
    }
    for name, value in changes.items():
        data[name] = json.dumps(value) if isinstance(value, dict | list) else value
    return {name: value for name, value in data.items() if value is not None}


def change_url(pool: AcceleratorPool) -> str:
    return f"/admin/adaptation/acceleratorpool/{pool.pk}/change/"


def test_the_admin_shows_the_engine_and_saves_it_normalised(logged_in_client):
    pool = cpu_pool()
    page = logged_in_client.get(change_url(pool)).content.decode()
    assert "Serving engine (the serve stage)" in page
    assert 'name="engine"' in page and 'name="engine_allow_private_network"' in page
    assert "docs/stages/serve.md" in page
    answer = logged_in_client.post(
        change_url(pool), pool_form(pool, engine={"kind": "sglang", "memory_fraction": 1})
    )
    assert answer.status_code == 302, answer.content.decode()[:2000]
    assert AcceleratorPool.objects.get(pk=pool.pk).engine == {
        "kind": "sglang",
        "memory_fraction": 1.0,
    }
    refused = logged_in_client.post(change_url(pool), pool_form(pool, engine={"kind": "tgi"}))
    assert refused.status_code == 200
    assert "engine kind must be one of vllm, sglang, openai" in refused.content.decode()


def test_a_superuser_may_let_an_endpoint_reach_the_private_network(logged_in_client):
    pool = cpu_pool()
    loopback = {"kind": "openai", "base_url": "http://127.0.0.1:8000/v1"}
    refused = logged_in_client.post(change_url(pool), pool_form(pool, engine=loopback))
    assert "127.0.0.1 resolves to 127.0.0.1, a loopback address" in refused.content.decode()
    form = pool_form(pool, engine=loopback, engine_allow_private_network="on")
    assert logged_in_client.post(change_url(pool), form).status_code == 302
    pool.refresh_from_db()
    assert (pool.engine, pool.engine_allow_private_network) == (loopback, True)


def test_an_admin_who_is_no_superuser_cannot_give_the_leave_nor_reuse_it(client, cast):
    pool = cpu_pool()
    client.force_login(cast.ada)
    assert (
        'name="engine_allow_private_network"' not in client.get(change_url(pool)).content.decode()
    )
    loopback = {"kind": "openai", "base_url": "http://127.0.0.1:8000/v1"}
    form = pool_form(pool, engine=loopback, engine_allow_private_network="on")
    refused = client.post(change_url(pool), form)
    assert "a loopback address" in refused.content.decode()
    assert AcceleratorPool.objects.get(pk=pool.pk).engine_allow_private_network is False
    # A superuser allowed the loopback endpoint; the admin may edit other fields...
    AcceleratorPool.objects.filter(pk=pool.pk).update(
        engine=loopback, engine_allow_private_network=True
    )
    pool.refresh_from_db()
    assert client.post(change_url(pool), pool_form(pool, description="now")).status_code == 302
    assert AcceleratorPool.objects.get(pk=pool.pk).engine_allow_private_network is True
    # ...but pointing the engine elsewhere drops the leave, and the guard refuses the address.
    moved = {"kind": "openai", "base_url": "http://10.0.0.7:8000/v1"}
    refused = client.post(change_url(pool), pool_form(pool, engine=moved))
    assert "10.0.0.7 resolves to 10.0.0.7, a private address" in refused.content.decode()
    assert AcceleratorPool.objects.get(pk=pool.pk).engine == loopback


def test_the_api_shows_each_pools_engine(cast):
    pool = cpu_pool()
    AcceleratorPool.objects.filter(pk=pool.pk).update(engine=CPU_ENGINE)
    AcceleratorPool.objects.create(name="plain", backend="cpu")
    pools = {p["name"]: p for p in results(cast.api("mona").get("/api/v1/pools/"))}
    # env values may hold tokens: the API names the variables only
    assert pools["cpu"]["engine"] == {**CPU_ENGINE, "env": ["VLLM_CPU_KVCACHE_SPACE"]}
    assert pools["cpu"]["engine_allow_private_network"] is False
    assert pools["plain"]["engine"] == {}
    # read-only, as every pool field: the admin sets it
    answer = cast.api("ada").patch(f"/api/v1/pools/{pool.pk}/", {"engine": {}}, format="json")
    assert answer.status_code == 405


# --- the worker --------------------------------------------------------------------------------


@override_settings(DAY0_ENGINE_PYTHON="/srv/engines/vllm/bin/python")
def test_the_runner_hands_the_engine_over_with_the_workers_engine_python():
    pool = AcceleratorPool.objects.create(name="gpu", backend="cpu", engine=CPU_ENGINE)
    assert runner.pool_spec(pool).engine == CPU_ENGINE | {"python": "/srv/engines/vllm/bin/python"}
    pool.engine = {"kind": "sglang", "python": "/opt/sglang/bin/python"}
    assert runner.pool_spec(pool).engine == {"kind": "sglang", "python": "/opt/sglang/bin/python"}
    pool.engine = {"kind": "openai", "base_url": "https://llm.example.com/v1/"}
    assert runner.pool_spec(pool).engine == {
        "kind": "openai",
        "base_url": "https://llm.example.com/v1",
        "python": "/srv/engines/vllm/bin/python",
    }
    pool.engine = {}
    assert runner.pool_spec(pool).engine == {}
    pool.engine = {"kind": "tgi"}  # saved around its checks: no stage reads it
    assert runner.pool_spec(pool).engine == {}


def test_the_engine_python_defaults_to_the_checkouts_engine_environment(settings):
    if os.environ.get("DAY0_ENGINE_PYTHON", "").strip():
        pytest.skip("DAY0_ENGINE_PYTHON is set here")
    # The checkout's var/, not DAY0_VAR_DIR (var/test in tests): the engine lives there.
    default = settings.BASE_DIR / "var" / "engines" / "vllm-cpu" / "bin" / "python"
    assert str(default) == settings.DAY0_ENGINE_PYTHON


def serve_run(monkeypatch, pool: AcceleratorPool, seen: list):
    """Run a stand-in serve stage on `pool` through the runner; `seen` gets the engine it was
    handed. Returns the run, refreshed."""

    def body(ctx):
        seen.append(dict(ctx.pool.engine))
        return {"status": "attached", "passed": True}

    definition = StageDefinition(name="serve", title="Serving engine", run=body)
    monkeypatch.setattr(runner, "get_stage", lambda name: definition)
    job = make_job(stages=("serve",), pool=pool, statuses={"serve": StageStatus.QUEUED})
    run = job.stage_runs.get()
    runner.execute_stage_run(run.pk, final_try=True)
    run.refresh_from_db()
    return run


def test_the_worker_checks_the_endpoint_again_before_the_stage_runs(monkeypatch):
    fake_getaddrinfo(monkeypatch, {PUBLIC: ["93.184.216.34"]})
    pool = engine_pool({"kind": "openai", "base_url": f"https://{PUBLIC}/v1"})
    pool.full_clean()
    pool.save()
    seen: list = []
    run = serve_run(monkeypatch, pool, seen)
    assert run.status == StageStatus.SUCCEEDED, run.error
    assert seen == [
        {
            "kind": "openai",
            "base_url": f"https://{PUBLIC}/v1",
            "python": settings.DAY0_ENGINE_PYTHON,
        }
    ]
    # The name now points inside: the stage does not run.
    fake_getaddrinfo(monkeypatch, {PUBLIC: ["169.254.169.254"]})
    run = serve_run(monkeypatch, pool, seen)
    assert len(seen) == 1
    assert run.status == StageStatus.FAILED
    reason = (
        f"The pool's engine base_url is refused: {PUBLIC} resolves to 169.254.169.254, a "
        "link-local address; requests to private networks are refused unless an admin allows "
        "them (for this subscription, or this pool's engine)."
    )
    assert run.error == reason
    assert run.result == {
        "status": "failed",
        "passed": False,
        "failure": {
            "phase": "launch",
            "reason": reason,
            "engine_lines": [],
            "culprit": "infrastructure",
        },
    }
    # With the admin's leave it runs.
    AcceleratorPool.objects.filter(pk=pool.pk).update(engine_allow_private_network=True)
    run = serve_run(monkeypatch, AcceleratorPool.objects.get(pk=pool.pk), seen)
    assert run.status == StageStatus.SUCCEEDED and len(seen) == 2


def test_an_endpoint_that_does_not_resolve_now_is_retried(monkeypatch):
    pool = AcceleratorPool.objects.create(
        name="gone",
        backend="cpu",
        engine={"kind": "openai", "base_url": "http://no-such-host.invalid/v1"},
    )
    definition = StageDefinition(name="serve", title="Serving engine", run=lambda ctx: {})
    monkeypatch.setattr(runner, "get_stage", lambda name: definition)
    job = make_job(stages=("serve",), pool=pool, statuses={"serve": StageStatus.QUEUED})
    run = job.stage_runs.get()
    outcome = runner.execute_stage_run(run.pk)
    assert outcome.status == "retry"
    assert outcome.reason.startswith("The pool's engine base_url: no-such-host.invalid does not")


def test_an_engine_saved_around_its_checks_fails_the_stage_not_the_others(monkeypatch):
    pool = AcceleratorPool.objects.create(name="odd", backend="cpu", engine={"kind": "tgi"})
    seen: list = []
    run = serve_run(monkeypatch, pool, seen)
    assert seen == [] and run.status == StageStatus.FAILED
    assert run.error == (
        "The pool's engine is refused: engine kind must be one of vllm, sglang, openai, got 'tgi'"
    )
    assert run.result["failure"]["culprit"] == "infrastructure"

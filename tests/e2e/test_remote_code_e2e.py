"""End to end: a release whose architecture transformers lacks, on a real Celery prefork
worker. Its shipped modeling code runs in the sandboxed child process (a subprocess of the
daemonic pool process) when the pool trusts its org, and fails the stage with the reason when
it does not."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.engine.stages.test_remote_code import CONFIGURATION, LAYERS, MODELING, tiny_config
from tests.factories import cpu_pool

pytestmark = [pytest.mark.e2e]


def drop_remote_code_release(root: Path, repo_id: str) -> Path:
    folder = root / repo_id
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(tiny_config()))
    (folder / "configuration_day0tiny.py").write_text(CONFIGURATION)
    (folder / "modeling_day0tiny.py").write_text(MODELING)
    (folder / "layers_day0tiny.py").write_text(LAYERS)  # imported relatively only
    return folder


def adapt(folder: Path) -> dict:
    out = io.StringIO()
    try:
        call_command(
            "adapt", str(folder), "--wait", "--format", "json", "--timeout", "240", stdout=out
        )
    except SystemExit as exit_info:
        assert exit_info.code == 1, out.getvalue()  # a failed stage, not a timeout
    return json.loads(out.getvalue())


def test_remote_code_runs_for_a_trusted_org_and_is_refused_for_others(
    celery_worker_process, tmp_path
):
    pool = cpu_pool()
    pool.trust_remote_code_orgs = ["acme"]
    pool.save()
    hub = tmp_path / "hub"

    trusted = adapt(drop_remote_code_release(hub, "acme/tiny-remote"))
    stages = {s["name"]: s for s in trusted["stages"]}
    operators = stages["operators"]
    assert operators["status"] == "succeeded", operators
    assert operators["result"]["twin"]["code_source"] == "remote"
    assert operators["result"]["twin"]["class"] == "Day0TinyForCausalLM"
    assert operators["result"]["missing"] == []
    assert "aten::embedding.default" in {op["name"] for op in operators["result"]["operators"]}

    refused = adapt(drop_remote_code_release(hub, "other/tiny-remote"))
    assert refused["status"] == "failed"
    operators = {s["name"]: s for s in refused["stages"]}["operators"]
    assert operators["status"] == "failed"
    assert "its shipped modeling code is not allowed for org other" in operators["error"]
    assert "trust_remote_code is off for pool cpu" in operators["error"]

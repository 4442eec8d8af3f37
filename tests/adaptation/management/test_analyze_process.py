"""`manage.py analyze` as a user runs it: an engine-only command, run without Django's system
checks or the app registry, and (once the defaults cache holds the family) without importing
transformers, torch, the models, the views, the API or the Celery app."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

ROOT = Path(__file__).resolve().parents[3]
TARGET = "demo/hub/moonshotai/Kimi-K2-Instruct"


def manage(*args: str, var: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"DAY0_VAR_DIR": str(var)}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_analyze_imports_only_the_engine_once_the_defaults_are_cached(tmp_path):
    first = manage("manage.py", "analyze", TARGET, "--format", "json", var=tmp_path)
    assert first.returncode == 0, first.stderr
    assert list((tmp_path / "architecture").glob("transformers-*-defaults.json"))

    again = manage(
        "-X", "importtime", "manage.py", "analyze", TARGET, "--format", "json", var=tmp_path
    )
    assert again.returncode == 0, again.stderr
    imported = set(re.findall(r"\|\s+([\w.]+)$", again.stderr, flags=re.MULTILINE))
    # Nor the Celery app (day0web/__init__.py): an engine-only command sends no task.
    for module in ("transformers", "torch", "adaptation.models", "adaptation.views",
                   "adaptation.admin", "rest_framework", "drf_spectacular",
                   "day0web.celery"):  # fmt: skip
        assert module not in imported, module
    assert json.loads(again.stdout) == json.loads(first.stdout)


@pytest.mark.django_db
def test_the_process_prints_what_the_command_prints_in_process(tmp_path):
    done = manage("manage.py", "analyze", TARGET, "--format", "json", var=tmp_path)
    out = StringIO()
    call_command("analyze", TARGET, "--format", "json", stdout=out)
    assert json.loads(done.stdout) == json.loads(out.getvalue())
    assert json.loads(done.stdout)["total_params"] > 1_000_000_000_000


def test_bad_input_still_exits_with_one_line(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text("{")
    done = manage("manage.py", "analyze", str(bad), var=tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith("CommandError: ")
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_release_folder_with_weights_is_counted_from_its_headers(tmp_path, monkeypatch):
    from tests.checkpoint_cases import llama
    from tests.checkpoints import shard

    monkeypatch.setenv("DAY0_VAR_DIR", str(tmp_path / "var"))
    case = llama()
    folder = tmp_path / "hub" / "acme" / "small-llama"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(case.config))
    for name, content in shard(case.table, 3, data=False).items():
        (folder / name).write_bytes(content)

    out = StringIO()
    call_command("analyze", str(folder), stdout=out)

    text = out.getvalue()
    assert f"checkpoint    {len(case.table)} tensors: {case.params:,} params" in text
    assert text.rstrip().endswith(
        "Parameters and bytes are counted from the checkpoint's safetensors headers; the rest "
        "is computed from the config (nothing measured)."
    )

"""The family defaults kept on disk per transformers version: a later process reads the same
defaults without importing transformers; another version, or a broken file, reads them again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.architecture import transformers_defaults as td

pytest.importorskip("transformers")

MODEL_TYPES = ("deepseek_v3", "llama", "gpt_oss", "gemma3", "qwen3_moe", "no_such_model_type")


@pytest.fixture
def var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DAY0_VAR_DIR", str(tmp_path))
    td.class_defaults.cache_clear()
    td._disk_cache.cache_clear()
    yield tmp_path
    td.class_defaults.cache_clear()
    td._disk_cache.cache_clear()


def _as_plain(defaults: td.FamilyDefaults) -> dict:
    return {
        "class_name": defaults.class_name,
        "transformers_version": defaults.transformers_version,
        "values": dict(defaults.values),
        "aliases": dict(defaults.aliases),
    }


READ_IN_A_NEW_PROCESS = """
import json, sys
from engine.architecture.transformers_defaults import class_defaults
out = {}
for name in sys.argv[1:]:
    d = class_defaults(name)
    out[name] = {"values": repr(sorted(d.values.items())), "class_name": d.class_name}
out["imported transformers"] = "transformers" in sys.modules
print(json.dumps(out))
"""


def test_a_later_process_reads_the_same_defaults_without_importing_transformers(var):
    import transformers

    read = {name: td.class_defaults(name) for name in MODEL_TYPES}
    path = td.defaults_cache_path(transformers.__version__)
    assert path.parent == var / "architecture"
    stored = json.loads(path.read_text())
    assert stored["transformers_version"] == transformers.__version__
    assert sorted(stored["types"]) == sorted(MODEL_TYPES)

    done = subprocess.run(
        [sys.executable, "-c", READ_IN_A_NEW_PROCESS, *MODEL_TYPES],
        capture_output=True,
        text=True,
        check=True,
        env={**__import__("os").environ, "DAY0_VAR_DIR": str(var)},
        cwd=Path(__file__).resolve().parents[3],
    )
    again = json.loads(done.stdout)
    assert again.pop("imported transformers") is False
    for name, defaults in read.items():
        assert again[name]["class_name"] == defaults.class_name
        # The same values and types (a tuple default stays a tuple, a float a float).
        assert again[name]["values"] == repr(sorted(defaults.values.items()))
    assert read["no_such_model_type"].known is False


def test_the_cache_round_trip_is_exact(var):
    for name in MODEL_TYPES:
        fresh = td._read_class_defaults(name)
        td._disk_cache_add("9.9.9", fresh)
    td._disk_cache.cache_clear()
    cached = td._disk_cache("9.9.9")
    for name in MODEL_TYPES:
        assert cached[name] == td._read_class_defaults(name), name
        assert _as_plain(cached[name]) == _as_plain(td._read_class_defaults(name))


def test_another_version_or_a_broken_file_reads_the_class_again(var, monkeypatch):
    monkeypatch.setattr(td, "installed_transformers_version", lambda: "0.0.1-test")
    path = td.defaults_cache_path("0.0.1-test")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    defaults = td.class_defaults("llama")
    assert defaults.class_name == "LlamaConfig"
    assert "llama" in json.loads(path.read_text())["types"]  # rewritten whole

    # A file of another version is never read: a wrong value there changes nothing.
    other = td.defaults_cache_path("0.0.2-test")
    entry = json.loads(path.read_text())
    entry["types"]["llama"]["values"]["dict"]["rms_norm_eps"] = 123.0
    other.write_text(json.dumps(entry))
    td.class_defaults.cache_clear()
    assert td.class_defaults("llama")["rms_norm_eps"] != 123.0


def test_the_version_is_read_without_importing_transformers():
    code = (
        "import sys; from engine.architecture.transformers_defaults import "
        "installed_transformers_version as v; print(v(), 'transformers' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    import transformers

    assert done.stdout.split() == [transformers.__version__, "False"]

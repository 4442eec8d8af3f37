"""`fetch_files` of the mirror source: the release's modeling code, nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.hubs.base import HubNotFound, HubSpec
from engine.hubs.mirror import MirrorSource


@pytest.fixture
def source(tmp_path: Path) -> MirrorSource:
    folder = tmp_path / "acme" / "tiny-1"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "modeling_tiny.py").write_text("X = 1\n")
    return MirrorSource(HubSpec(kind="mirror", endpoint=str(tmp_path)))


def test_fetches_named_files_at_the_current_revision(source):
    revision = source.latest_release("acme/tiny-1").revision
    files = source.fetch_files("acme/tiny-1", revision, ["modeling_tiny.py"])
    assert files == {"modeling_tiny.py": b"X = 1\n"}


def test_refuses_missing_files_paths_and_stale_revisions(source):
    with pytest.raises(HubNotFound, match=r"no file acme/tiny-1/modeling_other\.py"):
        source.fetch_files("acme/tiny-1", "main", ["modeling_other.py"])
    with pytest.raises(HubNotFound, match="not a top-level file name"):
        source.fetch_files("acme/tiny-1", "main", ["../../etc/passwd"])
    with pytest.raises(HubNotFound, match="changed since this revision"):
        source.fetch_files("acme/tiny-1", "0" * 64, ["modeling_tiny.py"])

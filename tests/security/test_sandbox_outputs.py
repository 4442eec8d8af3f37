"""What the sandboxed child leaves behind is read back bounded: its result file (written where
the release's code can write too) and its log."""

from __future__ import annotations

import json

import pytest

from engine.contract import StageFailed
from engine.remote_code import sandbox


def test_a_result_that_is_not_an_object_is_refused(tmp_path):
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"ok": True, "result": ["not", "a", "result"]}))
    with pytest.raises(StageFailed, match="not an object"):
        sandbox._read_result(str(path))
    path.write_text(json.dumps({"ok": True, "result": {"operators": []}}))
    assert sandbox._read_result(str(path)) == {"ok": True, "result": {"operators": []}}


def test_a_result_file_over_the_cap_is_refused_unparsed(tmp_path):
    path = tmp_path / "result.json"
    path.write_bytes(b" " * (sandbox.MAX_RESULT_BYTES + 1))
    with pytest.raises(StageFailed, match="at most 4 MiB"):
        sandbox._read_result(str(path))


def test_a_link_in_place_of_the_result_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"ok": True, "result": {}}))
    (tmp_path / "result.json").symlink_to(target)
    with pytest.raises(StageFailed, match="could not be read"):
        sandbox._read_result(str(tmp_path / "result.json"))


def test_the_log_tail_reads_only_the_end_of_a_huge_log(tmp_path, monkeypatch):
    path = tmp_path / "child.log"
    with open(path, "wb") as fh:
        fh.truncate(64 * 1024**2)  # 64 MiB of zeros, sparse: nothing of it should be read
        fh.seek(0, 2)
        fh.write(b"\nTraceback: ValueError: the last line\n")
    reads = []
    real_open = open

    def counting_open(*args, **kwargs):
        handle = real_open(*args, **kwargs)
        read = handle.read

        def counted(*a):
            data = read(*a)
            reads.append(len(data))
            return data

        handle.read = counted
        return handle

    monkeypatch.setattr("builtins.open", counting_open)
    tail = sandbox._log_tail(str(path), chars=100)
    assert tail.endswith("ValueError: the last line")
    assert sum(reads) <= 400


def test_library_folders_never_bind_the_checkout_or_the_var_folder(tmp_path):
    from engine.remote_code.bwrap import _library_dirs

    work = tmp_path / "work"
    checkout, var, cuda = work / "day0", work / "day0" / "var", tmp_path / "cuda" / "lib64"
    for folder in (checkout, var, cuda):
        folder.mkdir(parents=True, exist_ok=True)
    env = {"LD_LIBRARY_PATH": f"/:{work}:{checkout}:{cuda}:{tmp_path}/missing"}
    assert _library_dirs(env, keep_out=[str(checkout), str(var)]) == [str(cuda.resolve())]

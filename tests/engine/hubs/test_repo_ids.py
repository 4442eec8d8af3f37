"""One repo id check for every way in (the Hub and generic webhooks, `manage.py adapt` and
`analyze`): `org/name` by the rules huggingface_hub's `validate_repo_id` applies."""

from __future__ import annotations

import pytest
from huggingface_hub.utils import HFValidationError, validate_repo_id

from adaptation.targets import TargetError, resolve_target
from engine.hubs.base import is_valid_repo_id

VALID = [
    "acme-ai/Acme-LLM-7B",
    "Qwen/Qwen2.5-72B-Instruct",
    "a/b",
    "_org/_name_",
    "org.x/model.v2",
    "o/" + "x" * 96,
]
INVALID = [
    "no-org",
    "a/b/c",
    "acme/x\n",  # `re.match(...$)` let this through
    " acme/x",
    "acme/x ",
    "acme/café",  # `\w` is Unicode without re.ASCII
    "acme/мир",
    "acme/-x",
    "acme/x-",
    "acme/.x",
    "acme/x.",
    "-acme/x",
    "acme/x--y",
    "acme/x..y",
    "acme/x.git",
    "acme/" + "x" * 97,
    "/x",
    "acme/",
    "",
]


@pytest.mark.parametrize("repo_id", VALID)
def test_ids_the_hub_takes_are_valid(repo_id):
    assert is_valid_repo_id(repo_id)
    validate_repo_id(repo_id)  # huggingface_hub agrees


@pytest.mark.parametrize("repo_id", INVALID)
def test_other_strings_are_not(repo_id):
    assert not is_valid_repo_id(repo_id)


@pytest.mark.parametrize("repo_id", [r for r in INVALID if "/" in r and r.count("/") == 1])
def test_huggingface_hub_refuses_them_too_or_we_need_the_org(repo_id):
    with pytest.raises(HFValidationError):
        validate_repo_id(repo_id)


@pytest.mark.parametrize("value", [None, 7, ["a/b"], b"a/b"])
def test_non_strings_are_not_repo_ids(value):
    assert not is_valid_repo_id(value)


@pytest.mark.parametrize("target", ["acme/x\n", "acme/café", "acme/x..y"])
def test_a_command_line_target_must_be_a_path_or_a_valid_repo_id(target, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no such path here
    with pytest.raises(TargetError, match="neither an existing path nor a Hub repo id"):
        resolve_target(target)


def test_a_hostile_index_or_shard_name_reads_as_not_complete_yet():
    """An index nested past Python's recursion limit, or a shard number of 5,000 digits, is a
    release still being uploaded (or broken), never a crash of the poll."""
    from engine.hubs.base import incomplete_reason

    deep = b'{"weight_map": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    assert "not a JSON object yet" in incomplete_reason(["config.json"], deep)
    huge = "model-" + "9" * 5000 + "-of-" + "9" * 5000 + ".safetensors"
    assert incomplete_reason(["config.json", huge], None) == ""

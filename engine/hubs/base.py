"""What every hub source speaks: plain dataclasses and errors, no Django.

A hub source lists the model releases a watch can see and fetches the few small files that
describe one release (never the weights). The Celery worker's `fetch` stage and the poller
both call sources through this interface, so a new hub kind is one module beside this one and
one row of `engine.hubs.kinds.HUB_KIND_SPECS` (see docs/extending.md, "Adding a hub kind").
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from engine import formatting as fmt
from engine.json_files import JSONFileError, parse_json_bytes

# Files that describe a release; the weights are never downloaded.
RELEASE_FILES: tuple[str, ...] = (
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "README.md",
)


@dataclass(frozen=True)
class HubSpec:
    """Where a source looks: built from a `HubWatch` row or from a command line.

    `kind` is a row of `engine.hubs.kinds.HUB_KIND_SPECS` ("huggingface", "modelscope",
    "mirror"). `endpoint` is the hub's base URL for a URL hub ("" means the kind's endpoint
    variable, `HF_ENDPOINT` or `MODELSCOPE_ENDPOINT`, else its public hub), the root folder
    for a folder kind. `author` limits listing to one org/user; `repo_pattern` is an fnmatch
    pattern on the repo id ("" matches all). `token` is sent as a bearer token (None: the
    kind's token variable, `HF_TOKEN` or `MODELSCOPE_API_TOKEN`, sent only to an endpoint
    `engine.hubs.trust.token_allowed` accepts).
    """

    kind: str
    endpoint: str = ""
    author: str = ""
    repo_pattern: str = ""
    token: str | None = None


@dataclass(frozen=True)
class ReleaseCandidate:
    """One repo at one revision, as a listing sees it.

    `revision` is the commit sha on a Hub and a content hash (sha256 of the release files) in
    a mirror folder. `published_at` is timezone-aware (Hub: the repo's `createdAt`); None
    where the hub has no publication time (a mirror folder: its files' mtimes say when they
    were copied, not published). `complete` is False while an upload is still in
    progress (no `config.json` yet, or an index naming shards that are not there); `reason`
    then says what is missing.
    """

    repo_id: str
    revision: str
    published_at: datetime | None
    complete: bool = True
    reason: str = ""


@dataclass
class ReleaseFiles:
    """The raw bytes of a release's describing files, as fetched.

    `files` maps a name from `RELEASE_FILES` to its bytes, for the files the repo has.
    `safetensors_metadata`: the tensors read from the header of every weight file (the
    index's shards, else `model.safetensors`: `safetensors_headers.weight_files`), as
    {"total_size": bytes, "shard_count": files read, "tensors": {name: {"dtype": str,
    "shape": [int, ...]}}} plus "duplicates" ({"count", "names"}) when a name is in two
    files (dtype as safetensors names it: "BF16", "F8_E4M3"...); None when the repo has no
    safetensors file.
    `file_sizes` maps every file of the repo to its size in bytes where the hub says it.
    """

    repo_id: str
    revision: str
    files: dict[str, bytes] = field(default_factory=dict)
    safetensors_metadata: dict | None = None
    file_sizes: dict[str, int] = field(default_factory=dict)


class HubError(Exception):
    """A hub answered, or failed to answer, in a way the caller must record.

    `transient` says whether trying again later may succeed (network, 5xx, 429).
    """

    transient: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class HubAuthError(HubError):
    """401/403: the repo is gated or private and the token (if any) does not grant access."""


class HubNotFound(HubError):
    """404: no such repo, revision or file."""


class HubRateLimited(HubError):
    """429: the hub asks us to wait `retry_after_s` seconds (Retry-After / RateLimit headers)."""

    transient = True

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class HubUnavailable(HubError):
    """Network failure or 5xx: try again later."""

    transient = True


class HubSource(Protocol):
    """The interface each hub kind implements."""

    spec: HubSpec

    def list_releases(self, *, limit: int = 50) -> list[ReleaseCandidate]:
        """Repos the spec matches, newest first, each at its current revision.

        Raises a `HubError` subclass.
        """
        ...

    def latest_release(self, repo_id: str) -> ReleaseCandidate:
        """One repo at its current revision. Raises a `HubError` subclass."""
        ...

    def release_at(self, repo_id: str, revision: str) -> ReleaseCandidate:
        """`repo_id` at `revision`, with its completeness there. Raises a `HubError` subclass
        (`HubNotFound` for a revision the hub does not have, or no longer has)."""
        ...

    def fetch_release(self, repo_id: str, revision: str) -> ReleaseFiles:
        """The describing files of `repo_id` at `revision`. Raises a `HubError` subclass."""
        ...

    def fetch_files(self, repo_id: str, revision: str, names: list[str]) -> dict[str, bytes]:
        """The bytes of the named small files (the release's `*.py` modeling code) at
        `revision`. Raises `HubNotFound` naming a file the repo lacks, or another `HubError`."""
        ...


# Bits per element of each safetensors dtype (safetensors format spec).
SAFETENSORS_DTYPE_BITS: dict[str, int] = {
    "F64": 64, "I64": 64, "U64": 64, "C64": 64,
    "F32": 32, "I32": 32, "U32": 32,
    "F16": 16, "BF16": 16, "I16": 16, "U16": 16,
    "F8_E4M3": 8, "F8_E4M3FNUZ": 8, "F8_E5M2": 8, "F8_E5M2FNUZ": 8, "F8_E8M0": 8,
    "I8": 8, "U8": 8, "BOOL": 8,
    "F6_E2M3": 6, "F6_E3M2": 6,
    "F4": 4,
}  # fmt: skip

INDEX_FILE = "model.safetensors.index.json"

# `model-00003-of-00163.safetensors`: the shard naming transformers and the Hub use.
# Shard numbers of at most 9 digits: a longer one is no shard count (and int() of 5,000 digits
# raises past Python's int-string limit).
_SHARD_NAME_RE = re.compile(r"^(?P<stem>.*)-(?P<n>\d{1,9})-of-(?P<total>\d{1,9})\.safetensors$")


def tensor_nbytes(dtype: str, shape: Iterable[int]) -> int:
    """Bytes a tensor of `dtype` (a safetensors dtype name) and `shape` takes on disk.

    Raises ValueError for a dtype safetensors does not define.
    """
    bits = SAFETENSORS_DTYPE_BITS.get(dtype)
    if bits is None:
        raise ValueError(f"unknown safetensors dtype {dtype!r}")
    return math.ceil(math.prod(int(d) for d in shape) * bits / 8)


# One part of a repo id (the org or the name): 1 to 96 ASCII letters, digits, "_", "-" or
# ".", neither starting nor ending with "-" or "." (huggingface_hub's `validate_repo_id`).
_REPO_ID_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_REPO_ID_RE = re.compile(rf"{_REPO_ID_PART}/{_REPO_ID_PART}", re.ASCII)
REPO_ID_RULES = (
    "org/name, each 1 to 96 ASCII letters, digits, '_', '-' or '.', neither starting nor "
    "ending with '-' or '.', without '--', '..' or a '.git' ending"
)


def is_valid_repo_id(repo_id: object) -> bool:
    """Whether `repo_id` is an `org/name` Hub repo id, by the rules `huggingface_hub`'s
    `validate_repo_id` checks (`REPO_ID_RULES`), the org required. The whole string must
    match: no surrounding whitespace, no trailing newline, ASCII only."""
    return (
        isinstance(repo_id, str)
        and _REPO_ID_RE.fullmatch(repo_id) is not None
        and "--" not in repo_id
        and ".." not in repo_id
        and not repo_id.endswith(".git")
    )


def repo_matches(repo_id: str, pattern: str) -> bool:
    """Whether `repo_id` matches the fnmatch `pattern` ("" matches all), ignoring case as the
    Hub does for repo ids."""
    return not pattern or fnmatch.fnmatchcase(repo_id.lower(), pattern.lower())


def incomplete_reason(file_names: Iterable[str], index: bytes | None) -> str:
    """Why a release whose repo holds `file_names` is not complete yet; "" when it is.

    `index` is the content of `model.safetensors.index.json` when the repo has one. A release
    is incomplete without `config.json`, when its index names shard files the repo does not
    hold (yet), or when numbered shards (`...-00002-of-00004.safetensors`) are missing.
    """
    names = set(file_names)
    if "config.json" not in names:
        return "no config.json yet (upload in progress?)"
    if index is not None:
        try:
            parsed = parse_json_bytes(INDEX_FILE, index)
        except JSONFileError:  # deep nesting included: never a RecursionError
            return f"{INDEX_FILE} is not a JSON object yet (upload in progress?)"
        weight_map = parsed.get("weight_map") if isinstance(parsed, dict) else None
        if not isinstance(weight_map, dict):
            return f"{INDEX_FILE} has no weight_map yet (upload in progress?)"
        missing = sorted({str(shard) for shard in weight_map.values()} - names)
        if missing:
            shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
            return (
                f"{INDEX_FILE} names {fmt.counted(len(missing), 'shard')} not uploaded yet: {shown}"
            )
    numbered: dict[tuple[str, int], set[int]] = {}
    for name in names:
        if match := _SHARD_NAME_RE.match(name):
            key = (match["stem"], int(match["total"]))
            numbered.setdefault(key, set()).add(int(match["n"]))
    for (stem, total), present in sorted(numbered.items()):
        if len(present) < total:
            return f"only {len(present)} of {total} {stem}-*-of-* shards present yet"
    return ""

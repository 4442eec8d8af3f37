"""ModelScope (https://modelscope.cn, or a ModelScope-compatible endpoint) as a source of
releases.

Listing, model info and file lists go through ModelScope's official client, `modelscope_hub`
(`HubApi.list_repos`, `HubApi.get_repo` on its OpenAPI surface; the file list on its
`/api/v1` surface, whose entries name the commit that last changed each file). The client
has no ranged read, so the few describing files are downloaded, and every weight file's
safetensors header read by HTTP range requests (`safetensors_headers.read_hub_headers`, the
same bounded, parallel, 429-aware and cached reader as the Hugging Face source), at the
download URL the client builds. Never the weights: a server that ignores `Range` is read only
up to the bytes asked for.

Revisions are ModelScope's commit ids: a repo's revision is the newest commit among its
files' (`Revision` of the entry with the latest `CommittedDate`), its default branch is
`master`.

The client retries 429/5xx/network errors itself (sleeping on `Retry-After`); in a poll or a
Celery task that would hold a worker, so its clients are built here with one try each, and a
failure surfaces at once as a `HubError` for the caller to retry with its own backoff.

Tokens: `spec.token` when given; else `MODELSCOPE_API_TOKEN` (the kind's token variable),
but only to an endpoint `engine.hubs.trust.token_allowed` accepts (the configured ModelScope
or one the app allows); any other endpoint is asked without a token. The client never reads
a saved login here (its config folder is day0's own).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
from modelscope_hub import HubApi, HubConfig
from modelscope_hub import errors as ms_errors
from modelscope_hub._legacy_api import LegacyClient
from modelscope_hub._openapi import OpenAPIClient

from engine.hubs.base import (
    INDEX_FILE,
    RELEASE_FILES,
    HubAuthError,
    HubError,
    HubNotFound,
    HubRateLimited,
    HubSpec,
    HubUnavailable,
    ReleaseCandidate,
    ReleaseFiles,
    incomplete_reason,
    is_valid_repo_id,
    repo_matches,
)
from engine.hubs.http import (
    DEFAULT_RETRY_AFTER_S,
    DEFAULT_TIMEOUT_S,
    USER_AGENT,
    retry_after_seconds,
    unreachable_message,
)
from engine.hubs.kinds import canonical_endpoint, hub_kind_spec
from engine.hubs.safetensors_headers import HeaderCache, read_hub_headers, shown, weight_files
from engine.hubs.trust import token_allowed
from engine.json_files import JSONFileError, parse_json_bytes
from engine.paths import var_dir

logger = logging.getLogger(__name__)

T = TypeVar("T")

# ModelScope's default branch (the client's default revision).
DEFAULT_BRANCH = "master"
# Models per listing page (the client's compat layer uses at most 50).
LIST_PAGE_SIZE = 50
# Models read from a listing when a repo pattern filters it.
DEFAULT_SCAN_LIMIT = 200
# The listing is asked for the most recently changed models (a new release is one); day0
# then orders what it read by creation time, newest first.
LIST_SORT = "last_modified"
# Bytes of a weight file read first: its 8-byte length and, for nearly every file, its whole
# header (the Hugging Face client reads the same 100 kB).
FIRST_READ_BYTES = 100_000
# A header length past this is refused (huggingface_hub's cap for the same read).
MAX_HEADER_BYTES = 25_000_000
# A describing file (config, index, README, modeling code) larger than this is refused.
MAX_SMALL_FILE_BYTES = 32 * 2**20
# Files a listing may name, at most (the client's listing itself stops near 3,000 a folder).
MAX_LISTED_FILES = 100_000

_SHA_RE = re.compile(r"^[0-9a-f]{40}$")


class _OneTryLegacyClient(LegacyClient):
    """The client's `/api/v1` surface with one try per file-list page: it retries a page up
    to 4 times, sleeping up to 8 s each (`MODELSCOPE_REPO_TREE_PAGE_MAX_ATTEMPTS`)."""

    def _request_repo_tree(
        self,
        path: str,
        params: dict[str, Any],
        *,
        repo_id: str,
        authorized: bool,
        max_attempts: int | None = None,
    ) -> Any:
        return super()._request_repo_tree(
            path, params, repo_id=repo_id, authorized=authorized, max_attempts=1
        )


class _HTTPStatusError(Exception):
    """An error answer to one of this module's own requests (downloads, range reads).
    `response` is read by `safetensors_headers` (its status and `Retry-After`)."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


@dataclass(frozen=True)
class _TensorEntry:
    """One tensor as a header declares it, unchecked (`safetensors_headers` checks it)."""

    dtype: Any
    shape: Any
    data_offsets: Any


@dataclass(frozen=True)
class _HeaderRead:
    """What `safetensors_headers` reads of a parsed header: its `tensors`."""

    tensors: dict[str, _TensorEntry]


def _parse_header(raw: bytes, filename: str, subject: str) -> _HeaderRead:
    """The tensors of a safetensors header (`raw`: the JSON bytes after the length). Raises
    `HubError` naming the file for bytes that are not strict JSON (or nest too deeply) or a
    header that is not an object of objects."""
    try:
        parsed = parse_json_bytes(f"the safetensors header of {filename}", raw)
    except JSONFileError as exc:
        raise HubError(f"{subject}: {exc.message}") from exc
    if not isinstance(parsed, dict):
        raise HubError(f"{subject}: the safetensors header of {filename} is not a JSON object.")
    tensors: dict[str, _TensorEntry] = {}
    for name, entry in parsed.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise HubError(
                f"{subject}: the safetensors header of {filename} describes tensor {shown(name)}"
                f" as {shown(entry)}, not an object with a dtype, a shape and data_offsets."
            )
        tensors[name] = _TensorEntry(
            entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        )
    return _HeaderRead(tensors)


def _aware(value: Any) -> datetime | None:
    """A timezone-aware time from what the client made of a timestamp (a naive one is UTC)."""
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _newest_first(candidate: tuple[str, datetime | None]) -> tuple[bool, float]:
    published = candidate[1]
    return (published is None, -published.timestamp() if published else 0.0)


class ModelScopeSource:
    """Releases on ModelScope, read through `modelscope_hub.HubApi` (see the module notes).

    `spec.endpoint` (else `MODELSCOPE_ENDPOINT`, else https://modelscope.cn) is the hub,
    `spec.author` the organization whose models are listed. `timeout_s` bounds each request;
    `scan_limit` bounds how many models a patterned listing reads.

    Every method raises `HubAuthError` (401/403), `HubNotFound` (404), `HubRateLimited`
    (429, with `retry_after_s`), `HubUnavailable` (network, timeout, 5xx) or `HubError`
    (including what a release's own files make unreadable).
    """

    def __init__(
        self,
        spec: HubSpec,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        scan_limit: int = DEFAULT_SCAN_LIMIT,
    ) -> None:
        self.spec = spec
        self.endpoint = canonical_endpoint(spec)
        self.timeout_s = timeout_s
        self.scan_limit = scan_limit
        token = spec.token
        if token is None:
            variable = hub_kind_spec(spec.kind).token_variable
            allowed = token_allowed(self.endpoint, spec.kind)
            token = os.environ.get(variable, "") if allowed else ""
        self.token = token
        # An explicit token ("" too) keeps the client from reading a saved login, and its own
        # folder keeps it from writing into the worker's home.
        folder = var_dir("modelscope")
        config = HubConfig(
            endpoint=self.endpoint, token=token, config_dir=folder, cache_dir=folder / "cache"
        )
        self.api = HubApi(config=config, user_agent=USER_AGENT)
        self.api._openapi = OpenAPIClient(
            config, timeout=timeout_s, max_retries=1, user_agent=USER_AGENT
        )
        self.api._legacy = _OneTryLegacyClient(
            token=token,
            endpoint=self.endpoint,
            timeout=timeout_s,
            max_retries=0,
            user_agent=USER_AGENT,
        )
        headers = {"User-Agent": USER_AGENT}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # httpx drops Authorization on a redirect to another origin (a CDN's signed URL).
        self.http = httpx.Client(headers=headers, timeout=timeout_s, follow_redirects=True)

    # -- plumbing ----------------------------------------------------------------------------

    def _call(self, subject: str, fn: Callable[[], T]) -> T:
        """Run `fn` with the client's, httpx's and this module's errors mapped to `HubError`."""
        try:
            return fn()
        except HubError:
            raise
        except _HTTPStatusError as exc:
            raise self._status_error(
                subject, exc.response.status_code, exc.response.headers
            ) from exc
        except ms_errors.APIError as exc:
            if not exc.status_code:  # the client's own retry loop gave up, or it refused
                unavailable = isinstance(exc, ms_errors.ServerError)
                raise (HubUnavailable if unavailable else HubError)(
                    f"{subject}: {self.endpoint}: {exc.message}"
                ) from exc
            headers = getattr(getattr(exc, "response", None), "headers", None) or {}
            wait_s = getattr(exc, "retry_after", None)
            raise self._status_error(
                subject, exc.status_code, headers, said=exc.message, wait_s=wait_s
            ) from exc
        except (ms_errors.NetworkError, httpx.TimeoutException, httpx.TransportError) as exc:
            # The exception's class is for the log, not for the page that shows the message.
            logger.info("%s: cannot reach %s: %r", subject, self.endpoint, exc)
            raise HubUnavailable(
                f"{subject}: "
                + unreachable_message(self.endpoint, exc, endpoint_setting="MODELSCOPE_ENDPOINT")
            ) from exc
        except (ms_errors.HubError, OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("%s: unexpected answer from %s: %r", subject, self.endpoint, exc)
            raise HubError(
                f"{subject}: unexpected answer from {self.endpoint}: {exc or 'no detail given'}"
            ) from exc

    def _status_error(
        self,
        subject: str,
        status: int,
        headers: Mapping[str, str],
        *,
        said: str = "",
        wait_s: float | None = None,
    ) -> HubError:
        """The `HubError` for an HTTP error answer from ModelScope."""
        said = f" (hub says: {said})" if said else ""
        if status in (401, 403):
            return HubAuthError(
                f"{subject}: HTTP {status} from {self.endpoint}: the repo is private or gated (or"
                " does not exist) and the token does not grant access: set MODELSCOPE_API_TOKEN"
                f" to a token with access{said}."
            )
        if status == 404:
            return HubNotFound(
                f"{subject}: not found on {self.endpoint} (HTTP 404): check the repo id, revision"
                f" and file{said}."
            )
        if status == 429:
            if wait_s is None:
                wait_s = retry_after_seconds(dict(headers))
            told = "" if wait_s is not None else " (it did not say for how long)"
            wait_s = DEFAULT_RETRY_AFTER_S if wait_s is None else float(wait_s)
            return HubRateLimited(
                f"{subject}: rate limited by {self.endpoint} (HTTP 429){told}: retry in "
                f"{wait_s:g} s.",
                retry_after_s=wait_s,
            )
        if status == 408 or status >= 500:
            return HubUnavailable(
                f"{subject}: {self.endpoint} answered HTTP {status}: the hub is failing, retry "
                f"later{said}."
            )
        return HubError(f"{subject}: {self.endpoint} answered HTTP {status}{said}.")

    def file_url(self, repo_id: str, filename: str, revision: str) -> str:
        """Where the client downloads `filename` of `repo_id` at `revision`."""
        return self.api.legacy.get_download_url(repo_id, "model", filename, revision)

    def read_bytes(self, url: str, *, start: int = 0, end: int | None = None) -> bytes:
        """Bytes `start`..`end` (inclusive; None: to the end, at most `MAX_SMALL_FILE_BYTES`)
        of `url`, by a range request when a range is asked. A server that ignores `Range`
        is read only as far as asked. Raises `_HTTPStatusError` on an error answer, `HubError`
        for a file over the cap."""
        headers = {"Range": f"bytes={start}-{end}"} if end is not None else {}
        wanted = (end - start + 1) if end is not None else MAX_SMALL_FILE_BYTES + 1
        with self.http.stream("GET", url, headers=headers) as response:
            if response.status_code >= 400:
                response.read()
                raise _HTTPStatusError(response)
            skip = start if end is not None and response.status_code == 200 else 0
            body = bytearray()
            for chunk in response.iter_bytes():
                if skip:
                    dropped = min(skip, len(chunk))
                    chunk, skip = chunk[dropped:], skip - dropped
                body.extend(chunk)
                if len(body) >= wanted:
                    break
        if end is None and len(body) > MAX_SMALL_FILE_BYTES:
            raise HubError(
                f"{url}: the file is over {MAX_SMALL_FILE_BYTES // 2**20} MiB; day0 reads "
                "describing files up to that size."
            )
        return bytes(body[:wanted])

    def _download(self, repo_id: str, filename: str, revision: str) -> bytes:
        """A describing file's bytes, kept per commit (`<DAY0_VAR_DIR>/modelscope-files`)."""
        cached = None
        if _SHA_RE.match(revision):
            key = hashlib.sha256(f"{self.endpoint}\0{repo_id}\0{revision}".encode()).hexdigest()
            cached = var_dir("modelscope-files", key, filename.replace("/", "%2F"))
            if cached.is_file():
                return cached.read_bytes()
        data = self.read_bytes(self.file_url(repo_id, filename, revision))
        if cached is not None:
            _write_quietly(cached, data)
        return data

    def _files(self, repo_id: str, revision: str) -> tuple[dict[str, int], str]:
        """The repo's files at `revision` ({path: size in bytes}) and the commit id it names:
        `revision` itself when it is one, else the newest of its files' commits ("" for an
        empty repo). Raises `HubError` for a listing that is not ModelScope's."""
        entries = self.api.legacy.list_repo_files(
            repo_id=repo_id, repo_type="model", revision=revision, recursive=True
        )
        if not isinstance(entries, list) or len(entries) > MAX_LISTED_FILES:
            raise HubError(f"{repo_id}@{revision}: {self.endpoint} lists its files unreadably.")
        sizes: dict[str, int] = {}
        newest: tuple[float, str] | None = None
        for entry in entries:
            if not isinstance(entry, dict) or (entry.get("Type") or "blob") == "tree":
                continue
            path, size = entry.get("Path"), entry.get("Size")
            if not isinstance(path, str) or not path:
                continue
            if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
                sizes[path] = size
            else:
                sizes.setdefault(path, 0)
            commit, when = entry.get("Revision"), entry.get("CommittedDate")
            if isinstance(commit, str) and _SHA_RE.match(commit):
                stamp = float(when) if isinstance(when, int | float) else 0.0
                if newest is None or stamp > newest[0]:
                    newest = (stamp, commit)
        if _SHA_RE.match(revision):
            return sizes, revision
        if sizes and newest is None:
            raise HubError(
                f"{repo_id}@{revision}: {self.endpoint} names no commit for the repo's files "
                "(no 'Revision' in its file list): it does not answer like ModelScope."
            )
        return sizes, newest[1] if newest else ""

    def _candidate(
        self, repo_id: str, published_at: datetime | None, revision: str = DEFAULT_BRANCH
    ) -> ReleaseCandidate:
        sizes, commit = self._files(repo_id, revision)
        index = self._download(repo_id, INDEX_FILE, commit) if INDEX_FILE in sizes else None
        reason = incomplete_reason(sizes, index)
        return ReleaseCandidate(
            repo_id=repo_id,
            revision=commit,
            published_at=published_at,
            complete=not reason and bool(commit),
            reason=reason,
        )

    def _published_at(self, repo_id: str) -> datetime | None:
        return _aware(self.api.get_repo(repo_id, "model").created_at)

    # -- HubSource ---------------------------------------------------------------------------

    def list_releases(self, *, limit: int = 50) -> list[ReleaseCandidate]:
        """The newest models of `spec.author` (the organization; all if empty) matching
        `spec.repo_pattern`, newest first by creation time, at most `limit`.

        Reads the listing (most recently changed first, `LIST_PAGE_SIZE` a page; at most
        `scan_limit` models with a pattern, else `limit`), orders what matches by creation
        time, then lists the files of the newest `limit` (one request each, plus the index
        where there is one, kept per commit). Raises a `HubError` subclass.
        """
        author = self.spec.author or None
        pattern = self.spec.repo_pattern
        scan = max(limit, self.scan_limit) if pattern else limit
        subject = f"listing models of {author or 'all organizations'} on {self.endpoint}"

        def run() -> list[ReleaseCandidate]:
            seen: dict[str, datetime | None] = {}
            page_size = max(1, min(LIST_PAGE_SIZE, scan))
            page, read = 1, 0
            while read < scan:
                result = self.api.list_repos(
                    "model", owner=author, sort=LIST_SORT, page_number=page, page_size=page_size
                )
                for info in result.items:
                    read += 1
                    repo_id = info.repo_id
                    # A model of another organization (a server ignoring `owner`) or an id
                    # that is no repo id is not this watch's.
                    if not is_valid_repo_id(repo_id) or (
                        author and str(info.owner).lower() != author.lower()
                    ):
                        continue
                    if repo_matches(repo_id, pattern):
                        seen.setdefault(repo_id, _aware(info.created_at))
                if len(result.items) < page_size or page * page_size >= result.total_count:
                    break
                page += 1
            newest = sorted(seen.items(), key=_newest_first)[:limit]
            return [self._candidate(repo_id, published) for repo_id, published in newest]

        return self._call(subject, run)

    def latest_release(self, repo_id: str) -> ReleaseCandidate:
        """`repo_id` on its default branch: its newest commit, creation time and completeness.
        Raises a `HubError` subclass."""
        return self._call(repo_id, lambda: self._candidate(repo_id, self._published_at(repo_id)))

    def release_at(self, repo_id: str, revision: str) -> ReleaseCandidate:
        """`repo_id` at `revision` (a commit id, or a branch or tag ModelScope resolves), with
        its completeness there (`incomplete_reason`, as a listing). Raises a `HubError`
        subclass (`HubNotFound` for an unknown repo or revision)."""
        return self._call(
            f"{repo_id}@{revision}",
            lambda: self._candidate(repo_id, self._published_at(repo_id), revision),
        )

    def fetch_release(self, repo_id: str, revision: str) -> ReleaseFiles:
        """The describing files of `repo_id` at `revision` (a commit id, branch or tag).

        Downloads those of `RELEASE_FILES` the repo has and reads the header of every weight
        file (`safetensors_headers.weight_files`) with HTTP range requests, in parallel,
        cached per commit; never the weights. `file_sizes` (bytes) come from the file list.
        The returned `revision` is the commit id. Raises a `HubError` subclass
        (`HubRateLimited` once 429s outlast `safetensors_headers.MAX_RATE_LIMIT_WAIT_S`).
        """

        def run() -> ReleaseFiles:
            sizes, commit = self._files(repo_id, revision)
            commit = commit or revision
            fetched = ReleaseFiles(repo_id=repo_id, revision=commit, file_sizes=dict(sizes))
            for name in RELEASE_FILES:
                if name in sizes:
                    fetched.files[name] = self._download(repo_id, name, commit)
            shards = weight_files(sizes, fetched.files.get(INDEX_FILE))
            if shards:
                fetched.safetensors_metadata = read_hub_headers(
                    _HeaderReader(self),
                    repo_id,
                    commit,
                    shards,
                    cache=HeaderCache(self.endpoint, repo_id, commit),
                    timeout_s=self.timeout_s,
                )
            return fetched

        return self._call(f"{repo_id}@{revision}", run)

    def fetch_files(self, repo_id: str, revision: str, names: list[str]) -> dict[str, bytes]:
        """The named files of `repo_id` at `revision` (the release's `*.py` modeling code).
        Raises a `HubError` subclass (`HubNotFound` for a file the repo lacks)."""

        def run() -> dict[str, bytes]:
            return {name: self._download(repo_id, name, revision) for name in names}

        return self._call(f"{repo_id}@{revision}: {', '.join(names)}", run)


class _HeaderReader:
    """What `safetensors_headers.read_hub_headers` calls to read one header: two range
    requests at most (the first `FIRST_READ_BYTES`, then the rest of a longer header)."""

    def __init__(self, source: ModelScopeSource) -> None:
        self.source = source

    def parse_safetensors_file_metadata(
        self, repo_id: str, filename: str, *, revision: str, timeout: float
    ) -> _HeaderRead:
        """The parsed header of `filename`. Raises `_HTTPStatusError` for an error answer
        (a 429 is waited out by the caller), `HubError` naming the file for a header that is
        too short, too long or not a header."""
        subject = f"{repo_id}@{revision}"
        url = self.source.file_url(repo_id, filename, revision)
        first = self.source.read_bytes(url, start=0, end=FIRST_READ_BYTES - 1)
        if len(first) < 8:
            raise HubError(f"{subject}: {filename} is too short to be a safetensors file.")
        length = int.from_bytes(first[:8], "little")
        if length > MAX_HEADER_BYTES:
            raise HubError(
                f"{subject}: {filename} declares a {length:,}-byte safetensors header; day0 "
                f"reads headers of at most {MAX_HEADER_BYTES:,} bytes."
            )
        if length <= len(first) - 8:
            raw = first[8 : 8 + length]
        else:
            raw = self.source.read_bytes(url, start=8, end=length + 7)
        if len(raw) < length:
            raise HubError(
                f"{subject}: {filename} ends before its {length:,}-byte safetensors header does."
            )
        return _parse_header(raw, filename, subject)


def _write_quietly(path: Path, data: bytes) -> None:
    """Keep `data` at `path` (written under a temporary name, then renamed into place); a
    disk that refuses costs a download later, nothing else."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except OSError:
        pass

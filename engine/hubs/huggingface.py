"""The Hugging Face Hub (or any Hub-compatible mirror) as a source of releases.

All traffic goes through `huggingface_hub.HfApi`, so its caching, auth (`HF_TOKEN`) and
`HF_ENDPOINT` conventions hold. Only the describing files are downloaded; every weight file's
safetensors header is read with HTTP range requests (`safetensors_headers.py`), never the
weights.

The library retries 429/5xx/network errors itself, up to 5 times, sleeping up to 8 s or a
whole `Retry-After` each time. In a poll or a Celery task that would hold a worker for
minutes, so calls made here run with those retries switched off: a failure surfaces at once
as a `HubError` and the caller (poller, task) schedules the retry with its own backoff. The
one exception is the header reads: one of many files' headers meeting a 429 is retried here
within a short budget, so that a release's hundred range requests are not started over.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx2
from huggingface_hub import HfApi
from huggingface_hub.errors import (
    FileMetadataError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    NotASafetensorsRepoError,
    OfflineModeIsEnabled,
    SafetensorsParsingError,
)
from huggingface_hub.hf_api import ModelInfo

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
    repo_matches,
)
from engine.hubs.http import (
    DAY0_VERSION,
    DEFAULT_RETRY_AFTER_S,
    DEFAULT_TIMEOUT_S,
    retry_after_seconds,
    unreachable_message,
)
from engine.hubs.kinds import canonical_endpoint, hub_kind_spec
from engine.hubs.safetensors_headers import HeaderCache, read_hub_headers, weight_files
from engine.hubs.trust import token_allowed

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Properties asked of a listing so that one request gives sha, date and file names.
_LIST_EXPAND = ["createdAt", "sha", "siblings"]

# Models read from a listing when a repo pattern filters it (the newest first).
DEFAULT_SCAN_LIMIT = 200

# Set (to a timeout in seconds) while this module calls the library; see _bound_library_retries.
_bounded_timeout_s: ContextVar[float | None] = ContextVar("day0_hf_bounded_timeout_s", default=None)


def _bound_library_retries() -> None:
    """Make huggingface_hub's retry loop give up after one try inside day0's calls.

    The library has no setting for its retries, so its loop function is wrapped once; the
    wrapper changes nothing unless `_bounded_timeout_s` is set (i.e. outside this module's
    calls the library behaves as shipped). It also gives the listing, which the library
    sends without a timeout, our timeout.
    """
    from huggingface_hub.utils import _http as hf_http

    original = getattr(hf_http, "_http_backoff_base", None)
    if original is None:
        logger.warning("this huggingface_hub has no _http_backoff_base: its retries stay on")
        return
    if getattr(original, "day0_bounded", False):
        return

    @functools.wraps(original)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        timeout_s = _bounded_timeout_s.get()
        if timeout_s is not None:
            kwargs["max_retries"] = 0
            if kwargs.get("timeout") is None:
                kwargs["timeout"] = timeout_s
        return original(*args, **kwargs)

    bounded.day0_bounded = True  # type: ignore[attr-defined]
    hf_http._http_backoff_base = bounded


_bound_library_retries()


def _cache_dir_from_env() -> str | None:
    """`HF_HUB_CACHE`, else `HF_HOME`/hub, read now (the library reads them once at import)."""
    if hub_cache := os.environ.get("HF_HUB_CACHE"):
        return hub_cache
    if hf_home := os.environ.get("HF_HOME"):
        return str(Path(hf_home) / "hub")
    return None


def _exception_chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _error_from_response(subject: str, endpoint: str, response: httpx2.Response) -> HubError:
    """The `HubError` for an HTTP error answer from the hub."""
    status = response.status_code
    code = response.headers.get("X-Error-Code", "")
    said = response.headers.get("X-Error-Message", "")
    said = f" (hub says: {said})" if said else ""
    if status in (401, 403):
        return HubAuthError(
            f"{subject}: HTTP {status} from {endpoint}: the repo is gated or private (or does not"
            f" exist) and the token does not grant access: set HF_TOKEN to a token with access,"
            f" and accept the model's terms on the hub if it is gated{said}."
        )
    if status == 404:
        what = {
            "RepoNotFound": "no such repo",
            "RevisionNotFound": "no such revision",
            "EntryNotFound": "no such file",
        }.get(code, "not found")
        return HubNotFound(
            f"{subject}: {what} on {endpoint} (HTTP 404): check the repo id and revision{said}."
        )
    if status == 429:
        wait_s = retry_after_seconds(response.headers)
        told = "" if wait_s is not None else " (it did not say for how long)"
        wait_s = DEFAULT_RETRY_AFTER_S if wait_s is None else wait_s
        return HubRateLimited(
            f"{subject}: rate limited by {endpoint} (HTTP 429){told}: retry in {wait_s:g} s.",
            retry_after_s=wait_s,
        )
    if status == 408 or status >= 500:
        return HubUnavailable(
            f"{subject}: {endpoint} answered HTTP {status}: the hub is failing, retry later{said}."
        )
    return HubError(f"{subject}: {endpoint} answered HTTP {status}{said}.")


def _to_hub_error(exc: BaseException, subject: str, endpoint: str) -> HubError:
    """Map what `huggingface_hub`/`httpx2` raised to a `HubError` (see module errors)."""
    for link in _exception_chain(exc):
        if isinstance(link, HfHubHTTPError):
            return _error_from_response(subject, endpoint, link.response)
        if isinstance(link, httpx2.HTTPStatusError):
            return _error_from_response(subject, endpoint, link.response)
    for link in _exception_chain(exc):
        if isinstance(link, OfflineModeIsEnabled):
            return HubUnavailable(f"{subject}: HF_HUB_OFFLINE is set, so {endpoint} is not asked.")
        if isinstance(link, httpx2.TransportError):  # timeouts included
            # The exception's class is for the log, not for the page that shows the message.
            logger.info("%s: cannot reach %s: %r", subject, endpoint, link)
            return HubUnavailable(
                f"{subject}: " + unreachable_message(endpoint, link, endpoint_setting="HF_ENDPOINT")
            )
        if isinstance(link, FileMetadataError):
            return HubError(
                f"{subject}: {endpoint} does not answer like a Hugging Face Hub ({link}): check"
                " HF_ENDPOINT / the watch's endpoint."
            )
    if isinstance(exc, SafetensorsParsingError | NotASafetensorsRepoError):
        return HubError(f"{subject}: cannot read safetensors headers: {exc}")
    if isinstance(exc, HFValidationError):
        return HubError(f"{subject}: not a valid repo id or revision: {exc}")
    if isinstance(exc, LocalEntryNotFoundError):
        return HubUnavailable(f"{subject}: could not download from {endpoint}: {exc}")
    logger.warning("%s: unexpected answer from %s: %r", subject, endpoint, exc)
    return HubError(f"{subject}: unexpected answer from {endpoint}: {exc or 'no detail given'}")


class HuggingFaceSource:
    """Releases on a Hugging Face Hub, read through `huggingface_hub.HfApi`.

    `spec.endpoint` (else `HF_ENDPOINT`, else https://huggingface.co) is the Hub; `spec.token`
    authenticates, else `HF_TOKEN` / the saved login (as the library reads it), but only on an
    endpoint that may receive it (`engine.hubs.trust.token_allowed`: the configured hub or
    one the app allows); any other endpoint is asked without a token. A Hub-compatible kind
    with a row of its own (`engine.hubs.kinds`) reads its own endpoint and token variables
    the same way, and never sends `HF_TOKEN`. Downloads land
    in `cache_dir` (else `HF_HUB_CACHE`, else `HF_HOME`/hub, else the library's default), so a
    release's files are fetched once per revision. `timeout_s` bounds each request;
    `scan_limit` bounds how many of the newest models a patterned listing reads.

    Every method raises `HubAuthError` (401/403), `HubNotFound` (404), `HubRateLimited`
    (429, with `retry_after_s`), `HubUnavailable` (network, timeout, 5xx) or `HubError`.
    """

    def __init__(
        self,
        spec: HubSpec,
        *,
        cache_dir: str | Path | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        scan_limit: int = DEFAULT_SCAN_LIMIT,
    ) -> None:
        self.spec = spec
        self.endpoint = canonical_endpoint(spec)
        self.cache_dir = str(cache_dir) if cache_dir is not None else _cache_dir_from_env()
        self.timeout_s = timeout_s
        self.scan_limit = scan_limit
        # None lets the library send HF_TOKEN or the saved login; False sends no token at all.
        token: str | bool | None = spec.token
        if token is None:
            variable = hub_kind_spec(spec.kind).token_variable
            if not token_allowed(self.endpoint, spec.kind):
                token = False
            elif variable != "HF_TOKEN":
                # A Hub-compatible kind of its own row: its own token, never Hugging Face's.
                token = os.environ.get(variable) or False
        self.sends_hf_token = token is None
        self.api = HfApi(
            endpoint=self.endpoint,
            token=token,
            library_name="day0",
            library_version=DAY0_VERSION,
        )

    # -- plumbing ----------------------------------------------------------------------------

    def _call(self, subject: str, fn: Callable[[], T]) -> T:
        """Run `fn` (library calls) with retries bounded and errors mapped to `HubError`."""
        token = _bounded_timeout_s.set(self.timeout_s)
        try:
            return fn()
        except HubError:
            raise
        except (
            HfHubHTTPError,
            httpx2.HTTPError,
            OSError,
            ValueError,
            SafetensorsParsingError,
            NotASafetensorsRepoError,
        ) as exc:
            raise _to_hub_error(exc, subject, self.endpoint) from exc
        finally:
            _bounded_timeout_s.reset(token)

    def _download(self, repo_id: str, filename: str, revision: str) -> bytes:
        path = self.api.hf_hub_download(
            repo_id,
            filename,
            revision=revision,
            cache_dir=self.cache_dir,
            etag_timeout=self.timeout_s,
        )
        return Path(path).read_bytes()

    def _candidate(self, info: ModelInfo) -> ReleaseCandidate:
        """A candidate from a model's info, which must carry sha and siblings."""
        names = [s.rfilename for s in info.siblings or []]
        index = self._download(info.id, INDEX_FILE, info.sha) if INDEX_FILE in names else None
        reason = incomplete_reason(names, index)
        return ReleaseCandidate(
            repo_id=info.id,
            revision=info.sha or "",
            published_at=info.created_at,
            complete=not reason,
            reason=reason,
        )

    def _model_info(self, repo_id: str, revision: str | None = None, **kwargs: Any) -> ModelInfo:
        return self.api.model_info(repo_id, revision=revision, timeout=self.timeout_s, **kwargs)

    # -- HubSource ---------------------------------------------------------------------------

    def list_releases(self, *, limit: int = 50) -> list[ReleaseCandidate]:
        """The newest models of `spec.author` (all authors if empty) matching
        `spec.repo_pattern`, newest first (by `createdAt`), at most `limit`.

        One listing request gives ids, shas, dates and file names; a repo's info is asked
        for only when the listing lacks them, and an index only for repos that have one (it
        is cached per revision). With a pattern, at most `scan_limit` models are read.
        Raises a `HubError` subclass.
        """
        author = self.spec.author or None
        pattern = self.spec.repo_pattern
        scan = max(limit, self.scan_limit) if pattern else limit
        subject = f"listing models of {author or 'all authors'} on the hub"

        def run() -> list[ReleaseCandidate]:
            listing = self.api.list_models(
                author=author, sort="created_at", limit=scan, expand=_LIST_EXPAND
            )
            candidates: list[ReleaseCandidate] = []
            for info in listing:
                if not repo_matches(info.id, pattern):
                    continue
                if not info.sha or info.siblings is None or info.created_at is None:
                    info = self._model_info(info.id)  # a mirror that ignores `expand`
                candidates.append(self._candidate(info))
                if len(candidates) >= limit:
                    break
            return candidates

        candidates = self._call(subject, run)
        # The Hub already sorts; this keeps the contract on mirrors that ignore `sort`.
        return sorted(candidates, key=_newest_first)

    def latest_release(self, repo_id: str) -> ReleaseCandidate:
        """`repo_id` at its current revision (sha, `createdAt`, completeness).

        Raises a `HubError` subclass.
        """
        return self._call(repo_id, lambda: self._candidate(self._model_info(repo_id)))

    def release_at(self, repo_id: str, revision: str) -> ReleaseCandidate:
        """`repo_id` at `revision` (a commit sha, or a branch the hub resolves): the sha the
        hub resolved, `createdAt`, and whether the upload is complete there (the same
        `incomplete_reason` as a listing: config present, every indexed shard present). A
        webhook's coalesced upload is checked here at the last sha it announced.

        Raises a `HubError` subclass (`HubNotFound` for an unknown repo or revision).
        """
        return self._call(
            f"{repo_id}@{revision}",
            lambda: self._candidate(self._model_info(repo_id, revision)),
        )

    def fetch_release(self, repo_id: str, revision: str) -> ReleaseFiles:
        """The describing files of `repo_id` at `revision` (a sha, branch or tag).

        Downloads those of `RELEASE_FILES` the repo has and reads the header of every weight
        file (`safetensors_headers.weight_files`: the index's shards, else
        `model.safetensors`) with HTTP range requests, in parallel, cached per commit; never
        the weights. `file_sizes` (bytes) come from the repo's file metadata. The returned
        `revision` is the commit sha the hub resolved. Raises a `HubError` subclass
        (`HubRateLimited` once 429s outlast `safetensors_headers.MAX_RATE_LIMIT_WAIT_S`).
        """

        def run() -> ReleaseFiles:
            info = self._model_info(repo_id, revision, files_metadata=True)
            commit = info.sha or revision
            siblings = info.siblings or []
            names = [s.rfilename for s in siblings]
            fetched = ReleaseFiles(
                repo_id=repo_id,
                revision=commit,
                file_sizes={s.rfilename: s.size for s in siblings if s.size is not None},
            )
            for name in RELEASE_FILES:
                if name in names:
                    fetched.files[name] = self._download(repo_id, name, commit)
            shards = weight_files(names, fetched.files.get(INDEX_FILE))
            if shards:
                fetched.safetensors_metadata = read_hub_headers(
                    self.api,
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

        Raises a `HubError` subclass (`HubNotFound` for a file the repo lacks).
        """

        def run() -> dict[str, bytes]:
            return {name: self._download(repo_id, name, revision) for name in names}

        return self._call(f"{repo_id}@{revision}: {', '.join(names)}", run)


def _newest_first(candidate: ReleaseCandidate) -> tuple[bool, float]:
    published: datetime | None = candidate.published_at
    return (published is None, -published.timestamp() if published else 0.0)

"""A local HTTP server that answers like the Hugging Face Hub, for tests (no internet needed).

It serves the endpoints that the installed `huggingface_hub` calls for `HfApi.list_models`,
`HfApi.model_info`, `hf_hub_download` (HEAD then GET on `/resolve/`) and
`HfApi.parse_safetensors_file_metadata` (GET with a `Range` header):

- `GET /api/models?author=&search=&sort=createdAt&limit=&expand=&full=` (newest first; a
  `Link: <...>; rel="next"` header when `page_size` cuts a page);
- `GET /api/models/{org}/{name}` and `GET /api/models/{org}/{name}/revision/{rev}`
  (`?blobs=true` adds sizes, blob ids and LFS info to `siblings`);
- `HEAD|GET /{org}/{name}/resolve/{rev}/{path}` with `X-Repo-Commit`, `ETag`,
  `X-Linked-Etag`/`X-Linked-Size` (for `*.safetensors`, served as LFS files),
  `Content-Length`, `Accept-Ranges` and `206 Partial Content` for `Range: bytes=a-b`.

Errors look like the Hub's: `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`,
`EntryNotFound`, `GatedRepo`) and `X-Error-Message` headers. `fail_next()` injects any status
with any headers (429 with `Retry-After`, 500, 403...). Every request is logged in `requests`.

Use it from a test:

    # the fixture from this module (re-exported by tests/engine/hubs/conftest.py)
    def test_x(fake_hub):
        sha = fake_hub.add_repo("org/model", {"config.json": b"{}"})
        source = HuggingFaceSource(HubSpec(kind="huggingface", endpoint=fake_hub.url))

or point `HF_ENDPOINT` at `fake_hub.url` (in-process: `monkeypatch.setenv`; for a worker
process: pass `fake_hub.env()` in its environment).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import pytest

_OCTETS = "application/octet-stream"
_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")
_RESOLVE_RE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_MODEL_API_RE = re.compile(r"^/api/models/([^/]+/[^/]+?)(?:/revision/([^/]+))?/?$")

# Fields the real Hub returns for a listing without `expand`/`full` (no sha, no siblings).
_LIST_DEFAULT_FIELDS = ("id", "createdAt", "private", "gated", "downloads", "likes", "tags")


@dataclass
class LoggedRequest:
    """One request the fake Hub answered. `bytes_sent` counts body bytes (0 for HEAD)."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    status: int
    bytes_sent: int

    @property
    def range(self) -> str | None:
        """The request's `Range` header, if any."""
        return self.headers.get("range")


@dataclass
class _Commit:
    sha: str
    files: dict[str, bytes]
    committed_at: datetime


@dataclass
class _Repo:
    repo_id: str
    created_at: datetime
    gated: bool
    private: bool
    commits: list[_Commit] = field(default_factory=list)

    @property
    def head(self) -> _Commit:
        return self.commits[-1]

    def commit(self, revision: str) -> _Commit | None:
        if revision == "main":
            return self.head
        return next((c for c in self.commits if c.sha == revision), None)


@dataclass
class _Failure:
    path_prefix: str
    status: int
    headers: dict[str, str]
    body: bytes
    remaining: int
    method: str | None
    delay_s: float


def _iso(dt: datetime) -> str:
    """The Hub's timestamp format: `2024-07-23T14:52:53.000Z`."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def _is_lfs(path: str) -> bool:
    return path.endswith((".safetensors", ".bin", ".pt", ".gguf"))


class FakeHub:
    """A threaded Hub look-alike on 127.0.0.1, port chosen by the OS.

    Register repos with `add_repo`; start with `start()` or `with FakeHub() as hub:`; read
    `url`. `valid_tokens` are the bearer tokens that open gated and private repos.
    `page_size` (None: no paging) splits `/api/models` answers into pages with a `Link`
    header, as the Hub does.
    """

    def __init__(self, *, valid_tokens: set[str] | None = None, page_size: int | None = None):
        self.valid_tokens: set[str] = set(valid_tokens or {"hf_fake_valid_token"})
        self.page_size = page_size
        self.requests: list[LoggedRequest] = []
        self._repos: dict[str, _Repo] = {}
        self._failures: list[_Failure] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._clock = datetime(2025, 1, 1, tzinfo=UTC)

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL to use as a Hub endpoint, e.g. `http://127.0.0.1:40123` (no trailing /)."""
        if self._server is None:
            raise RuntimeError("FakeHub is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeHub:
        """Start serving in a daemon thread. Returns self."""
        hub = self

        class Handler(_Handler):
            fake_hub = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            # A short poll interval makes stop() (hence each test's teardown) quick.
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.02},
            name="fakehub",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (a later request fails to connect)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """Environment variables that point `huggingface_hub` (and day0) at this server."""
        return {"HF_ENDPOINT": self.url, "HF_HUB_DISABLE_TELEMETRY": "1"}

    # -- content -----------------------------------------------------------------------------

    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, bytes],
        *,
        sha: str | None = None,
        created_at: datetime | None = None,
        gated: bool = False,
        private: bool = False,
    ) -> str:
        """Create `repo_id` with `files`, or push them as a new commit if it exists.

        Returns the commit sha (40 hex digits; by default derived from the repo id and the
        files, so the same content is the same commit). A new commit keeps the repo's
        `createdAt`; older commits stay reachable by sha. Without `created_at`, each new repo
        is one minute newer than the previous one (2025-01-01 onwards).
        """
        files = dict(files)
        if sha is None:
            digest = hashlib.sha1(repo_id.encode())
            for name in sorted(files):
                digest.update(name.encode() + b"\0" + files[name] + b"\0")
            sha = digest.hexdigest()
        with self._lock:
            repo = self._repos.get(repo_id)
            if repo is None:
                if created_at is None:
                    self._clock += timedelta(minutes=1)
                    created_at = self._clock
                repo = _Repo(repo_id, created_at=created_at, gated=gated, private=private)
                self._repos[repo_id] = repo
            else:
                repo.gated, repo.private = gated, private
            committed_at = max(datetime.now(UTC), repo.created_at)
            repo.commits.append(_Commit(sha=sha, files=files, committed_at=committed_at))
        return sha

    def remove_repo(self, repo_id: str) -> None:
        """Delete a repo (later requests get 404 RepoNotFound)."""
        with self._lock:
            self._repos.pop(repo_id, None)

    def fail_next(
        self,
        path_prefix: str,
        status: int,
        headers: Mapping[str, str] | None = None,
        *,
        times: int = 1,
        body: bytes | None = None,
        method: str | None = None,
        delay_s: float = 0.0,
    ) -> None:
        """Answer the next `times` requests whose path starts with `path_prefix` with `status`.

        `path_prefix` is matched on the URL path without the query, e.g. "/api/models" (any
        listing or info call) or "/Qwen/Qwen3-8B/resolve/" (downloads of one repo). `method`
        limits it to "GET" or "HEAD". Give `times` above 1 for a client that retries.
        `delay_s` stalls that long before answering (to trip a client's timeout).
        """
        payload = body if body is not None else json.dumps({"error": f"injected {status}"}).encode()
        with self._lock:
            self._failures.append(
                _Failure(path_prefix, status, dict(headers or {}), payload, times, method, delay_s)
            )

    # -- request log -------------------------------------------------------------------------

    def requests_to(self, path_part: str) -> list[LoggedRequest]:
        """Logged requests whose path contains `path_part`."""
        with self._lock:
            return [r for r in self.requests if path_part in r.path]

    def clear_log(self) -> None:
        """Forget the logged requests."""
        with self._lock:
            self.requests.clear()

    # -- used by the handler -----------------------------------------------------------------

    def _take_failure(self, method: str, path: str) -> _Failure | None:
        with self._lock:
            for failure in self._failures:
                if path.startswith(failure.path_prefix) and failure.method in (None, method):
                    failure.remaining -= 1
                    if failure.remaining <= 0:
                        self._failures.remove(failure)
                    return failure
        return None

    def _log(self, entry: LoggedRequest) -> None:
        with self._lock:
            self.requests.append(entry)

    def _repo(self, repo_id: str) -> _Repo | None:
        with self._lock:
            return self._repos.get(repo_id)

    def _all_repos(self) -> list[_Repo]:
        with self._lock:
            return list(self._repos.values())


class _Handler(BaseHTTPRequestHandler):
    fake_hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Keep test output quiet; the hub's own request log is the record."""

    # -- plumbing ----------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def _dispatch(self, method: str) -> None:
        split = urlsplit(self.path)
        path = unquote(split.path)
        query = parse_qs(split.query)
        self._logged = LoggedRequest(
            method=method,
            path=path,
            query=query,
            headers={k.lower(): v for k, v in self.headers.items()},
            status=0,
            bytes_sent=0,
        )
        try:
            failure = self.fake_hub._take_failure(method, path)
            if failure is not None:
                time.sleep(failure.delay_s)
                self._send(failure.status, failure.body, failure.headers, method=method)
            elif path == "/api/models":
                self._list_models(query, method)
            elif match := _MODEL_API_RE.match(path):
                self._model_info(match.group(1), match.group(2) or "main", query, method)
            elif match := _RESOLVE_RE.match(path):
                self._resolve(match.group(1), match.group(2), match.group(3), method)
            else:
                self._error(404, "EntryNotFound", f"No route for {path}", method=method)
        finally:
            if self._logged.status == 0:  # the handler failed before answering
                self.fake_hub._log(self._logged)

    def _send(
        self,
        status: int,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        *,
        method: str,
        content_type: str = "application/json",
    ) -> None:
        # Log before answering: a test reads the log as soon as its client has the answer.
        self._logged.status = status
        self._logged.bytes_sent = 0 if method == "HEAD" else len(body)
        self.fake_hub._log(self._logged)
        self.send_response(status)
        sent_headers = {"Content-Type": content_type, "Content-Length": str(len(body))}
        sent_headers.update(headers or {})
        for name, value in sent_headers.items():
            self.send_header(name, value)
        # One request per connection: no stale keep-alive sockets survive a stopped server.
        self.send_header("Connection", "close")
        self.close_connection = True
        try:
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test); nothing to answer to

    def _json(
        self, status: int, payload: object, headers: Mapping[str, str] | None = None, *, method: str
    ) -> None:
        self._send(status, json.dumps(payload).encode(), headers, method=method)

    def _error(
        self,
        status: int,
        code: str,
        message: str,
        headers: Mapping[str, str] | None = None,
        *,
        method: str,
    ) -> None:
        all_headers = {"X-Error-Code": code, "X-Error-Message": message, **(headers or {})}
        self._json(status, {"error": message}, all_headers, method=method)

    def _authorized(self) -> bool:
        auth = self.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
        return token in self.fake_hub.valid_tokens

    def _has_auth(self) -> bool:
        return bool(self.headers.get("Authorization"))

    # -- endpoints ---------------------------------------------------------------------------

    def _list_models(self, query: dict[str, list[str]], method: str) -> None:
        author = query.get("author", [""])[0]
        search = query.get("search", [""])[0]
        sort = query.get("sort", ["createdAt"])[0]
        limit = int(query["limit"][0]) if "limit" in query else None
        offset = int(query.get("offset", ["0"])[0])
        expand = query.get("expand", [])
        full = query.get("full", ["False"])[0].lower() == "true"

        repos = [
            r
            for r in self.fake_hub._all_repos()
            if (not author or r.repo_id.split("/")[0].lower() == author.lower())
            and (not search or search.lower() in r.repo_id.lower())
            and (not r.private or self._authorized())
        ]
        if sort == "lastModified":
            repos.sort(key=lambda r: r.head.committed_at, reverse=True)
        else:  # the Hub sorts descending; createdAt is what day0 asks for
            repos.sort(key=lambda r: r.created_at, reverse=True)
        if limit is not None:
            repos = repos[:limit]

        page_size = self.fake_hub.page_size
        headers: dict[str, str] = {}
        if page_size is not None:
            page = repos[offset : offset + page_size]
            if offset + page_size < len(repos):
                next_query = {k: v for k, v in query.items() if k != "offset"}
                next_query["offset"] = [str(offset + page_size)]
                next_url = f"{self.fake_hub.url}/api/models?{urlencode(next_query, doseq=True)}"
                headers["Link"] = f'<{next_url}>; rel="next"'
        else:
            page = repos
        items = [self._model_json(r, r.head, blobs=False) for r in page]
        if expand:
            items = [{k: v for k, v in i.items() if k in {"_id", "id", *expand}} for i in items]
        elif not full:
            items = [{k: v for k, v in i.items() if k in _LIST_DEFAULT_FIELDS} for i in items]
        self._json(200, items, headers, method=method)

    def _model_info(
        self, repo_id: str, revision: str, query: dict[str, list[str]], method: str
    ) -> None:
        repo = self.fake_hub._repo(repo_id)
        if repo is None or (repo.private and not self._authorized()):
            self._error(404, "RepoNotFound", "Repository not found", method=method)
            return
        commit = repo.commit(revision)
        if commit is None:
            self._error(404, "RevisionNotFound", "Invalid rev id: " + revision, method=method)
            return
        blobs = query.get("blobs", ["False"])[0].lower() == "true"
        self._json(200, self._model_json(repo, commit, blobs=blobs), method=method)

    def _model_json(self, repo: _Repo, commit: _Commit, *, blobs: bool) -> dict:
        siblings = []
        for name, content in sorted(commit.files.items()):
            sibling: dict[str, object] = {"rfilename": name}
            if blobs:
                sibling["size"] = len(content)
                sibling["blobId"] = hashlib.sha1(content).hexdigest()
                if _is_lfs(name):
                    sibling["lfs"] = {
                        "size": len(content),
                        "sha256": hashlib.sha256(content).hexdigest(),
                        "pointerSize": 134,
                    }
            siblings.append(sibling)
        return {
            "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": commit.sha,
            "createdAt": _iso(repo.created_at),
            "lastModified": _iso(commit.committed_at),
            "private": repo.private,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": ["safetensors"],
            "library_name": "transformers",
            "siblings": siblings,
        }

    def _resolve(self, repo_id: str, revision: str, filename: str, method: str) -> None:
        repo = self.fake_hub._repo(repo_id)
        if repo is None or (repo.private and not self._authorized()):
            self._error(404, "RepoNotFound", "Repository not found", method=method)
            return
        if repo.gated and not self._authorized():
            # The Hub answers 401 without a token and 403 with one that has no access.
            status = 403 if self._has_auth() else 401
            message = (
                f"Access to model {repo_id} is restricted and you are not in the authorized list."
            )
            self._error(status, "GatedRepo", message, method=method)
            return
        commit = repo.commit(revision)
        if commit is None:
            self._error(404, "RevisionNotFound", "Invalid rev id: " + revision, method=method)
            return
        content = commit.files.get(filename)
        if content is None:
            headers = {"X-Repo-Commit": commit.sha}
            self._error(404, "EntryNotFound", "Entry not found", headers, method=method)
            return

        etag = hashlib.sha256(content).hexdigest()
        headers = {
            "X-Repo-Commit": commit.sha,
            "ETag": f'"{etag}"',
            "Accept-Ranges": "bytes",
        }
        if _is_lfs(filename):
            headers["X-Linked-Etag"] = f'"{etag}"'
            headers["X-Linked-Size"] = str(len(content))

        range_header = self.headers.get("Range")
        if range_header and method == "GET":
            match = _RANGE_RE.match(range_header.strip())
            if match is None or not (match.group(1) or match.group(2)):
                self._send(416, b"", {"Content-Range": f"bytes */{len(content)}"}, method=method)
                return
            if match.group(1):
                start = int(match.group(1))
                end = (
                    min(int(match.group(2)), len(content) - 1)
                    if match.group(2)
                    else len(content) - 1
                )
            else:  # suffix range: the last N bytes
                start, end = max(0, len(content) - int(match.group(2))), len(content) - 1
            if start >= len(content):
                self._send(416, b"", {"Content-Range": f"bytes */{len(content)}"}, method=method)
                return
            headers["Content-Range"] = f"bytes {start}-{end}/{len(content)}"
            body = content[start : end + 1]
            self._send(206, body, headers, method=method, content_type=_OCTETS)
            return
        self._send(200, content, headers, method=method, content_type=_OCTETS)


@pytest.fixture
def fake_hub() -> Iterator[FakeHub]:
    """A started `FakeHub` (read `.url`), stopped after the test."""
    with FakeHub() as hub:
        yield hub

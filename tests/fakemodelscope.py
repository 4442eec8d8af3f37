"""A local HTTP server that answers like ModelScope, for tests (no internet needed).

It serves what `modelscope_hub` 0.5 (`HubApi.list_repos`, `HubApi.get_repo`, the `/api/v1`
file list) and the ModelScope source's downloads ask, in ModelScope's shapes (read from the
client's code: `_openapi.py`, `_legacy_api.py`, `api.py`):

- `GET /openapi/v1/models?owner=&sort=&page_number=&page_size=` →
  `{"success": true, "request_id": ..., "data": {"models": [...], "total_count": n,
  "page_number": p, "page_size": s}}`, each model `{"id": "org/name", "created_at",
  "last_modified", ...}` (ISO times, `Z`); `sort=last_modified` puts the most recently
  changed first;
- `GET /openapi/v1/models/{org}/{name}` → `{"success": true, "data": {model}}`, a 404 is
  `{"success": false, "code": "ResourceNotFound", "message": ...}`;
- `GET /api/v1/models/{org}/{name}` (the client's fallback) → `{"Code": 200, "Data": {...},
  "Success": true}`;
- `GET /api/v1/models/{org}/{name}/repo/files?Revision=&Recursive=` → `{"Code": 200,
  "Data": {"Files": [{"Name", "Path", "Type": "blob", "Size", "Sha256", "Revision" (the commit
  that last changed the file), "CommittedDate" (epoch seconds), "IsLFS", ...}]},
  "Success": true}`; `Revision` is `master` or a commit id;
- `GET /api/v1/models/{org}/{name}/repo?Revision=&FilePath=` → the file's bytes, `206` for
  `Range: bytes=a-b`.

Errors: 404 for unknown repos, revisions and files; a private repo answers 401 without a
token and 403 with a token not in `valid_tokens`. `fail_next()` injects any status with any
headers (429 with `Retry-After`, 500...). Every request is logged in `requests`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from tests.fakehub import LoggedRequest  # the same log line as the fake Hugging Face Hub's

_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")
_OPENAPI_MODEL_RE = re.compile(r"^/openapi/v1/models/([^/]+/[^/]+?)/?$")
_LEGACY_MODEL_RE = re.compile(r"^/api/v1/models/([^/]+/[^/]+?)(/repo/files|/repo)?/?$")


@dataclass
class _Commit:
    sha: str
    files: dict[str, bytes]
    committed_at: datetime


@dataclass
class _Repo:
    repo_id: str
    created_at: datetime
    private: bool
    commits: list[_Commit] = field(default_factory=list)

    def commit(self, revision: str) -> _Commit | None:
        if revision == "master":
            return self.commits[-1]
        return next((c for c in self.commits if c.sha == revision), None)

    def last_change(self, upto: _Commit, path: str) -> _Commit:
        """The commit, up to `upto`, that last changed `path`."""
        changed, previous = upto, None
        for commit in self.commits[: self.commits.index(upto) + 1]:
            content = commit.files.get(path)
            if content != previous:
                changed = commit
            previous = content
        return changed


@dataclass
class _Failure:
    path_prefix: str
    status: int
    headers: dict[str, str]
    remaining: int
    file_path: str | None


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeModelScope:
    """A threaded ModelScope look-alike on 127.0.0.1, port chosen by the OS.

    Register repos with `add_repo`; start with `with FakeModelScope() as ms:`; read `url`.
    """

    def __init__(self, *, valid_tokens: set[str] | None = None) -> None:
        self.valid_tokens = set(valid_tokens or {"ms-fake-valid-token"})
        self.requests: list[LoggedRequest] = []
        self._repos: dict[str, _Repo] = {}
        self._failures: list[_Failure] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._clock = datetime(2025, 3, 1, tzinfo=UTC)

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeModelScope is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeModelScope:
        fake = self

        class Handler(_Handler):
            fake_ms = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, bytes],
        *,
        created_at: datetime | None = None,
        private: bool = False,
    ) -> str:
        """Create `repo_id` with `files`, or push them as its next commit. Returns the commit
        id (40 hex digits, from the repo id and the files). Each new repo and each commit is
        one minute later than the previous one (2025-03-01 onwards) unless `created_at`."""
        files = dict(files)
        digest = hashlib.sha1(repo_id.encode())
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + files[name] + b"\0")
        with self._lock:
            self._clock += timedelta(minutes=1)
            repo = self._repos.get(repo_id)
            if repo is None:
                repo = _Repo(repo_id, created_at=created_at or self._clock, private=private)
                self._repos[repo_id] = repo
            digest.update(str(len(repo.commits)).encode())
            repo.commits.append(_Commit(digest.hexdigest(), files, self._clock))
        return repo.commits[-1].sha

    def fail_next(
        self,
        path_prefix: str,
        status: int,
        headers: Mapping[str, str] | None = None,
        *,
        times: int = 1,
        file_path: str | None = None,
    ) -> None:
        """Answer the next `times` requests whose path starts with `path_prefix` (and, with
        `file_path`, that download that file) with `status` and `headers` (ModelScope's
        error envelope as the body)."""
        with self._lock:
            self._failures.append(
                _Failure(path_prefix, status, dict(headers or {}), times, file_path)
            )

    def requests_to(self, path_part: str) -> list[LoggedRequest]:
        with self._lock:
            return [r for r in self.requests if path_part in r.path]

    def clear_log(self) -> None:
        with self._lock:
            self.requests.clear()

    def _take_failure(self, path: str, file_path: str) -> _Failure | None:
        with self._lock:
            for failure in self._failures:
                if path.startswith(failure.path_prefix) and failure.file_path in (None, file_path):
                    failure.remaining -= 1
                    if failure.remaining <= 0:
                        self._failures.remove(failure)
                    return failure
        return None


class _Handler(BaseHTTPRequestHandler):
    fake_ms: FakeModelScope
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the fake's request log is the record."""

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        self._path, self._query = unquote(parts.path), parse_qs(parts.query)
        failure = self.fake_ms._take_failure(self._path, self._arg("FilePath"))
        if failure is not None:
            self._error(failure.status, "injected", failure.headers)
            return
        if self._path == "/openapi/v1/models":
            self._list_models()
        elif match := _OPENAPI_MODEL_RE.match(self._path):
            repo = self._visible_repo(match.group(1), openapi=True)
            if repo is not None:
                self._json(200, {"success": True, "request_id": "r", "data": _model(repo)})
        elif match := _LEGACY_MODEL_RE.match(self._path):
            repo = self._visible_repo(match.group(1), openapi=False)
            if repo is None:
                return
            if match.group(2) is None:
                self._json(200, {"Code": 200, "Data": _legacy_model(repo), "Success": True})
            elif match.group(2) == "/repo/files":
                self._files(repo)
            else:
                self._download(repo)
        else:
            self._error(404, f"no route {self._path}")

    # -- answers -----------------------------------------------------------------------------

    def _arg(self, name: str, default: str = "") -> str:
        return self._query.get(name, [default])[0]

    def _list_models(self) -> None:
        owner = self._arg("owner")
        page, size = int(self._arg("page_number", "1")), int(self._arg("page_size", "10"))
        with self.fake_ms._lock:
            repos = [
                r
                for r in self.fake_ms._repos.values()
                if not r.private and (not owner or r.repo_id.split("/")[0] == owner)
            ]
        if self._arg("sort") == "last_modified":
            repos.sort(key=lambda r: r.commits[-1].committed_at, reverse=True)
        chunk = repos[(page - 1) * size : page * size]
        data = {
            "models": [_model(r) for r in chunk],
            "total_count": len(repos),
            "page_number": page,
            "page_size": size,
        }
        self._json(200, {"success": True, "request_id": "r", "data": data})

    def _files(self, repo: _Repo) -> None:
        commit = repo.commit(self._arg("Revision", "master"))
        if commit is None:
            self._error(404, f"revision {self._arg('Revision')} not found", legacy=True)
            return
        entries = []
        for path, content in sorted(commit.files.items()):
            changed = repo.last_change(commit, path)
            entries.append(
                {
                    "CommitId": "",
                    "CommitMessage": "upload",
                    "CommittedDate": int(changed.committed_at.timestamp()),
                    "Committer": "uploader",
                    "IsLFS": path.endswith(".safetensors"),
                    "Mode": "33188",
                    "Name": path.rsplit("/", 1)[-1],
                    "Path": path,
                    "Revision": changed.sha,
                    "Sha256": hashlib.sha256(content).hexdigest(),
                    "Size": len(content),
                    "Type": "blob",
                }
            )
        self._json(200, {"Code": 200, "Data": {"Files": entries}, "Success": True})

    def _download(self, repo: _Repo) -> None:
        commit = repo.commit(self._arg("Revision", "master"))
        content = None if commit is None else commit.files.get(self._arg("FilePath"))
        if content is None:
            self._error(404, "file not found", legacy=True)
            return
        headers = {"Accept-Ranges": "bytes"}
        match = _RANGE_RE.match(self.headers.get("Range", ""))
        if match and match.group(1):
            start = int(match.group(1))
            end = min(int(match.group(2) or len(content) - 1), len(content) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(content)}"
            self._send(206, content[start : end + 1], headers)
            return
        self._send(200, content, headers)

    def _visible_repo(self, repo_id: str, *, openapi: bool) -> _Repo | None:
        with self.fake_ms._lock:
            repo = self.fake_ms._repos.get(repo_id)
        if repo is None:
            self._error(404, f"model {repo_id} not found", legacy=not openapi)
            return None
        if repo.private:
            auth = self.headers.get("Authorization", "")
            if not auth:
                self._error(401, "login required", legacy=not openapi)
                return None
            if auth.removeprefix("Bearer ") not in self.fake_ms.valid_tokens:
                self._error(403, "access denied", legacy=not openapi)
                return None
        return repo

    # -- plumbing ----------------------------------------------------------------------------

    def _error(
        self, status: int, message: str, headers: Mapping[str, str] | None = None, *, legacy=False
    ) -> None:
        if legacy:
            body = {"Code": 10010205001, "Message": message, "Success": False}
        else:
            code = {404: "ResourceNotFound", 401: "InvalidAuthentication"}.get(status)
            body = {"success": False, "code": code or "Error", "message": message}
        self._json(status, body, headers)

    def _json(self, status: int, body: object, headers: Mapping[str, str] | None = None) -> None:
        self._send(status, json.dumps(body).encode(), dict(headers or {}), "application/json")

    def _send(
        self,
        status: int,
        body: bytes,
        headers: Mapping[str, str],
        content_type: str = "application/octet-stream",
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        # Logged before the body goes out: the client may act on the answer at once.
        self.fake_ms.requests.append(
            LoggedRequest(
                "GET",
                self._path,
                self._query,
                {k.lower(): v for k, v in self.headers.items()},
                status,
                len(body),
            )
        )
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a partial reader
            self.wfile.write(body)


def _model(repo: _Repo) -> dict:
    """A model as the OpenAPI surface lists it."""
    return {
        "id": repo.repo_id,
        "display_name": repo.repo_id.split("/")[1],
        "created_at": _iso(repo.created_at),
        "last_modified": _iso(repo.commits[-1].committed_at),
        "downloads": 0,
        "likes": 0,
        "tasks": ["text-generation"],
        "private": repo.private,
        "gated": False,
    }


def _legacy_model(repo: _Repo) -> dict:
    """A model as the `/api/v1` surface describes it (PascalCase, epoch seconds)."""
    org, name = repo.repo_id.split("/")
    return {
        "Path": org,
        "Name": name,
        "CreatedTime": int(repo.created_at.timestamp()),
        "LastUpdatedTime": int(repo.commits[-1].committed_at.timestamp()),
        "Visibility": 1 if repo.private else 5,
    }


@pytest.fixture
def fake_modelscope() -> Iterator[FakeModelScope]:
    """A started `FakeModelScope` (read `.url`), stopped after the test."""
    with FakeModelScope() as fake:
        yield fake

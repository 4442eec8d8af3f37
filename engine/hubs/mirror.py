"""A local folder of releases as a hub: for air-gapped sites and object-store mounts.

Layout: `<root>/<org>/<name>/` holds `config.json`, optionally `generation_config.json`,
`model.safetensors.index.json`, `README.md` and `*.safetensors` files. A folder has no
commits, so its revision is a content hash: the same files are the same revision however
often the folder is scanned, and a changed config is a new revision.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from engine.hubs.base import (
    INDEX_FILE,
    RELEASE_FILES,
    HubError,
    HubNotFound,
    HubSpec,
    HubUnavailable,
    ReleaseCandidate,
    ReleaseFiles,
    incomplete_reason,
    repo_matches,
)
from engine.hubs.safetensors_headers import read_local_headers, weight_files

# Names a copy still in progress leaves: huggingface_hub (`.incomplete`), curl/wget/browsers
# (`.part`, `.partial`), generic `.tmp`, and rsync's `.<name>.XXXXXX`.
_IN_PROGRESS_SUFFIXES = (".incomplete", ".part", ".partial", ".tmp")
_RSYNC_TEMP_RE = re.compile(r"^\..+\.[A-Za-z0-9]{6}$")


def _is_in_progress(name: str) -> bool:
    return (
        name.endswith(_IN_PROGRESS_SUFFIXES)
        or name.startswith(".tmp")
        or bool(_RSYNC_TEMP_RE.match(name))
    )


@dataclass
class _Snapshot:
    """What one read of a release folder saw."""

    files: dict[str, bytes] = field(default_factory=dict)  # RELEASE_FILES present
    sizes: dict[str, int] = field(default_factory=dict)  # every visible file, bytes
    in_progress: list[str] = field(default_factory=list)
    links_out: list[str] = field(default_factory=list)  # links out of the mirror: never read
    revision: str = ""
    modified_at: datetime | None = None  # the newest release file's mtime: listing order only

    @property
    def safetensors(self) -> list[str]:
        return sorted(name for name in self.sizes if name.endswith(".safetensors"))


class MirrorSource:
    """Releases laid out as `<spec.endpoint>/<org>/<name>/` on a local or mounted disk.

    `spec.author` limits listing to one org folder (case-insensitive); `spec.repo_pattern` is
    an fnmatch pattern on "org/name". `revision` is the sha256 of the release files (name and
    bytes, in `RELEASE_FILES` order) and of the `*.safetensors` names and sizes. A folder
    has no publication time, so `published_at` is None: a file's mtime is when it was copied
    (the install, a sync, a touch), not when the release was published. The app records when
    it first saw the release complete instead (`services.releases.release_from_candidate`).

    Methods raise `HubNotFound` (no root, org or release folder; or the folder changed since
    the revision was seen), `HubUnavailable` (the disk or mount failed while reading) or
    `HubError` (an unreadable safetensors header, no root configured).
    """

    def __init__(self, spec: HubSpec) -> None:
        if not spec.endpoint:
            raise HubError("a mirror hub needs its root folder as the endpoint; none is set.")
        self.spec = spec
        self.root = Path(spec.endpoint).expanduser()

    # -- plumbing ----------------------------------------------------------------------------

    def _check_root(self) -> None:
        if not self.root.is_dir():
            raise HubNotFound(
                f"mirror root {self.root} does not exist or is not a folder: check the watch's"
                " endpoint and that the mount is up."
            )

    def _folder(self, repo_id: str) -> Path:
        org, _, name = repo_id.partition("/")
        if not org or not name or "/" in name or org.startswith(".") or name.startswith("."):
            raise HubNotFound(f"{repo_id!r} is not an org/name repo id for a mirror.")
        self._check_root()
        folder = self.root / org / name
        if not folder.is_dir():
            raise HubNotFound(f"mirror {self.root} has no folder {org}/{name}.")
        return folder

    def _is_confined(self, path: Path) -> bool:
        try:
            return path.resolve().is_relative_to(self.root.resolve())
        except (OSError, RuntimeError):  # a link loop
            return False

    def _confined(self, path: Path, repo_id: str) -> Path:
        """`path` when, its links followed, it lies inside the mirror root. Raises `HubError`
        (the release's fault, not transient) naming the file otherwise: a link out of the
        mirror (to /proc/self/environ, a private key) would hand a worker's file to the
        release's pages and to its own code. Links inside the root (a snapshot's blobs) are
        kept."""
        if not self._is_confined(path):
            raise HubError(
                f"{repo_id}: {path.relative_to(self.root / repo_id).as_posix()} links outside "
                "the mirror; day0 reads no file outside the mirror root"
            )
        return path

    def _release_folders(self) -> list[tuple[str, Path]]:
        self._check_root()
        author = self.spec.author.lower()
        found = []
        for org in sorted(self.root.iterdir()):
            if not org.is_dir() or org.name.startswith("."):
                continue
            if author and org.name.lower() != author:
                continue
            for folder in sorted(org.iterdir()):
                repo_id = f"{org.name}/{folder.name}"
                visible = folder.is_dir() and not folder.name.startswith(".")
                if visible and repo_matches(repo_id, self.spec.repo_pattern):
                    found.append((repo_id, folder))
        return found

    def _snapshot(self, repo_id: str, folder: Path) -> _Snapshot:
        """Read a release folder once: its release files, sizes, revision and mtime."""
        snap = _Snapshot()
        mtimes: list[float] = []
        try:
            for path in sorted(folder.rglob("*")):
                relative = path.relative_to(folder).as_posix()
                if _is_in_progress(path.name):
                    snap.in_progress.append(relative)
                    continue
                hidden = any(part.startswith(".") for part in path.relative_to(folder).parts)
                if hidden:
                    continue
                if not self._is_confined(path):
                    snap.links_out.append(relative)  # listed (a revision), refused at fetch
                    continue
                if not path.is_file():
                    continue
                stat = path.stat()
                snap.sizes[relative] = stat.st_size
                if relative in RELEASE_FILES:
                    snap.files[relative] = path.read_bytes()
                    mtimes.append(stat.st_mtime)
                elif relative.endswith(".safetensors"):
                    mtimes.append(stat.st_mtime)
        except OSError as exc:
            raise HubUnavailable(f"{repo_id}: cannot read mirror folder {folder}: {exc}") from exc

        digest = hashlib.sha256()
        for name in RELEASE_FILES:
            if name in snap.files:
                content = snap.files[name]
                digest.update(f"{name}\0{len(content)}\0".encode() + content)
        # Weights are not hashed (too big to read); their names and sizes are.
        for name in snap.safetensors:
            digest.update(f"{name}\0{snap.sizes[name]}\0".encode())
        for name in snap.links_out:  # a link added or removed is a new revision
            digest.update(f"link\0{name}\0".encode())
        snap.revision = digest.hexdigest()
        if mtimes:
            snap.modified_at = datetime.fromtimestamp(max(mtimes), tz=UTC)
        return snap

    def _candidate(self, repo_id: str, folder: Path) -> ReleaseCandidate:
        return self._candidate_of(repo_id, self._snapshot(repo_id, folder))

    @staticmethod
    def _candidate_of(repo_id: str, snap: _Snapshot) -> ReleaseCandidate:
        if snap.in_progress:
            shown = ", ".join(snap.in_progress[:3])
            reason = f"files still being written: {shown}"
        else:
            reason = incomplete_reason(snap.sizes, snap.files.get(INDEX_FILE))
        return ReleaseCandidate(
            repo_id=repo_id,
            revision=snap.revision,
            published_at=None,
            complete=not reason,
            reason=reason,
        )

    # -- HubSource ---------------------------------------------------------------------------

    def list_releases(self, *, limit: int = 50) -> list[ReleaseCandidate]:
        """Release folders the spec matches, newest first (by their files' newest mtime), at
        most `limit`.

        Raises `HubNotFound` when the root is missing, `HubUnavailable` on read errors.
        """
        snaps = [(repo_id, self._snapshot(repo_id, f)) for repo_id, f in self._release_folders()]
        snaps.sort(
            key=lambda s: (s[1].modified_at is None, -(s[1].modified_at or _EPOCH).timestamp())
        )
        return [self._candidate_of(repo_id, snap) for repo_id, snap in snaps[:limit]]

    def latest_release(self, repo_id: str) -> ReleaseCandidate:
        """`repo_id`'s folder as it is now. Raises `HubNotFound`, `HubUnavailable`."""
        return self._candidate(repo_id, self._folder(repo_id))

    def release_at(self, repo_id: str, revision: str) -> ReleaseCandidate:
        """`repo_id`'s folder if it is still at `revision` ("main": as it is now): a folder
        keeps no history, so another revision is gone. Raises `HubNotFound` (no folder; the
        folder changed since `revision`), `HubUnavailable`."""
        candidate = self.latest_release(repo_id)
        if revision not in (candidate.revision, "main"):
            raise HubNotFound(
                f"{repo_id}@{revision[:12]}: the mirror changed since this revision was seen; the"
                f" folder is now at {candidate.revision[:12]}."
            )
        return candidate

    def fetch_release(self, repo_id: str, revision: str) -> ReleaseFiles:
        """The release files of `repo_id` if the folder is still at `revision` ("main": as
        it is now).

        The header of every weight file (the index's shards, else `model.safetensors`, else
        every top-level `*.safetensors`) is read: its 8-byte length and header bytes only.
        Raises `HubNotFound` (no folder; the folder changed since `revision`; a shard the
        index names is missing), `HubUnavailable` (read error), `HubError` (an unreadable
        safetensors header: too short, an absurd length, bad JSON).
        """
        snap = self._snapshot(repo_id, self._folder(repo_id))
        if revision not in (snap.revision, "main"):
            raise HubNotFound(
                f"{repo_id}@{revision[:12]}: the mirror changed since this revision was seen; the"
                f" folder is now at {snap.revision[:12]}, a new release."
            )
        if snap.links_out:
            raise HubError(
                f"{repo_id}: {', '.join(snap.links_out[:5])} "
                f"{'links' if len(snap.links_out) == 1 else 'link'} outside the mirror; day0 "
                "reads no file outside the mirror root"
            )
        fetched = ReleaseFiles(
            repo_id=repo_id, revision=snap.revision, files=snap.files, file_sizes=snap.sizes
        )
        shards = weight_files(snap.sizes, snap.files.get(INDEX_FILE))
        if shards:
            for shard in shards:
                self._confined(self.root / repo_id / shard, repo_id)
            fetched.safetensors_metadata = read_local_headers(repo_id, self.root / repo_id, shards)
        return fetched

    def fetch_files(self, repo_id: str, revision: str, names: list[str]) -> dict[str, bytes]:
        """The named files of `repo_id`'s folder (top level only: no paths, no hidden files),
        if the folder is still at `revision` ("main": as it is now).

        Raises `HubNotFound` (no folder, a name missing or not a plain top-level file name, the
        folder changed since `revision`), `HubUnavailable` (read error).
        """
        folder = self._folder(repo_id)
        if revision != "main":
            current = self._snapshot(repo_id, folder).revision
            if current != revision:
                raise HubNotFound(
                    f"{repo_id}@{revision[:12]}: the mirror changed since this revision was seen;"
                    f" the folder is now at {current[:12]}."
                )
        out: dict[str, bytes] = {}
        for name in names:
            if "/" in name or "\\" in name or name.startswith(".") or not name:
                raise HubNotFound(f"{repo_id}: {name!r} is not a top-level file name.")
            path = self._confined(folder / name, repo_id)
            if not path.is_file():
                raise HubNotFound(f"mirror {self.root} has no file {repo_id}/{name}.")
            try:
                out[name] = path.read_bytes()
            except OSError as exc:
                raise HubUnavailable(f"{repo_id}: cannot read {name}: {exc}") from exc
        return out


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

"""Every safetensors header of a release, never its weights.

A safetensors file starts with an 8-byte little-endian length and a JSON header naming each
tensor's dtype, shape and byte span; the weights follow. The `fetch` stage reads the header
of every weight file of a release (index or not), so later stages can count and check the
checkpoint's own tensors:

- Hub: one HTTP range request per file (two when its header is over 100 kB), through
  `huggingface_hub`'s `HfApi.parse_safetensors_file_metadata`, `HEADER_WORKERS` files at a
  time. A 429 is waited out here (its `Retry-After`, else 1, 2, 4, 8 s) while the waits of all
  the files together stay within `MAX_RATE_LIMIT_WAIT_S`; past that the error goes up for the
  task to retry later.
  Each header read is kept on disk per revision (`HeaderCache`), so a retried fetch asks
  again only for the files it had not read. ModelScope's source hands in its own reader
  (`engine.hubs.modelscope`: the same two range requests at its client's download URL).
- Mirror folders: `huggingface_hub.parse_local_safetensors_file_metadata`, which reads the
  8-byte length and the header bytes only and refuses a header length over its 25 MB cap.

Which files: those the index names; without an index `model.safetensors`, else every
`*.safetensors` at the repo's top level (the files transformers would load).

The index and the headers are the uploader's: what they declare is bounded (`MAX_SHARDS`
files, `MAX_TENSORS` tensors, `tensor_problem`'s name, rank and dim limits) and anything
malformed is a `HubError` naming the file and the tensor, which the fetch stage reports as
the release's failure, never an error of day0's own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from engine import formatting as fmt
from engine.hubs.base import INDEX_FILE, HubError, HubNotFound, tensor_nbytes
from engine.json_files import JSONFileError, parse_json_bytes
from engine.paths import var_dir

# Files whose headers are read at once (threads, each one HTTP request at a time).
HEADER_WORKERS = 8
# Seconds a release's header reads may spend waiting out 429s, all files together, before
# the error goes to the caller (the fetch stage's soft limit is 120 s).
MAX_RATE_LIMIT_WAIT_S = 30.0
# Waits after a 429 that names none (seconds), in turn.
_BACKOFF_S = (1.0, 2.0, 4.0, 8.0)
# Names listed in a summary at most (duplicates), the rest counted.
SHOWN_NAMES = 10

# Bounds on what a release's index and headers may declare, past which the release is refused
# (its fault, the count or the tensor named): a release is written by whoever uploads it, and
# without them one could cost thousands of requests, store megabytes, or stop the stage with
# an error blamed on day0. The largest releases today hold ~200 shards and ~100,000 tensors
# (DeepSeek-V3: 163 shards, ~92,000 tensors) with names under 200 characters and rank <= 5.
MAX_SHARDS = 2_000
MAX_TENSORS = 500_000
MAX_NAME_CHARS = 1_024
MAX_RANK = 8
MAX_DIM = 2**40
# safetensors stores byte offsets as u64.
MAX_OFFSET = 2**64 - 1
# Characters of a name or value quoted in a reason, at most.
_SHOWN_CHARS = 80

SINGLE_FILE = "model.safetensors"
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")

# One tensor as a header describes it: {"dtype": "BF16", "shape": [4096, 4096]}.
Tensors = dict[str, dict[str, Any]]


def shown(value: Any) -> str:
    """`repr(value)` cut to 80 characters, for a reason that quotes what a release wrote."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _is_count(value: Any, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit


def tensor_problem(name: str, dtype: Any, shape: Any) -> str | None:
    """What makes a tensor one day0 does not store, as "tensor 'name': why" (the name cut to
    80 characters), or None: a name over `MAX_NAME_CHARS` characters, a dtype safetensors
    does not define, a shape that is not a list of at most `MAX_RANK` integers from 0 to
    `MAX_DIM`."""
    if len(name) > MAX_NAME_CHARS:
        return (
            f"tensor {shown(name)}: its name is {len(name):,} characters long (day0 reads "
            f"names of at most {MAX_NAME_CHARS:,})"
        )
    where = f"tensor {shown(name)}"
    if not isinstance(shape, list | tuple) or not all(_is_count(d, MAX_DIM) for d in shape):
        return f"{where}: shape {shown(shape)} is not a list of integers from 0 to 2**40"
    if len(shape) > MAX_RANK:
        return f"{where}: shape has {len(shape)} dims (day0 reads at most {MAX_RANK})"
    try:
        tensor_nbytes(dtype, shape)
    except (ValueError, TypeError):
        return f"{where}: unknown safetensors dtype {shown(dtype)}"
    return None


def _too_many_tensors(count: int, subject: str) -> HubError:
    return HubError(
        f"{subject}: the safetensors headers hold {count:,} tensors; day0 reads at most "
        f"{MAX_TENSORS:,}."
    )


def _too_many_shards(count: int, what: str) -> HubError:
    return HubError(
        f"{what} {count:,} safetensors files; day0 reads the headers of at most {MAX_SHARDS:,}."
    )


def index_shards(index: bytes) -> list[str]:
    """The files the index (`index`: the bytes of `model.safetensors.index.json`) maps its
    tensors to, sorted. Parsed by `json_files.parse_json_bytes`, the fetch stage's parse.
    Raises `HubError` (the release's fault, the file named) for an index that is not strict
    JSON or nests too deeply, has no `weight_map` object, maps a tensor to something other
    than a file name, or names over `MAX_TENSORS` tensors or `MAX_SHARDS` files (refused
    before any header is read)."""
    try:
        parsed = parse_json_bytes(INDEX_FILE, index)
    except JSONFileError as exc:
        raise HubError(exc.message) from exc
    weight_map = parsed.get("weight_map") if isinstance(parsed, dict) else None
    if not isinstance(weight_map, dict):
        raise HubError(f"{INDEX_FILE} has no 'weight_map' object.")
    if len(weight_map) > MAX_TENSORS:
        raise HubError(
            f"{INDEX_FILE} names {len(weight_map):,} tensors; day0 reads at most {MAX_TENSORS:,}."
        )
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise HubError(
                f"{INDEX_FILE} maps tensor {shown(name)} to {shown(shard)}, not a file name."
            )
    shards = sorted(set(weight_map.values()))
    if len(shards) > MAX_SHARDS:
        raise _too_many_shards(len(shards), f"{INDEX_FILE} names")
    return shards


def weight_files(names: Iterable[str], index: bytes | None) -> list[str]:
    """The safetensors files of a release whose repo holds `names`: the shards the index
    (`index`: its bytes; `index_shards`) names, else `model.safetensors`, else every
    top-level `*.safetensors`; sorted. Raises `HubError` for an index `index_shards`
    refuses or over `MAX_SHARDS` top-level files, `HubNotFound` naming shards the index
    lists that the repo lacks (an upload in progress)."""
    present = set(names)
    if index is not None:
        shards = index_shards(index)
        missing = [shard for shard in shards if shard not in present]
        if missing:
            shown_names = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
            raise HubNotFound(
                f"{INDEX_FILE} names {fmt.counted(len(missing), 'shard')} the repo does not hold: "
                f"{shown_names}"
            )
        return shards
    if SINGLE_FILE in present:
        return [SINGLE_FILE]
    files = sorted(n for n in present if n.endswith(".safetensors") and "/" not in n)
    if len(files) > MAX_SHARDS:
        raise _too_many_shards(len(files), "the repo holds, without an index,")
    return files


def _tensors_of(file_metadata: Any, filename: str, subject: str) -> Tensors:
    """{name: {"dtype", "shape", "data_offsets"}} from a `SafetensorsFileMetadata`, each
    entry checked (`tensor_problem`; `data_offsets` two integers from 0 to 2**64 - 1 whose
    span fits the shape). Raises `HubError` naming the file and the tensor, or the count
    past `MAX_TENSORS`."""
    if len(file_metadata.tensors) > MAX_TENSORS:
        raise _too_many_tensors(len(file_metadata.tensors), f"{subject}: {filename}")
    tensors: Tensors = {}
    for name, info in file_metadata.tensors.items():
        shape = info.shape
        offsets = info.data_offsets
        problem = tensor_problem(name, info.dtype, shape)
        if problem is not None:
            raise HubError(f"{subject}: safetensors header of {filename}, {problem}.")
        where = f"{subject}: safetensors header of {filename}, tensor {shown(name)}"
        if (
            not isinstance(offsets, list | tuple)
            or len(offsets) != 2
            or not all(_is_count(o, MAX_OFFSET) for o in offsets)
        ):
            raise HubError(f"{where}: data_offsets {shown(offsets)} are not two byte offsets.")
        shape, offsets = list(shape), list(offsets)
        nbytes = tensor_nbytes(info.dtype, shape)
        if offsets[1] - offsets[0] != nbytes:
            raise HubError(
                f"{where}: data_offsets span {offsets[1] - offsets[0]:,} bytes but a "
                f"{info.dtype} tensor of shape {shape} takes {nbytes:,}."
            )
        tensors[name] = {"dtype": info.dtype, "shape": shape, "data_offsets": offsets}
    return tensors


def merge_headers(headers: Mapping[str, Tensors]) -> dict[str, Any]:
    """One release's tensors from its files' headers ({filename: tensors}):
    {"total_size": bytes of every tensor, "shard_count": files, "tensors": {name: {"dtype",
    "shape"}}, "duplicates": {"count", "names"} (a name in more than one file: the later
    file's entry is kept)}. Raises `HubError` past `MAX_TENSORS` tensors, all files
    together."""
    count = sum(len(tensors) for tensors in headers.values())
    if count > MAX_TENSORS:
        raise _too_many_tensors(count, f"{fmt.counted(len(headers), 'file')}")
    tensors: Tensors = {}
    duplicates: list[str] = []
    total = 0
    for filename in sorted(headers):
        for name, info in headers[filename].items():
            if name in tensors:
                duplicates.append(name)
            start, end = info["data_offsets"]
            total += end - start
            tensors[name] = {"dtype": info["dtype"], "shape": list(info["shape"])}
    merged: dict[str, Any] = {"total_size": total, "shard_count": len(headers), "tensors": tensors}
    if duplicates:
        merged["duplicates"] = {"count": len(duplicates), "names": sorted(duplicates)[:SHOWN_NAMES]}
    return merged


def read_local_headers(repo_id: str, folder: Path, filenames: list[str]) -> dict[str, Any]:
    """`merge_headers` of the safetensors files in `folder`, reading from each only its
    8-byte length and its header. Raises `HubError` naming the file when a header cannot
    be read: too short, a length over the library's 25 MB cap or past the file's end, bad
    JSON or JSON that is not a header (`_parse_header`), an entry that does not add up; or
    past `MAX_SHARDS` files or `MAX_TENSORS` tensors (counted as the files are read)."""
    from huggingface_hub import parse_local_safetensors_file_metadata
    from huggingface_hub.errors import SafetensorsParsingError

    if len(filenames) > MAX_SHARDS:
        raise _too_many_shards(len(filenames), f"{repo_id}: the release has")
    headers: dict[str, Tensors] = {}
    count = 0
    for filename in filenames:
        try:
            metadata = _parse_header(
                lambda path=folder / filename: parse_local_safetensors_file_metadata(path),
                filename,
                repo_id,
            )
        except (SafetensorsParsingError, OSError, ValueError) as exc:
            raise HubError(
                f"{repo_id}: cannot read the safetensors header of {filename}: {exc}"
            ) from exc
        headers[filename] = _tensors_of(metadata, filename, repo_id)
        count += len(headers[filename])
        if count > MAX_TENSORS:
            raise _too_many_tensors(count, f"{repo_id}: {fmt.counted(len(headers), 'file')}")
    return merge_headers(headers)


def _parse_header(parse: Callable[[], Any], filename: str, subject: str) -> Any:
    """`parse()` (the library's read of one header), with what a hostile header makes the
    library raise besides its own `SafetensorsParsingError` turned into `HubError` naming the
    file: JSON nested too deeply (`RecursionError`), JSON that is not an object of tensor
    objects (`AttributeError`, `TypeError`, `KeyError`: the library indexes it unchecked).
    The library's own errors (HTTP, parsing) go up as they are."""
    try:
        return parse()
    except RecursionError as exc:
        raise HubError(
            f"{subject}: the safetensors header of {filename} is nested too deeply to be read."
        ) from exc
    except (AttributeError, TypeError, KeyError) as exc:
        raise HubError(
            f"{subject}: the safetensors header of {filename} is not an object of tensors "
            "with a dtype, a shape and data_offsets."
        ) from exc


class HeaderCache:
    """Header reads of one repo at one commit, kept on disk:
    `<DAY0_VAR_DIR>/safetensors-headers/<key>/<file>.json`, where `<key>` is the sha256 of
    the hub endpoint, repo id and commit. A commit never changes, so an entry never goes
    stale; a `revision` that is not a 40-hex commit sha (a branch) is not cached."""

    def __init__(self, endpoint: str, repo_id: str, revision: str) -> None:
        self.enabled = bool(_SHA_RE.match(revision))
        key = hashlib.sha256(f"{endpoint}\0{repo_id}\0{revision}".encode()).hexdigest()
        self.folder = var_dir("safetensors-headers", key)

    def _path(self, filename: str) -> Path:
        return self.folder / (filename.replace("%", "%25").replace("/", "%2F") + ".json")

    def get(self, filename: str) -> Tensors | None:
        """The cached header of `filename`, or None (not cached, or unreadable)."""
        if not self.enabled:
            return None
        try:
            tensors = json.loads(self._path(filename).read_text())
        except (OSError, ValueError):
            return None
        return tensors if isinstance(tensors, dict) else None

    def put(self, filename: str, tensors: Tensors) -> None:
        """Keep `tensors` (written under a temporary name, then renamed into place). A disk
        that refuses the write costs a re-read later, nothing else."""
        if not self.enabled:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-")
            with os.fdopen(fd, "w") as handle:
                json.dump(tensors, handle, separators=(",", ":"))
            os.replace(tmp, self._path(filename))
        except OSError:
            pass


def _status_and_headers(exc: BaseException) -> tuple[int | None, Mapping[str, str]]:
    response = getattr(exc, "response", None)
    if response is None:
        return None, {}
    return getattr(response, "status_code", None), getattr(response, "headers", {}) or {}


def read_hub_headers(
    api: Any,
    repo_id: str,
    revision: str,
    filenames: list[str],
    *,
    cache: HeaderCache,
    timeout_s: float,
    workers: int = HEADER_WORKERS,
    max_wait_s: float = MAX_RATE_LIMIT_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """`merge_headers` of `filenames` in `repo_id` at `revision`, read by HTTP range requests
    through `api.parse_safetensors_file_metadata` (`api`: an `HfApi`, or the ModelScope
    source's reader; either with the token rule its caller set, and raising HTTP errors that
    carry the `response`), `workers` files at a time, cached in `cache`.

    A 429 is retried after its `Retry-After` (else 1, 2, 4, 8 s) while the waits of all the
    files together stay within `max_wait_s` seconds (so the read ends within the fetch
    stage's time limit however many files meet a 429). Raises what the library raised (the
    first failure; the other reads are cancelled, those done are cached) or `HubError` for a
    header that does not add up, over `MAX_SHARDS` files (before any request) or over
    `MAX_TENSORS` tensors (counted as the files are read; the reads left are cancelled).
    """
    from engine.hubs.http import retry_after_seconds

    if len(filenames) > MAX_SHARDS:
        raise _too_many_shards(len(filenames), f"{repo_id}@{revision}: the release has")
    waited = [0.0]  # seconds spent waiting, all files together (the budget is shared)
    read_count = [0]  # tensors read so far, all files together (bounded by MAX_TENSORS)
    lock = threading.Lock()

    def take_tensors(tensors: Tensors) -> None:
        with lock:
            read_count[0] += len(tensors)
            if read_count[0] > MAX_TENSORS:
                raise _too_many_tensors(read_count[0], f"{repo_id}@{revision}")

    def take_wait(wait_s: float) -> bool:
        with lock:
            if waited[0] + wait_s > max_wait_s:
                return False
            waited[0] += wait_s
            return True

    def read(filename: str) -> Tensors:
        cached = cache.get(filename)
        if cached is not None:
            take_tensors(cached)
            return cached
        attempt = 0
        while True:
            try:
                metadata = _parse_header(
                    lambda: api.parse_safetensors_file_metadata(
                        repo_id, filename, revision=revision, timeout=timeout_s
                    ),
                    filename,
                    f"{repo_id}@{revision}",
                )
                break
            except Exception as exc:  # the reader's HTTP error: HfHubHTTPError, ModelScope's
                status, headers = _status_and_headers(exc)
                if status != 429:
                    raise
                wait_s = retry_after_seconds(headers)
                if wait_s is None:
                    if attempt >= len(_BACKOFF_S):
                        raise
                    wait_s = _BACKOFF_S[attempt]
                if not take_wait(wait_s):
                    raise
                sleep(wait_s)
                attempt += 1
        tensors = _tensors_of(metadata, filename, f"{repo_id}@{revision}")
        take_tensors(tensors)
        cache.put(filename, tensors)
        return tensors

    headers: dict[str, Tensors] = {}
    if not filenames:
        return merge_headers(headers)
    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(filenames))))
    try:
        futures = {pool.submit(read, name): name for name in filenames}
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in done if f.exception() is not None), None)
        if failed is not None:
            raise failed.exception()  # type: ignore[misc]
        for future, name in futures.items():
            headers[name] = future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return merge_headers(headers)

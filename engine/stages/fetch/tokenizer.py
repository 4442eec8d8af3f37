"""The release's tokenizer files: downloaded by the `fetch` stage, kept content-addressed.

A scaled twin saved as a Hugging Face checkpoint folder needs the release's real tokenizer
to be served (the `serve` stage copies this stage's folder next to it). Which files a
tokenizer is made of follows how transformers looks them up in a repo (transformers 5.x):

- `tokenization_utils_base`: `TOKENIZER_CONFIG_FILE` ("tokenizer_config.json"),
  `FULL_TOKENIZER_FILE` ("tokenizer.json"), `SPECIAL_TOKENS_MAP_FILE`
  ("special_tokens_map.json") and `ADDED_TOKENS_FILE` ("added_tokens.json"), the
  `additional_files_names` of `PreTrainedTokenizerBase.from_pretrained`;
- `utils.hub`: `CHAT_TEMPLATE_FILE` ("chat_template.jinja") and
  `LEGACY_PROCESSOR_CHAT_TEMPLATE_FILE` ("chat_template.json");
- `tokenization_utils_sentencepiece.VOCAB_FILES_NAMES` and
  `tokenization_utils_tokenizers.TIKTOKEN_VOCAB_FILE` ("tokenizer.model": a sentencepiece
  model, or a tiktoken rank file), `TIKTOKEN_LEGACY_NAME` ("tiktoken.model") and the
  `*.tiktoken` files of tiktoken-based releases;
- the `VOCAB_FILES_NAMES` of the GPT-2/Qwen2 ("vocab.json", "merges.txt") and BERT
  ("vocab.txt") tokenizers, which transformers builds a 🤗 tokenizers tokenizer from when a
  repo has no `tokenizer.json`.

Only files at the repo's root are taken (`from_pretrained` reads the root; Llama-3.1's
`original/tokenizer.model` is Meta's own format, not transformers'), and never weights (a
name ending in `WEIGHT_SUFFIXES`). Each file is capped at `MAX_FILE_BYTES` and all of them at
`MAX_TOTAL_BYTES` (real ones: Llama-3.1's `tokenizer.json` is about 9 MB, Qwen3's 11 MB).

The files are stored at `<DAY0_VAR_DIR or the system's temporary folder>/tokenizers/<key>/`,
where `<key>` is the sha256 of the files' `sha256sum` listing (a line `<sha256>  <name>` per
file, sorted by name): the same files are the same folder, whichever release or revision
they came from, and a folder is never rewritten once complete.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from engine.contract import StageTransientError
from engine.hubs.base import HubError, HubSource
from engine.paths import var_dir

# In the order they are taken when the total cap leaves room for only some: the config and
# the vocabulary first.
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer_config.json",
    "tokenizer.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "tiktoken.model",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
)
TIKTOKEN_SUFFIX = ".tiktoken"
WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", ".bin", ".pt", ".pth", ".gguf")

MAX_FILE_BYTES = 64 * 2**20
MAX_TOTAL_BYTES = 128 * 2**20

# A tiktoken rank file: lines of "<base64 token> <rank>".
_TIKTOKEN_LINE = re.compile(rb"^[A-Za-z0-9+/]+=* \d+\r?$")


def tokenizer_store_root() -> Path:
    """Where tokenizer folders are kept: `tokenizers/` under DAY0_VAR_DIR when the worker has
    one, else under the system's temporary folder (read now, not at import)."""
    return var_dir("tokenizers")


def tokenizer_file_names(file_names: Iterable[str]) -> list[str]:
    """The tokenizer files among a repo's `file_names`, in `TOKENIZER_FILES` order and then
    the `*.tiktoken` files by name: root files only, never a weights file."""
    root = {
        name
        for name in file_names
        if "/" not in name and not name.startswith(".") and not name.endswith(WEIGHT_SUFFIXES)
    }
    known = [name for name in TOKENIZER_FILES if name in root]
    tiktoken = sorted(name for name in root if name.endswith(TIKTOKEN_SUFFIX))
    return known + tiktoken


def json_problem(raw: bytes) -> str | None:
    """Why `raw` is not a JSON object transformers can read, or None when it is one."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text (byte {exc.start})"
    try:
        value = json.loads(text)
    except RecursionError:
        return "not valid JSON: nested too deeply"
    except json.JSONDecodeError as exc:
        return f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} (char {exc.pos})"
    if not isinstance(value, dict):
        return "valid JSON but not an object"
    return None


def _is_tiktoken_ranks(raw: bytes) -> bool:
    first = raw.split(b"\n", 1)[0]
    return bool(first) and _TIKTOKEN_LINE.match(first) is not None


def tokenizer_kind(files: Mapping[str, bytes]) -> str:
    """What tokenizer the stored `files` make, as transformers would load it.

    "fast": a 🤗 tokenizers tokenizer (`tokenizer.json`, or the `vocab.json` + `merges.txt`
    / `vocab.txt` transformers builds one from); "sentencepiece": a `tokenizer.model`
    sentencepiece model; "tiktoken": a tiktoken rank file (`*.tiktoken`, `tiktoken.model`, or
    a `tokenizer.model` in that format); "none": no vocabulary (a config alone serves nothing).
    """
    if "tokenizer.json" in files:
        return "fast"
    if "tokenizer.model" in files:
        return "tiktoken" if _is_tiktoken_ranks(files["tokenizer.model"]) else "sentencepiece"
    if "tiktoken.model" in files or any(name.endswith(TIKTOKEN_SUFFIX) for name in files):
        return "tiktoken"
    if {"vocab.json", "merges.txt"} <= files.keys() or "vocab.txt" in files:
        return "fast"
    return "none"


def _sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def store_key(files: Mapping[str, bytes]) -> str:
    """The folder name of `files`: the sha256 of their `sha256sum` listing (sorted by name)."""
    listing = "".join(f"{_sha256(files[name])}  {name}\n" for name in sorted(files))
    return _sha256(listing.encode())


def _holds(folder: Path, files: Mapping[str, bytes]) -> bool:
    """Whether `folder` holds exactly `files`, byte for byte."""
    try:
        if sorted(p.name for p in folder.iterdir()) != sorted(files):
            return False
        return all(
            (folder / name).stat().st_size == len(raw)
            and _sha256((folder / name).read_bytes()) == _sha256(raw)
            for name, raw in files.items()
        )
    except OSError:
        return False


def store_tokenizer_files(files: Mapping[str, bytes], root: Path) -> Path:
    """Write `files` into `root/<store_key(files)>/` and return that folder.

    A folder that already holds exactly these files is reused as it is. Otherwise they are
    written into a temporary folder beside it, renamed into place in one step, so a reader
    never sees half a folder; a damaged folder (a file missing, changed or extra) is replaced.
    """
    final = root / store_key(files)
    if _holds(final, files):
        return final
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        for name, raw in files.items():
            (staging / name).write_bytes(raw)
        staging.chmod(0o755)
        try:
            staging.rename(final)
        except OSError:  # the folder exists: written meanwhile by another run, or damaged
            if _holds(final, files):
                return final
            shutil.rmtree(final, ignore_errors=True)
            staging.rename(final)
        return final
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def fetch_tokenizer(
    source: HubSource,
    repo_id: str,
    revision: str,
    file_sizes: Mapping[str, int],
    *,
    store_root: Path | None = None,
    max_file_bytes: int = MAX_FILE_BYTES,
    max_total_bytes: int = MAX_TOTAL_BYTES,
) -> dict[str, Any]:
    """Download the release's tokenizer files and store them content-addressed.

    `file_sizes` lists the repo's files with their sizes (`ReleaseFiles.file_sizes`); the
    files are fetched from `source` at `revision`, one at a time, and stored under
    `store_root` (default: `tokenizer_store_root()`). Returns
    {"dir": the folder (str) or None when nothing was stored, "files": [{"name", "bytes",
    "sha256"}] (sorted by name), "skipped": [{"name", "reason"}] (sorted by name), "kind":
    `tokenizer_kind` of the stored files}.

    A file is skipped, with the reason, when it is over `max_file_bytes`, when it would bring
    the files over `max_total_bytes`, when a JSON file is not a JSON object, and when the hub
    does not have it or refuses it (a non-transient `HubError`). Raises `StageTransientError`
    for a transient hub error (network, 5xx, 429), as the rest of the stage does, and when
    the folder cannot be written (the worker's disk). Kind "none" with a folder: files were
    kept but no vocabulary among them (a lone `tokenizer_config.json`); without one: none kept.
    """
    taken: dict[str, bytes] = {}
    skipped: list[dict[str, str]] = []
    total_bytes = 0

    def skip(name: str, reason: str) -> None:
        skipped.append({"name": name, "reason": reason})

    for name in tokenizer_file_names(file_sizes):
        listed = file_sizes[name]
        if listed > max_file_bytes:
            skip(name, f"{listed:,} bytes: over the {max_file_bytes:,}-byte cap per file")
            continue
        if total_bytes + listed > max_total_bytes:
            skip(
                name,
                f"{listed:,} bytes: would bring the tokenizer files to {total_bytes + listed:,}"
                f" bytes, over the {max_total_bytes:,}-byte cap in all",
            )
            continue
        try:
            raw = source.fetch_files(repo_id, revision, [name])[name]
        except HubError as exc:
            if exc.transient:
                raise StageTransientError(
                    exc.message, retry_after_s=getattr(exc, "retry_after_s", None)
                ) from exc
            skip(name, exc.message)
            continue
        if len(raw) > max_file_bytes or total_bytes + len(raw) > max_total_bytes:
            skip(name, f"{len(raw):,} bytes downloaded, not the {listed:,} listed: over the cap")
            continue
        if name.endswith(".json") and (problem := json_problem(raw)) is not None:
            skip(name, problem)
            continue
        taken[name] = raw
        total_bytes += len(raw)

    folder = None
    if taken:
        root = store_root or tokenizer_store_root()
        try:
            folder = store_tokenizer_files(taken, root)
        except OSError as exc:  # the worker's disk, not the release: worth another attempt
            raise StageTransientError(
                f"cannot store the tokenizer files under {root}: {exc}"
            ) from exc
    return {
        "dir": str(folder) if folder is not None else None,
        "files": [
            {"name": name, "bytes": len(taken[name]), "sha256": _sha256(taken[name])}
            for name in sorted(taken)
        ],
        "skipped": sorted(skipped, key=lambda entry: entry["name"]),
        "kind": tokenizer_kind(taken),
    }

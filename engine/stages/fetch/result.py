"""The fetch stage's result, typed: what `run.run` returns (`run.parse_release_files`,
`run.summarize_weights` and `tokenizer.fetch_tokenizer` name every key) read back, and what
is judged of it.

`FetchResult.from_stored(mapping)` reads a stored row whatever version of the stage wrote it:
a missing key reads as None or empty, a value of the wrong type is ignored (`engine.stored`),
and it never raises. The stored release (its config and metadata) and the release page's
analysis (the config it read) ask it, never the raw dict. `to_dict` writes what the stage
stores, key for key, so a row read and written back is the row.

Sizes are bytes. Plain Python: neither Django nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.stored import as_list, as_mapping, text, whole_number

# Where a weights summary was read from: every safetensors header, or the index alone.
FROM_HEADERS = "safetensors_headers"
FROM_INDEX = "index"


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(item) for item in as_list(value))


@dataclass(frozen=True)
class NameList:
    """A bounded list of tensor names: how many there are, and the first few kept."""

    count: int = 0
    names: tuple[str, ...] = ()

    @classmethod
    def from_stored(cls, value: Any) -> NameList | None:
        if not isinstance(value, Mapping):
            return None
        return cls(count=whole_number(value.get("count")) or 0, names=_strings(value.get("names")))

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "names": list(self.names)}

    @property
    def more(self) -> int:
        """How many names the list counts past those it keeps (0 when none)."""
        return max(self.count - len(self.names), 0)


@dataclass(frozen=True)
class WeightsSummary:
    """The checkpoint as the fetch stage summarised it (`run.summarize_weights`): where from
    (`FROM_HEADERS` or `FROM_INDEX`), total bytes, files, tensors, bytes per stored dtype (none
    from an index alone), every tensor folded by layer and expert number (None from an index
    alone: `checkpoint_names.fold_tensors` entries, kept as stored for the analysis to unfold),
    names in two files (`duplicates`), and with an index beside the headers the bytes it
    states and the names only one of them holds."""

    source: str = ""
    total_size: int | None = None
    shard_count: int | None = None
    tensor_count: int | None = None
    dtypes: Mapping[str, int] | None = None
    tensors: tuple[Mapping[str, Any], ...] | None = None
    duplicates: NameList | None = None
    index_total_size: int | None = None
    has_index_total_size: bool = False
    index_only: NameList | None = None
    headers_only: NameList | None = None

    @classmethod
    def from_stored(cls, value: Any) -> WeightsSummary | None:
        """The summary of a stored "weights"; None when it holds no mapping (the release
        has neither an index nor safetensors headers)."""
        if not isinstance(value, Mapping):
            return None
        tensors = value.get("tensors")
        mismatch = value.get("index_mismatch")
        return cls(
            source=text(value.get("source")),
            total_size=whole_number(value.get("total_size")),
            shard_count=whole_number(value.get("shard_count")),
            tensor_count=whole_number(value.get("tensor_count")),
            dtypes={
                str(dtype): size
                for dtype, raw in as_mapping(value.get("dtypes")).items()
                if (size := whole_number(raw)) is not None
            },
            tensors=(
                tuple(dict(entry) for entry in tensors if isinstance(entry, Mapping))
                if isinstance(tensors, list)
                else None
            ),
            duplicates=NameList.from_stored(value.get("duplicates")),
            index_total_size=whole_number(value.get("index_total_size")),
            has_index_total_size="index_total_size" in value,
            index_only=NameList.from_stored(as_mapping(mismatch).get("index_only")),
            headers_only=NameList.from_stored(as_mapping(mismatch).get("headers_only")),
        )

    def to_dict(self) -> dict[str, Any]:
        """The summary as the stage stores it: "tensors" from headers only; "duplicates",
        "index_total_size" and "index_mismatch" only where there is something to say."""
        summary: dict[str, Any] = {
            "source": self.source,
            "total_size": self.total_size,
            "shard_count": self.shard_count,
            "tensor_count": self.tensor_count,
            "dtypes": dict(self.dtypes or {}),
        }
        if self.tensors is not None:
            summary["tensors"] = [dict(entry) for entry in self.tensors]
        if self.duplicates is not None:
            summary["duplicates"] = self.duplicates.to_dict()
        if self.has_index_total_size:
            summary["index_total_size"] = self.index_total_size
        if self.index_mismatch:
            summary["index_mismatch"] = {
                "index_only": (self.index_only or NameList()).to_dict(),
                "headers_only": (self.headers_only or NameList()).to_dict(),
            }
        return summary

    @property
    def from_headers(self) -> bool:
        """Whether every safetensors header was read (the tensors are known, not only the
        index's names)."""
        return self.source == FROM_HEADERS

    @property
    def index_mismatch(self) -> bool:
        """Whether the index and the headers name different tensors."""
        return bool(
            (self.index_only and self.index_only.count)
            or (self.headers_only and self.headers_only.count)
        )


@dataclass(frozen=True)
class TokenizerFile:
    """A tokenizer file stored: its name in the repo, its size and its SHA-256."""

    name: str
    bytes: int | None = None
    sha256: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.bytes, "sha256": self.sha256}


@dataclass(frozen=True)
class SkippedFile:
    """A tokenizer file not stored, and why."""

    name: str
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "reason": self.reason}


@dataclass(frozen=True)
class TokenizerFiles:
    """The release's tokenizer files (`tokenizer.fetch_tokenizer`): the folder they are kept
    in on the worker's disk (None: nothing stored), those stored and those skipped, and the
    kind of tokenizer they make (`tokenizer.tokenizer_kind`; "none" without a vocabulary)."""

    dir: str | None = None
    files: tuple[TokenizerFile, ...] = ()
    skipped: tuple[SkippedFile, ...] = ()
    kind: str = ""

    @classmethod
    def from_stored(cls, value: Any) -> TokenizerFiles | None:
        if not isinstance(value, Mapping):
            return None
        folder = value.get("dir")
        return cls(
            dir=folder if isinstance(folder, str) else None,
            files=tuple(
                TokenizerFile(
                    name=text(f.get("name")),
                    bytes=whole_number(f.get("bytes")),
                    sha256=text(f.get("sha256")),
                )
                for f in as_list(value.get("files"))
                if isinstance(f, Mapping)
            ),
            skipped=tuple(
                SkippedFile(name=text(f.get("name")), reason=text(f.get("reason")))
                for f in as_list(value.get("skipped"))
                if isinstance(f, Mapping)
            ),
            kind=text(value.get("kind")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "dir": self.dir,
            "files": [f.to_dict() for f in self.files],
            "skipped": [f.to_dict() for f in self.skipped],
            "kind": self.kind,
        }


@dataclass(frozen=True)
class FetchResult:
    """A fetch run's result: the release's repo and revision, the files fetched (sorted),
    its `config.json` (None where the row holds no object), `generation_config.json` (None
    without one), the weights summary, the model card's opening (`README_EXCERPT_CHARS`
    characters at most), how many files the repo lists and its tokenizer files (None where
    the row holds none: rows from before the stage fetched them)."""

    repo_id: str = ""
    revision: str = ""
    files: tuple[str, ...] = ()
    config: Mapping[str, Any] | None = None
    generation_config: Mapping[str, Any] | None = None
    weights: WeightsSummary | None = None
    readme_excerpt: str = ""
    file_count: int | None = None
    tokenizer: TokenizerFiles | None = None

    @classmethod
    def from_stored(cls, value: Any) -> FetchResult:
        """The result of a stored row; never raises."""
        result = as_mapping(value)
        config, generation = result.get("config"), result.get("generation_config")
        return cls(
            repo_id=text(result.get("repo_id")),
            revision=text(result.get("revision")),
            files=_strings(result.get("files")),
            config=dict(config) if isinstance(config, Mapping) else None,
            generation_config=dict(generation) if isinstance(generation, Mapping) else None,
            weights=WeightsSummary.from_stored(result.get("weights")),
            readme_excerpt=text(result.get("readme_excerpt")),
            file_count=whole_number(result.get("file_count")),
            tokenizer=TokenizerFiles.from_stored(result.get("tokenizer")),
        )

    def to_dict(self) -> dict[str, Any]:
        """The result as the stage stores it ("tokenizer" where its files were fetched)."""
        result: dict[str, Any] = {
            "repo_id": self.repo_id,
            "revision": self.revision,
            "files": list(self.files),
            "config": None if self.config is None else dict(self.config),
            "generation_config": (
                None if self.generation_config is None else dict(self.generation_config)
            ),
            "weights": None if self.weights is None else self.weights.to_dict(),
            "readme_excerpt": self.readme_excerpt,
            "file_count": self.file_count,
        }
        if self.tokenizer is not None:
            result["tokenizer"] = self.tokenizer.to_dict()
        return result

    def release_metadata(self) -> dict[str, Any]:
        """What the release keeps of the fetch besides its config (`ModelRelease.metadata`):
        the files fetched, the weights summary, the generation config and the model card's
        opening."""
        return {
            "files": list(self.files),
            "weights": None if self.weights is None else self.weights.to_dict(),
            "generation_config": (
                None if self.generation_config is None else dict(self.generation_config)
            ),
            "readme_excerpt": self.readme_excerpt,
        }

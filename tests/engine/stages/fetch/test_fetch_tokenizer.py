"""The fetch stage's tokenizer files, through the real huggingface_hub code path against the
fake Hub and through a mirror folder; and the small test tokenizers of tests/data/tokenizers."""

from __future__ import annotations

import hashlib
import json
import re
import struct
import tempfile
from pathlib import Path

import pytest

from engine.contract import PoolSpec, ReleaseRef, StageContext, StageTransientError
from engine.hubs.base import HubSpec
from engine.hubs.huggingface import HuggingFaceSource
from engine.hubs.mirror import MirrorSource
from engine.stages.fetch import tokenizer as tok
from engine.stages.fetch.run import run as fetch_run
from tests.data.tokenizers.make_tokenizer import COMMITTED, write_bpe_tokenizer
from tests.fakehub import FakeHub

TOKENIZERS = Path(__file__).resolve().parents[3] / "data" / "tokenizers"
LLAMA3 = {p.name: p.read_bytes() for p in sorted((TOKENIZERS / "llama3").iterdir())}
QWEN3 = {p.name: p.read_bytes() for p in sorted((TOKENIZERS / "qwen3").iterdir())}
SPECIAL_TOKENS_MAP = b'{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}\n'
CHAT_TEMPLATE = b"{% for m in messages %}{{ m['content'] }}{% endfor %}"
CONFIG = json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).encode()
POOL = PoolSpec(name="cpu", backend="cpu", queue="cpu")


def safetensors_file(n_bytes: int = 512 * 1024) -> bytes:
    """A real single-tensor safetensors file of `n_bytes` of data (far above the 100 kB the
    header read asks for), built by hand: u64 header length, JSON header, data."""
    header = json.dumps(
        {"w": {"dtype": "BF16", "shape": [n_bytes // 2], "data_offsets": [0, n_bytes]}}
    ).encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * n_bytes


WEIGHTS = safetensors_file()
# Never fetched: weights in every format, and tokenizer files outside the repo's root.
NEVER = {
    "model.safetensors": WEIGHTS,
    "pytorch_model.bin": b"\x80\x02" + b"\0" * 4096,
    "model.gguf": b"GGUF" + b"\0" * 4096,
    "original/tokenizer.model": b"IQ== 0\nIg== 1\n",
    "original/o200k.tiktoken": b"IQ== 0\nIg== 1\n",
    "subdir/tokenizer.json": b'{"not": "this one"}',
}


def sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def expected_dir(var: Path, files: dict[str, bytes]) -> str:
    """The folder the files must land in: the sha256 of their `sha256sum` listing."""
    listing = "".join(f"{sha256(files[name])}  {name}\n" for name in sorted(files))
    return str(var / "tokenizers" / sha256(listing.encode()))


def entries(files: dict[str, bytes]) -> list[dict]:
    return [{"name": n, "bytes": len(files[n]), "sha256": sha256(files[n])} for n in sorted(files)]


@pytest.fixture
def var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """DAY0_VAR_DIR for the test, as a worker has it."""
    folder = tmp_path / "var"
    monkeypatch.setenv("DAY0_VAR_DIR", str(folder))
    return folder


def hub_context(hub: FakeHub, repo_id: str, revision: str) -> StageContext:
    return StageContext(release=ReleaseRef("huggingface", hub.url, repo_id, revision), pool=POOL)


def hub_source(hub: FakeHub) -> HuggingFaceSource:
    return HuggingFaceSource(HubSpec(kind="huggingface", endpoint=hub.url))


_RESOLVE = re.compile(r"^/[^/]+/[^/]+/resolve/[^/]+/(.+)$")


def full_downloads(hub: FakeHub) -> list[str]:
    """Files whose whole body the hub sent (GET without a Range), in request order."""
    return [
        match.group(1)
        for r in hub.requests
        if r.method == "GET" and not r.range and r.status == 200
        if (match := _RESOLVE.match(r.path))
    ]


def asked(hub: FakeHub, name: str) -> list:
    return [r for r in hub.requests if (m := _RESOLVE.match(r.path)) and m.group(1) == name]


# -- through the fake Hub ----------------------------------------------------------------------


def test_hub_release_gets_its_root_tokenizer_files_and_never_weights(fake_hub, var):
    tokenizer_files = {
        **LLAMA3,
        "special_tokens_map.json": SPECIAL_TOKENS_MAP,
        "chat_template.jinja": CHAT_TEMPLATE,
    }
    sha = fake_hub.add_repo(
        "meta-llama/Llama-3.1-8B",
        {"config.json": CONFIG, "README.md": b"# Llama\n", **NEVER, **tokenizer_files},
    )
    lines: list[str] = []
    ctx = StageContext(
        release=ReleaseRef("huggingface", fake_hub.url, "meta-llama/Llama-3.1-8B", sha),
        pool=POOL,
        log=lines.append,
    )

    result = fetch_run(ctx)

    folder = expected_dir(var, tokenizer_files)
    assert result["tokenizer"] == {
        "dir": folder,
        "files": entries(tokenizer_files),
        "skipped": [],
        "kind": "fast",
    }
    assert {p.name: p.read_bytes() for p in Path(folder).iterdir()} == tokenizer_files
    assert list((var / "tokenizers").iterdir()) == [Path(folder)]  # no temporary folder left
    assert lines[-1] == (
        "tokenizer (fast): chat_template.jinja, special_tokens_map.json, tokenizer.json,"
        " tokenizer_config.json"
    )
    # The release files and the root tokenizer files were downloaded, in this order...
    assert full_downloads(fake_hub) == [
        "config.json",
        "README.md",
        "tokenizer_config.json",
        "tokenizer.json",
        "special_tokens_map.json",
        "chat_template.jinja",
    ]
    # ...the safetensors file was read by header ranges only, the rest never asked for.
    weight_requests = asked(fake_hub, "model.safetensors")
    assert weight_requests
    assert all(r.method == "GET" and r.range.startswith("bytes=") for r in weight_requests)
    assert sum(r.bytes_sent for r in weight_requests) <= 100_001 < len(WEIGHTS)
    for name in ("pytorch_model.bin", "model.gguf", "original/tokenizer.model"):
        assert asked(fake_hub, name) == []
    for name in ("original/o200k.tiktoken", "subdir/tokenizer.json"):
        assert asked(fake_hub, name) == []


def test_the_stored_folder_loads_in_transformers(fake_hub, var):
    from transformers import AutoTokenizer

    sha = fake_hub.add_repo("Qwen/Qwen3-8B", {"config.json": CONFIG, **QWEN3})

    result = fetch_run(hub_context(fake_hub, "Qwen/Qwen3-8B", sha))

    tokenizer = AutoTokenizer.from_pretrained(result["tokenizer"]["dir"])
    sentence = "The baker opened early on Tuesday, 2048 tokens of context!"
    assert tokenizer.decode(tokenizer(sentence)["input_ids"]) == sentence
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 1999)


def test_same_files_same_folder_not_rewritten_other_content_other_folder(fake_hub, var):
    first_sha = fake_hub.add_repo("meta-llama/Llama-3.1-8B", {"config.json": CONFIG, **LLAMA3})
    # Another release with the same tokenizer files shares the folder.
    other_sha = fake_hub.add_repo("meta-llama/Llama-3.1-70B", {"config.json": b"{}", **LLAMA3})
    qwen_sha = fake_hub.add_repo("Qwen/Qwen3-8B", {"config.json": CONFIG, **QWEN3})

    first = fetch_run(hub_context(fake_hub, "meta-llama/Llama-3.1-8B", first_sha))["tokenizer"]
    stored = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in Path(first["dir"]).iterdir()}
    again = fetch_run(hub_context(fake_hub, "meta-llama/Llama-3.1-8B", first_sha))["tokenizer"]
    other = fetch_run(hub_context(fake_hub, "meta-llama/Llama-3.1-70B", other_sha))["tokenizer"]
    qwen = fetch_run(hub_context(fake_hub, "Qwen/Qwen3-8B", qwen_sha))["tokenizer"]

    assert first["dir"] == expected_dir(var, LLAMA3)
    assert again == first
    assert other == first
    assert {
        p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in Path(first["dir"]).iterdir()
    } == stored
    assert qwen["dir"] == expected_dir(var, QWEN3)
    assert qwen["dir"] != first["dir"]
    assert sorted(p.name for p in (var / "tokenizers").iterdir()) == sorted(
        [Path(first["dir"]).name, Path(qwen["dir"]).name]
    )


def test_a_file_over_the_cap_is_not_downloaded(fake_hub, var):
    files = {**LLAMA3, "special_tokens_map.json": SPECIAL_TOKENS_MAP}
    sha = fake_hub.add_repo("meta-llama/Llama-3.1-8B", {"config.json": CONFIG, **files})
    fetched = hub_source(fake_hub).fetch_release("meta-llama/Llama-3.1-8B", sha)
    fake_hub.clear_log()
    config_bytes = len(LLAMA3["tokenizer_config.json"])  # 510

    result = tok.fetch_tokenizer(
        hub_source(fake_hub),
        "meta-llama/Llama-3.1-8B",
        sha,
        fetched.file_sizes,
        max_file_bytes=100_000,
        max_total_bytes=config_bytes + 10,
    )

    kept = {"tokenizer_config.json": LLAMA3["tokenizer_config.json"]}
    assert result == {
        "dir": expected_dir(var, kept),
        "files": entries(kept),
        "skipped": [
            {
                "name": "special_tokens_map.json",
                "reason": "62 bytes: would bring the tokenizer files to 572 bytes, over the"
                " 520-byte cap in all",
            },
            {
                "name": "tokenizer.json",
                "reason": "122,960 bytes: over the 100,000-byte cap per file",
            },
        ],
        "kind": "none",  # a config without its vocabulary
    }
    assert full_downloads(fake_hub) == ["tokenizer_config.json"]
    assert asked(fake_hub, "tokenizer.json") == []


def test_the_default_caps():
    assert tok.MAX_FILE_BYTES == 64 * 2**20
    assert tok.MAX_TOTAL_BYTES == 128 * 2**20


def test_invalid_json_is_skipped_with_the_reason_and_fetch_goes_on(fake_hub, var):
    broken_config = b'{"bos_token": }'
    sha = fake_hub.add_repo(
        "acme/broken",
        {
            "config.json": CONFIG,
            "tokenizer.json": LLAMA3["tokenizer.json"],
            "tokenizer_config.json": broken_config,
            "special_tokens_map.json": b"\xff{}",
            "added_tokens.json": b"[1, 2]",
        },
    )

    result = fetch_run(hub_context(fake_hub, "acme/broken", sha))

    kept = {"tokenizer.json": LLAMA3["tokenizer.json"]}
    assert result["config"]["model_type"] == "llama"
    assert result["tokenizer"] == {
        "dir": expected_dir(var, kept),
        "files": entries(kept),
        "skipped": [
            {"name": "added_tokens.json", "reason": "valid JSON but not an object"},
            {"name": "special_tokens_map.json", "reason": "not UTF-8 text (byte 0)"},
            {
                "name": "tokenizer_config.json",
                "reason": "not valid JSON: Expecting value at line 1 column 15 (char 14)",
            },
        ],
        "kind": "fast",
    }


def test_both_tokenizer_jsons_invalid_leaves_no_tokenizer(fake_hub, var):
    sha = fake_hub.add_repo(
        "acme/broken",
        {
            "config.json": CONFIG,
            "tokenizer.json": b'{"version": "1.0",',
            "tokenizer_config.json": b"{\n  'single': 'quotes'\n}",
        },
    )

    result = fetch_run(hub_context(fake_hub, "acme/broken", sha))

    assert result["tokenizer"] == {
        "dir": None,
        "files": [],
        "skipped": [
            {
                "name": "tokenizer.json",
                "reason": "not valid JSON: Expecting property name enclosed in double quotes"
                " at line 1 column 19 (char 18)",
            },
            {
                "name": "tokenizer_config.json",
                "reason": "not valid JSON: Expecting property name enclosed in double quotes"
                " at line 2 column 3 (char 4)",
            },
        ],
        "kind": "none",
    }
    assert not (var / "tokenizers").exists()


def test_a_release_without_tokenizer_files_has_kind_none(fake_hub, var):
    sha = fake_hub.add_repo(
        "acme/bare", {"config.json": CONFIG, "model.safetensors": WEIGHTS, **NEVER}
    )

    result = fetch_run(hub_context(fake_hub, "acme/bare", sha))

    assert result["tokenizer"] == {"dir": None, "files": [], "skipped": [], "kind": "none"}
    assert full_downloads(fake_hub) == ["config.json"]
    assert not (var / "tokenizers").exists()


def test_a_listed_file_the_hub_does_not_serve_is_skipped(fake_hub, var):
    sha = fake_hub.add_repo(
        "acme/gone", {"config.json": CONFIG, **LLAMA3, "added_tokens.json": b"{}"}
    )
    fake_hub.fail_next(
        f"/acme/gone/resolve/{sha}/added_tokens.json",
        404,
        {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"},
        times=5,
    )

    result = fetch_run(hub_context(fake_hub, "acme/gone", sha))

    assert result["tokenizer"]["files"] == entries(LLAMA3)
    assert result["tokenizer"]["kind"] == "fast"
    assert result["tokenizer"]["skipped"] == [
        {
            "name": "added_tokens.json",
            "reason": f"acme/gone@{sha}: added_tokens.json: no such file on {fake_hub.url}"
            " (HTTP 404): check the repo id and revision (hub says: Entry not found).",
        }
    ]


@pytest.mark.parametrize(
    ("status", "headers", "retry_after_s"),
    [(503, {}, None), (429, {"Retry-After": "30"}, 30.0)],
)
def test_a_transient_hub_error_on_a_tokenizer_file_retries_the_stage(
    fake_hub, var, status, headers, retry_after_s
):
    sha = fake_hub.add_repo("acme/flaky", {"config.json": CONFIG, **LLAMA3})
    fake_hub.fail_next(f"/acme/flaky/resolve/{sha}/tokenizer.json", status, headers, times=5)

    with pytest.raises(StageTransientError) as info:
        fetch_run(hub_context(fake_hub, "acme/flaky", sha))

    assert info.value.retry_after_s == retry_after_s
    assert not (var / "tokenizers").exists()


# -- through a mirror folder -------------------------------------------------------------------


def mirror_release(root: Path, repo_id: str, files: dict[str, bytes]) -> None:
    folder = root / repo_id
    for name, raw in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(raw)


def test_mirror_release_gets_its_root_tokenizer_files_and_never_weights(tmp_path, var, monkeypatch):
    root = tmp_path / "mirror"
    mirror_release(root, "Qwen/Qwen3-8B", {"config.json": CONFIG, **NEVER, **QWEN3})
    revision = MirrorSource(HubSpec(kind="mirror", endpoint=str(root))).latest_release(
        "Qwen/Qwen3-8B"
    )
    asked_names: list[str] = []
    fetch_files = MirrorSource.fetch_files

    def spy(self, repo_id, revision, names):
        asked_names.extend(names)
        return fetch_files(self, repo_id, revision, names)

    monkeypatch.setattr(MirrorSource, "fetch_files", spy)
    ctx = StageContext(
        release=ReleaseRef("mirror", str(root), "Qwen/Qwen3-8B", revision.revision), pool=POOL
    )

    first = fetch_run(ctx)["tokenizer"]
    again = fetch_run(ctx)["tokenizer"]

    assert first == {
        "dir": expected_dir(var, QWEN3),
        "files": entries(QWEN3),
        "skipped": [],
        "kind": "fast",
    }
    assert again == first
    assert asked_names == ["tokenizer_config.json", "tokenizer.json"] * 2


def test_mirror_sentencepiece_tiktoken_and_vocab_files(tmp_path, var):
    root = tmp_path / "mirror"
    sentencepiece = b"\n\x0e\n\x05<unk>\x15\x00\x00\x00\x00\x18\x02"  # protobuf, not text
    ranks = b"IQ== 0\nIg== 1\nIw== 2\n"
    releases = {
        "acme/spm": {"tokenizer.model": sentencepiece, "tokenizer_config.json": b"{}"},
        "acme/tiktoken": {"tiktoken.model": ranks, "tokenizer_config.json": b"{}"},
        "acme/qwen1": {"qwen.tiktoken": ranks},
        "acme/kimi-style": {"tokenizer.model": ranks},
        "acme/gpt2": {"vocab.json": b'{"a": 0}', "merges.txt": b"#version: 0.2\n"},
        "acme/bert": {"vocab.txt": b"[PAD]\n[UNK]\n"},
        "acme/merges-only": {"merges.txt": b"#version: 0.2\n"},
    }
    kinds = {}
    for repo_id, files in releases.items():
        mirror_release(root, repo_id, {"config.json": CONFIG, **files})
        ctx = StageContext(release=ReleaseRef("mirror", str(root), repo_id, "main"), pool=POOL)
        result = fetch_run(ctx)["tokenizer"]
        assert result["files"] == entries(files)
        assert result["dir"] == expected_dir(var, files)
        kinds[repo_id] = result["kind"]

    assert kinds == {
        "acme/spm": "sentencepiece",
        "acme/tiktoken": "tiktoken",
        "acme/qwen1": "tiktoken",
        "acme/kimi-style": "tiktoken",
        "acme/gpt2": "fast",
        "acme/bert": "fast",
        "acme/merges-only": "none",
    }


# -- the pieces ---------------------------------------------------------------------------------


def test_file_names_follow_transformers_root_only_never_weights():
    from transformers import tokenization_utils_base as base
    from transformers import tokenization_utils_tokenizers as fast
    from transformers.utils import hub

    listing = [
        "config.json",
        "model.safetensors",
        "pytorch_model.bin",
        "consolidated.pth",
        "model.gguf",
        "training_args.pt",
        "original/tokenizer.model",
        "original/o200k.tiktoken",
        "additional_chat_templates/tool_use.jinja",
        ".hidden.tiktoken",
        "o200k_base.tiktoken",
        "cl100k.tiktoken",
        *reversed(tok.TOKENIZER_FILES),
    ]

    assert tok.tokenizer_file_names(listing) == [
        *tok.TOKENIZER_FILES,
        "cl100k.tiktoken",
        "o200k_base.tiktoken",
    ]
    # The names are transformers' own.
    assert {
        base.TOKENIZER_CONFIG_FILE,
        base.FULL_TOKENIZER_FILE,
        base.SPECIAL_TOKENS_MAP_FILE,
        base.ADDED_TOKENS_FILE,
        hub.CHAT_TEMPLATE_FILE,
        hub.LEGACY_PROCESSOR_CHAT_TEMPLATE_FILE,
        fast.TIKTOKEN_VOCAB_FILE,
        fast.TIKTOKEN_LEGACY_NAME,
    } <= set(tok.TOKENIZER_FILES)


def test_a_damaged_folder_is_replaced_and_a_complete_one_reused(tmp_path):
    folder = tok.store_tokenizer_files(LLAMA3, tmp_path)
    (folder / "tokenizer.json").write_bytes(b"{}")

    again = tok.store_tokenizer_files(LLAMA3, tmp_path)

    assert again == folder
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == LLAMA3
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]


def test_the_store_is_under_the_temporary_folder_without_a_var_dir(monkeypatch):
    monkeypatch.delenv("DAY0_VAR_DIR", raising=False)
    assert tok.tokenizer_store_root() == Path(tempfile.gettempdir()) / "tokenizers"
    monkeypatch.setenv("DAY0_VAR_DIR", "/srv/day0/var")
    assert tok.tokenizer_store_root() == Path("/srv/day0/var/tokenizers")


# -- the test tokenizers of tests/data/tokenizers -------------------------------------------------


@pytest.mark.parametrize("kind", ["llama3", "qwen"])
def test_written_tokenizers_are_deterministic_and_match_the_committed_copies(tmp_path, kind):
    first = write_bpe_tokenizer(tmp_path / "a", kind=kind)
    second = write_bpe_tokenizer(tmp_path / "b", kind=kind)

    assert first == second == ["tokenizer.json", "tokenizer_config.json"]
    for name in first:
        written = (tmp_path / "a" / name).read_bytes()
        assert written == (tmp_path / "b" / name).read_bytes()
        assert written == (COMMITTED[kind] / name).read_bytes(), (
            f"regenerate with: .venv/bin/python tests/data/tokenizers/make_tokenizer.py ({name})"
        )


LLAMA3_SPECIALS = {
    "<|begin_of_text|>": 1995,
    "<|end_of_text|>": 1996,
    "<|start_header_id|>": 1997,
    "<|end_header_id|>": 1998,
    "<|eot_id|>": 1999,
}
QWEN_SPECIALS = {"<|endoftext|>": 1997, "<|im_start|>": 1998, "<|im_end|>": 1999}


@pytest.mark.parametrize(
    ("kind", "specials", "bos", "eos", "prompt"),
    [
        (
            "llama3",
            LLAMA3_SPECIALS,
            "<|begin_of_text|>",
            "<|eot_id|>",
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        (
            "qwen",
            QWEN_SPECIALS,
            None,
            "<|im_end|>",
            "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
        ),
    ],
)
def test_committed_tokenizers_load_in_transformers_and_round_trip(kind, specials, bos, eos, prompt):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(COMMITTED[kind])
    sentence = "Volcanoes, glaciers and 2048 earthquakes sculpt the planet: Ünïcödé 😀"
    ids = tokenizer(sentence)["input_ids"]

    assert len(tokenizer) == 2000
    assert {t: tokenizer.convert_tokens_to_ids(t) for t in specials} == specials
    assert (tokenizer.bos_token, tokenizer.eos_token) == (bos, eos)
    assert tokenizer.model_max_length == 131072
    assert ids[0] == specials[bos] if bos else ids[0] < 1995
    assert tokenizer.decode(ids, skip_special_tokens=True) == sentence
    messages = [{"role": "user", "content": "Hello there"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        prompt
    )


def test_other_vocab_sizes_and_refusals(tmp_path):
    from transformers import AutoTokenizer

    write_bpe_tokenizer(tmp_path / "small", vocab_size=600, kind="qwen")
    assert len(AutoTokenizer.from_pretrained(tmp_path / "small")) == 600

    with pytest.raises(ValueError, match="not the 9995 asked for"):
        write_bpe_tokenizer(tmp_path / "big", vocab_size=10_000)
    with pytest.raises(ValueError, match="fewer than the 256 bytes"):
        write_bpe_tokenizer(tmp_path / "tiny", vocab_size=100)
    with pytest.raises(ValueError, match="unknown tokenizer kind 'gpt2'"):
        write_bpe_tokenizer(tmp_path / "other", kind="gpt2")  # type: ignore[arg-type]

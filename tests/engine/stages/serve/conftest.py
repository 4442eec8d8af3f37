"""One real vLLM server for the serve tests that only need a running engine to talk to.

`tiny_engine` launches the tiny Llama (`engine_server.make_checkpoint`, seed 0) once for this
package and hands the same server to the precision checks, the real sweep and attach mode: a
launch costs tens of seconds on two busy cores, and those tests measure requests, not the launch.
The server wants an API key on /v1 (vLLM's `--api-key`; /health and /metrics stay open), as a
team's endpoint may, so attach mode can show that it sends one; the other tests send it too.

The tests whose subject is the launch itself (the stage's TP=2 and TP=1 launches, a flag the
engine refuses, an engine killed mid-sweep) still launch their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.engine.stages.serve.engine_server import (
    ENGINE_MISSING,
    EngineServer,
    engine_python,
    make_checkpoint,
    session_processes,
)

TINY_ENGINE_KEY = "team-endpoint-key-0451"


@dataclass(frozen=True)
class TinyEngine:
    """The shared server, the checkpoint folder it serves (also its served model name) and the
    key its /v1 routes want."""

    server: EngineServer
    python: Path
    checkpoint: Path
    api_key: str

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def model(self) -> str:
        return str(self.checkpoint)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


@pytest.fixture(scope="package")
def tiny_engine(tmp_path_factory):
    """The package's one vLLM on the tiny Llama (bfloat16, eager, `--max-logprobs 20`, `--api-key`);
    skips where the engine environment is missing. On teardown it checks that nothing of the
    server's session is left (API server, engine core and their children)."""
    python = engine_python()
    if python is None:
        pytest.skip(ENGINE_MISSING)
    root = tmp_path_factory.mktemp("tiny-engine")
    checkpoint = make_checkpoint(root / "checkpoint", seed=0)
    server = EngineServer(
        python,
        checkpoint,
        log_path=root / "vllm.log",
        # Eager (no torch.compile): ready in about 25 s instead of 57 s on 2 cores; these tests
        # measure requests, not compiled graphs.
        extra_args=("--enforce-eager", "--max-logprobs", "20", "--api-key", TINY_ENGINE_KEY),
    )
    with server:
        print(f"the shared vLLM was ready in {server.load_s:.1f} s")
        yield TinyEngine(server, python, checkpoint, TINY_ENGINE_KEY)
    assert session_processes(server.sid) == [], "the shared vLLM left processes behind"

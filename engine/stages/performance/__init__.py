"""The `performance` stage: prefill and decode speed and memory of the twin on the pool's device.

`run` is the stage; `options` checks its per-job options; `rows` flattens a result into the
rows the job stores.
"""

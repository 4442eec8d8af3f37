"""The `plan` stage: the TP/PP/EP/DP split a release needs on a pool, before the hardware.

Modules: `model` (the analysis as component bytes per dtype), `validity` (splits the
engines accept), `memory` (bytes per device), `communication` (bytes per token and their
time), `roofline` (predicted decode/prefill), `artifacts` (launch commands, Kubernetes),
`planner` (the choice, runners-up, scaling, `NoFittingPlan`), `calibration` (the roofline
against the scaled twin's measured speed, per pool, and the calibrated predictions).

As a stage (`run`), it plans the release analysed by the `analyze` stage on the job's pool,
with the job's plan options (`plan_options`); when nothing fits the pool it fails with the
engine's reason and keeps what would fit as the run's result (`no_fit_result`).

`run` is the stage, with its option check `plan_options` and the pool's layout.
"""

"""The `plan` stage: the TP/PP/EP/DP split a release needs on a pool, before the hardware.

`run` is the stage (and says how the planner's modules fit together); `options` checks the
job's plan options; `result` reads a stored plan back, typed, and makes every judgement of it;
`findings` and `notes` are its known-limitation rules and its section of the release notes.
The planner: `model`, `validity`, `memory`, `communication`, `roofline`, `layout`, `planner`,
`scaling`, `artifacts` (launch commands), `calibration`.
"""

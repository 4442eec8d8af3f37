"""The `distributed` stage: the plan's split run for real on torch.distributed.

`run` is the stage (and says how the modules fit together: `degree`, `launch`, `rank`,
`capture`, `compare`, `sharding`, `failures`); `options` checks the job's options and gives
the time limits; `result` reads a stored run back, typed, and makes every judgement of it;
`findings` and `notes` are its known-limitation rules and its section of the release notes.
"""

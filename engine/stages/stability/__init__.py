"""The `stability` stage: the twin served back to back for a while, watched for leaks and drift.

`run` is the stage; `options` checks its per-job options and gives its time limits.
"""

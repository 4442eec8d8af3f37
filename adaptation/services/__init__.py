"""Every write to day0's domain, by entity. Keyword-only functions named `<entity>_<verb>`.

Work is enqueued only after the transaction that created it commits (`queueing`), and
claimed with a conditional update (`stage_runs`), so a duplicate delivery of a Celery message
never runs a stage twice. A request the domain refuses raises `errors.ServiceError`.
"""

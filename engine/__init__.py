"""The adaptation engine: plain Python and torch, no Django.

`hubs/` reads releases from model hubs, `catalog/` holds the accelerators' datasheet figures,
`architecture/` analyses a config, `twin/` builds the scaled twin the measuring stages run,
`remote_code/` runs a release's own modeling code in a child process, `formatting` writes
figures, `contract` is what a stage takes and returns, and `registry` lists the stages, each
in its own folder under `stages/`. The Django app and the Celery workers call into it;
nothing here imports them (`lint-imports` checks it).
"""

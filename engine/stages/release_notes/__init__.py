"""The `release_notes` stage: what users of a release need to deploy it on a pool, gathered
from the earlier stages' results as data (`run`: the walk over the registry, the summary;
`not_validated`). Each stage's section lives in its own folder
(`engine/stages/<stage>/notes.py`) and reads what `engine.notes` holds; the app writes the
Markdown."""

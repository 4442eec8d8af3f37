"""The `release_notes` stage: what users of a release need to deploy it on a pool, written
from the earlier stages' results (`run`)."""

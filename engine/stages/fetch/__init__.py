"""The `fetch` stage: a release's describing files from its hub, parsed (`run`)."""

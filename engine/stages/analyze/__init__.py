"""The `analyze` stage: the architecture analysis of the fetched config and weights summary
(`run`; the analysis itself is `engine.architecture`)."""

"""One folder per stage, in the order `engine.registry` runs them."""

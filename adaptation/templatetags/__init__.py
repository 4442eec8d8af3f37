"""Template tags and filters of the adaptation app."""

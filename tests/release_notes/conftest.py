"""Release-notes test fixtures: the named cast of permission tests (`tests.cast`)."""

from tests.cast import cast  # noqa: F401  (the fixture)

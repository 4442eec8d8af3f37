"""Stack test fixtures: the named cast of roles (`tests.cast`)."""

from tests.cast import cast  # noqa: F401  (the fixture)

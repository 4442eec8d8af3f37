"""App test fixtures: the named cast of roles (`tests.cast`), a second pool (`h200`) for the
report tests and a job with chosen stored figures (`perf_job`) for the regression tests."""

from tests.cast import cast  # noqa: F401  (the fixture)
from tests.regression_runs import perf_job  # noqa: F401  (the fixture)
from tests.report_runs import h200  # noqa: F401  (the fixture)

"""The figures the known-limitation notes and the release notes share
(`engine.formatting`): what a stored result may hold (None, strings, bools, NaN)
writes "—", and each unit reads as the pages write it."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from engine import formatting as fmt


@pytest.mark.parametrize("value", [None, "12", True, math.nan, math.inf, [1]])
def test_what_is_not_a_finite_number_is_missing(value):
    assert fmt.finite(value) is None
    for writer in (fmt.count, fmt.gib, fmt.params, fmt.ms, fmt.rate, fmt.sig, fmt.percent):
        assert writer(value) == fmt.MISSING
    assert fmt.scientific(value) == fmt.seconds(value) == "—"


def test_each_unit_reads_as_the_pages_write_it():
    assert fmt.count(131072) == "131,072"
    assert fmt.gib(16 * 2**30) == "16.0 GiB"
    assert fmt.gib(70272 * 1024) == "0.067 GiB"  # three decimals below 1 GiB
    assert fmt.gib(0) == "0.0 GiB"
    assert fmt.params(2_318_848) == "2.3 M" and fmt.params(20_914_757_184) == "20.9 B"
    assert fmt.ms(0.016430306) == "16.4 ms" and fmt.ms(0.25) == "250 ms"
    assert fmt.rate(121.726) == "122" and fmt.rate(8.512) == "8.51"
    assert fmt.sig(0.0312345) == "0.0312" and fmt.sig(20.0213, 5) == "20.021"
    assert fmt.scientific(7.450580596923828e-07) == "7.45e-07"
    assert fmt.scientific(0.9030786752700806) == "9.03e-01"
    assert fmt.percent(0.1109464) == "11.1 %"
    assert fmt.seconds(20.02) == "20.0 s"


def test_a_count_takes_its_noun_in_the_singular_only_for_one():
    assert fmt.counted(1, "tensor") == "1 tensor"
    assert fmt.counted(0, "tensor") == "0 tensors"
    assert fmt.counted(1_234, "MTP module") == "1,234 MTP modules"
    assert fmt.counted(2, "index", "indexes") == "2 indexes"
    assert fmt.counted(None, "layer") == "— layers"


def test_exit_statuses_follow_a_subject():
    assert fmt.exit_status(1) == "exited with code 1"
    assert fmt.exit_status(-9) == "was killed by SIGKILL"
    assert fmt.exit_status(-15) == "was killed by SIGTERM"
    assert fmt.exit_status(-200) == "was killed by signal 200"
    assert fmt.exit_status(None) == "ended with no exit status recorded"


def test_the_module_imports_neither_django_nor_torch():
    code_line = (
        "import sys, engine.formatting; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('django', 'torch')]; "
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code_line], check=False).returncode == 0


def test_a_duration_in_hours_reads_as_other_durations_do():
    # The reports' median time to Day-0 is kept in hours: 0.09 h is 5 m 24 s, not "0.09 h".
    assert fmt.hours_duration(0.09) == "5 m 24 s"
    assert fmt.hours_duration(30.5) == "1 d 06 h"
    assert fmt.hours_duration(None) == fmt.MISSING

"""Unit factors of the figures day0 reads and shows.

Memory is binary (GiB, 2**30 bytes) everywhere on the site, as transformers and the serving
engines report it; bandwidth and compute are decimal (GB/s, TB/s, TFLOP/s), as the
accelerators' datasheets give them.
"""

from __future__ import annotations

GIB = 2**30
MIB = 2**20
GIGA = 1e9
TERA = 1e12


def gb_per_s_to_bytes_per_s(value: float | None) -> float | None:
    """A bandwidth entered in GB/s (decimal, as datasheets and the pool's fields give it) in
    bytes/s, as the planner takes it; None (blank: the catalog's figure) stays None."""
    return None if value is None else float(value) * GIGA

"""Shape domain rows into the values the pages show: one module per page or panel.

Presenters return numbers (seconds, bytes, tokens/s, ratios), states ("passed", "waiting"),
names and small dataclasses; the templates hold the labels and sentences and write numbers
through the `day0_format` filters (`engine.formatting`). Nothing here queries the database
beyond the rows (and prefetched relations) it is handed, unless a function says so; the views
read through `adaptation.selectors` and pass the results in.
"""

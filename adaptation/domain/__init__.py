"""The app's domain rules as plain functions of plain values: what the rows mean, never how
they are read. Selectors read the rows and hand them here; presenters, the API and the
notifications call the same functions, so a figure is worked out in one place.

- `stages`: a stage as every reader names it (its registry title);
- `reports`: the managers' reports reduced from the rows `selectors.reports` reads (the
  reports page and CSV, and the weekly summary the notifications send).

Nothing here queries the database or words a value: the templates hold the words. Rules that
need nothing of Django live in the engine instead (`engine.pool_queue`: when a plan can start
on its pool). The selectors never import this package: it reads their rows' types.
"""

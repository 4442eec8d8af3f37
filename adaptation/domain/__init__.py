"""The app's domain rules as plain functions of plain values: what the rows mean, never how
they are read. Selectors read the rows and hand them here; presenters, the API and the
notifications call the same functions, so a figure is worked out in one place.

- `pool_queue`: when a plan can start on its pool, simulating its queue first come, first
  served (`selectors.inventory.plan_start_estimate` reads the pool and calls it);
- `reports`: the managers' reports reduced from the rows `selectors.reports` reads (the
  reports page and CSV, and the weekly summary the notifications send).

Nothing here queries the database or words a value: the templates hold the words.
"""

"""/metrics in Prometheus's text format (docs/operations.md, "Metrics").

- `collector`: day0's domain figures (jobs, stage runs and their durations, queues, live
  workers, webhook deliveries, hub polls, time-to-detect and time-to-Day-0, the serving
  engine's figures) read from the database at scrape time, so the workers' figures need no
  pushgateway;
- `reads`: the aggregate queries behind them, a fixed number whatever the number of rows;
- `access`: who may read it (a bearer token or a network allow-list, never open by default);
- `exposition`: the text of one scrape, the web process's own figures (django-prometheus)
  followed by the domain's.

The view is `adaptation.views.metrics`.
"""

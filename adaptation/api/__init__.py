"""day0's REST API (Django REST framework), mounted at `/api/v1/`: releases, jobs (create,
cancel, re-run a stage), stage runs, pools with their workers and queue, and webhook
endpoints. Views are thin: reads go through `adaptation.selectors` and `inventory`, writes
through `adaptation.services`; every error has the one shape of `exceptions.error_handler`."""

"""The pages, a module per page: `board`, `releases` (a release's page and the job actions on
it), `compare_pools`, `performance` (a job's CSV and the compare view), `release_notes`,
`limitations`, `pools` and `reports`; what they share is in `access` (sign-in and
permissions) and `live` (a full page or, for an htmx poll, its live part). The URLs are in
`adaptation/urls.py`.

Views are thin: they read through `adaptation.selectors`, shape through
`adaptation.presenters` and write through `adaptation.services`.
"""

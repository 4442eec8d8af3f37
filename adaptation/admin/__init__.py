"""The admin, a module per kind of row: `pools` (pools, accelerator kinds, workers),
`releases` (hub watches, releases, jobs and their stage attempts, stored results),
`limitations`, `release_notes`, `webhooks` (endpoints, deliveries, uploads),
`notifications` (teams, subscriptions, deliveries), `tokens` (API tokens: digests only, a
superuser's made only by a superuser) and `users` (superuser-only fields guarded);
`messages` holds what the admin tells a person once (a new secret), `read_only` the classes
of rows the admin shows but neither adds nor edits.
"""

from adaptation.admin import (  # noqa: F401  (each module registers its rows)
    limitations,
    notifications,
    pools,
    release_notes,
    releases,
    tokens,
    users,
    webhooks,
)

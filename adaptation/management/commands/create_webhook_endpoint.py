"""`python manage.py create_webhook_endpoint --kind huggingface|generic --name NAME
[--pool POOL] [--quiet-period-s N] [--format text|json]`.

Creates an inbound webhook endpoint and prints its URL path and its secret, once: day0 keeps
only a digest (Hub) or the encrypted signing key (generic), and shows neither again. JSON:
`{"id", "kind", "name", "url", "secret", "pool", "quiet_period_s"}`, `url` being the path to
append to day0's address. An unknown pool or a name in use exits 1 with the reason.
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from adaptation.management.arguments import number_of
from adaptation.models import WebhookKind
from adaptation.services.errors import ServiceError
from adaptation.services.pools import pool_get
from adaptation.webhooks.endpoints import (
    EndpointError,
    webhook_endpoint_create,
    webhook_setup_hint,
    webhook_url_path,
)


class Command(BaseCommand):
    help = "Create an inbound webhook endpoint; print its URL path and secret (shown once)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--kind", required=True, choices=WebhookKind.values)
        parser.add_argument("--name", required=True, help="A unique name for the endpoint.")
        parser.add_argument(
            "--pool",
            default=None,
            help="Pool for its jobs (default: the matching watch's pool for a Hub endpoint, "
            "DAY0_DEFAULT_POOL for a generic one, unless a delivery names one).",
        )
        parser.add_argument(
            "--quiet-period-s",
            type=number_of("seconds", minimum=0),
            default=None,
            help="Hub endpoints: seconds a repo must be quiet before its job starts (60).",
        )
        parser.add_argument("--format", choices=("text", "json"), default="text")

    def handle(self, *args, **options) -> None:
        try:
            pool = pool_get(name=options["pool"]) if options["pool"] else None
            endpoint, secret = webhook_endpoint_create(
                name=options["name"],
                kind=options["kind"],
                pool=pool,
                quiet_period_s=options["quiet_period_s"],
            )
        except (ServiceError, EndpointError) as exc:
            raise CommandError(str(exc)) from exc
        url = webhook_url_path(endpoint)
        if options["format"] == "json":
            self.stdout.write(
                json.dumps(
                    {
                        "id": str(endpoint.pk),
                        "kind": endpoint.kind,
                        "name": endpoint.name,
                        "url": url,
                        "secret": secret,
                        "pool": endpoint.pool.name if endpoint.pool else None,
                        "quiet_period_s": endpoint.quiet_period_s,
                    }
                )
            )
            return
        self.stdout.write(f"Created {endpoint.get_kind_display()} endpoint {endpoint.name!r}.")
        self.stdout.write(f"  id:      {endpoint.pk}")
        self.stdout.write(f"  URL:     {url}")
        self.stdout.write(f"  secret:  {secret}")
        self.stdout.write("The secret is shown only this once; day0 cannot show it again.")
        self.stdout.write(webhook_setup_hint(endpoint, url=url))

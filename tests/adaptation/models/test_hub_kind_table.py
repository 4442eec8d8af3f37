"""The app's hub kinds come from the engine's table (`engine.hubs.kinds`): the `HubKind`
choices keep the stored values, and a new row is a watch kind, an allow-list kind, a token
rule, a repo link and a refusal message without any other change, and without a migration."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.core.exceptions import ValidationError
from django.db.migrations.autodetector import MigrationAutodetector
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.state import ProjectState
from django.utils import timezone

from adaptation.models import AllowedHubEndpoint, HubKind, HubWatch, ModelRelease
from adaptation.models.hub_endpoints import hub_endpoint_refusal, hub_endpoint_unlisted_reason
from engine.hubs import kinds, trust
from engine.hubs.kinds import HubKindSpec, allow_list_kind_choices, hub_kind_choices

# The fields whose choices are the table's, as (model, field).
KIND_FIELDS = {
    ("hubwatch", "kind"),
    ("modelrelease", "hub_kind"),
    ("allowedhubendpoint", "hub_kind"),
}

NEW_ROW = HubKindSpec(
    kind="acmehub",
    label="Acme Hub",
    source="engine.hubs.huggingface.HuggingFaceSource",  # a Hugging Face-compatible hub
    endpoint="url",
    endpoint_variable="ACMEHUB_ENDPOINT",
    public_endpoint="https://hub.acme.example",
    token_variable="ACMEHUB_TOKEN",
    repo_url="{endpoint}/m/{repo_id}",
)


@pytest.fixture
def new_row(monkeypatch: pytest.MonkeyPatch) -> HubKindSpec:
    monkeypatch.setattr(kinds, "HUB_KIND_SPECS", (*kinds.HUB_KIND_SPECS, NEW_ROW))
    monkeypatch.delenv("ACMEHUB_ENDPOINT", raising=False)
    return NEW_ROW


def kind_field_changes() -> set[tuple[str, str]]:
    """The kind fields the migration autodetector would alter (the models against the
    migrations' state)."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    detector = MigrationAutodetector(loader.project_state(), ProjectState.from_apps(apps))
    changes = detector.changes(graph=loader.graph)
    altered = {
        (op.model_name, op.name)
        for migration in changes.get("adaptation", [])
        for op in migration.operations
        if hasattr(op, "model_name")
    }
    return altered & KIND_FIELDS


def test_hub_kind_keeps_its_stored_values():
    assert HubKind.HUGGINGFACE == "huggingface"
    assert HubKind.MODELSCOPE == "modelscope"
    assert HubKind.MIRROR == "mirror"
    assert HubKind("mirror").label == "Mirror folder"
    assert HubKind.choices == hub_kind_choices()


def test_the_kind_fields_read_the_table():
    assert HubWatch._meta.get_field("kind").deconstruct()[3]["choices"] is hub_kind_choices
    assert ModelRelease._meta.get_field("hub_kind").deconstruct()[3]["choices"] is hub_kind_choices
    field = AllowedHubEndpoint._meta.get_field("hub_kind")
    assert field.deconstruct()[3]["choices"] is allow_list_kind_choices
    assert kind_field_changes() == set()


def test_a_new_row_needs_no_migration(new_row):
    assert ("acmehub", "Acme Hub") in list(HubWatch._meta.get_field("kind").choices)
    assert ("acmehub", "Acme Hub") in list(AllowedHubEndpoint._meta.get_field("hub_kind").choices)
    HubWatch._meta.get_field("kind").validate("acmehub", HubWatch())
    with pytest.raises(ValidationError):
        HubWatch._meta.get_field("kind").validate("gitea", HubWatch())
    assert kind_field_changes() == set()


def test_a_new_row_has_its_repo_link_and_publication_time(new_row):
    now = timezone.now()
    release = ModelRelease(
        hub_kind="acmehub", hub_endpoint="https://a.example/", repo_id="o/m", published_at=now
    )
    assert release.hub_repo_url == "https://a.example/m/o/m"
    assert release.publication_known is True
    mirrored = ModelRelease(
        hub_kind="mirror", hub_endpoint="/srv/m", repo_id="o/m", published_at=now
    )
    assert mirrored.hub_repo_url == ""
    assert mirrored.publication_known is False


@pytest.mark.django_db
def test_a_new_row_has_the_watch_rules_and_the_token_rule(new_row):
    # A watch of the new kind: its configured hub, else its allow-list entries, by its name.
    watch = HubWatch(kind="acmehub", endpoint="")
    assert watch.endpoint_refusal() == ""
    reason = hub_endpoint_unlisted_reason("https://other.example", "acmehub")
    assert "ACMEHUB_ENDPOINT (https://hub.acme.example" in reason
    assert "Acme Hub on the admin's Allowed hub endpoints (none yet)" in reason

    # An allow-list entry of the new kind serves it, and only it: so does its token.
    AllowedHubEndpoint.objects.create(
        hub_kind="acmehub", url="http://127.0.0.1:8123", allow_private_network=True
    )
    assert hub_endpoint_refusal("http://127.0.0.1:8123", "acmehub") == ""
    assert "is not a configured hub" in hub_endpoint_refusal("http://127.0.0.1:8123")
    assert trust.token_allowed("http://127.0.0.1:8123", "acmehub") is True
    assert trust.token_allowed("http://127.0.0.1:8123", "huggingface") is False
    assert trust.token_allowed("http://127.0.0.1:8124", "acmehub") is False

"""/api/v1/webhook-endpoints/: the admin's; the secret is answered once, at creation."""

from __future__ import annotations

import pytest

from adaptation.models import DeliveryVerdict, PendingUpload, WebhookDelivery, WebhookEndpoint
from adaptation.secrets import secret_decrypt, secret_matches
from adaptation.webhooks.endpoints import webhook_endpoint_create
from tests.adaptation.api.conftest import results

pytestmark = pytest.mark.django_db

URL = "/api/v1/webhook-endpoints/"
SECRET_FIELDS = {"secret", "secret_digest", "secret_ciphertext"}


@pytest.fixture
def endpoint(cast):
    endpoint, _ = webhook_endpoint_create(name="hub-main", kind="huggingface", created_by=cast.ada)
    return endpoint


@pytest.mark.parametrize(
    ("who", "expected"), [(None, 401), ("nina", 403), ("mona", 403), ("eli", 403), ("ada", 200)]
)
def test_only_admins_read_endpoints(cast, endpoint, who, expected):
    api = cast.api(who)
    assert api.get(URL).status_code == expected
    assert api.get(f"{URL}{endpoint.pk}/").status_code == expected


def test_list_and_detail_never_show_a_secret(cast, endpoint):
    rows = results(cast.api("ada").get(URL))
    assert rows == [
        {
            "id": str(endpoint.pk),
            "name": "hub-main",
            "kind": "huggingface",
            "url": f"/webhooks/huggingface/{endpoint.pk}",
            "pool": None,
            "quiet_period_s": 60,
            "enabled": True,
            "created_by": "ada",
            "created_at": rows[0]["created_at"],
            "last_delivery_at": None,
        }
    ]
    detail = cast.api("ada").get(f"{URL}{endpoint.pk}/").json()
    assert not SECRET_FIELDS & set(detail)


@pytest.mark.parametrize(
    ("who", "expected"), [(None, 401), ("nina", 403), ("mona", 403), ("eli", 403), ("ada", 201)]
)
def test_only_admins_create_endpoints(cast, seeded, who, expected):
    response = cast.api(who).post(
        URL, {"name": "ci", "kind": "generic", "pool": "h200"}, format="json"
    )
    assert response.status_code == expected
    assert WebhookEndpoint.objects.filter(name="ci").count() == (1 if expected == 201 else 0)


def test_create_answers_the_secret_once(cast, seeded):
    response = cast.api("ada").post(
        URL, {"name": "ci", "kind": "generic", "pool": "h200", "quiet_period_s": 5}, format="json"
    )
    assert response.status_code == 201
    body = response.json()
    endpoint = WebhookEndpoint.objects.get(name="ci")
    assert body["id"] == str(endpoint.pk)
    assert body["url"] == f"/webhooks/generic/{endpoint.pk}"
    assert (body["pool"], body["quiet_period_s"], body["created_by"]) == ("h200", 5, "ada")
    assert body["secret"].startswith("whsec_")
    assert secret_decrypt(endpoint.secret_ciphertext) == body["secret"]
    assert not {"secret_digest", "secret_ciphertext"} & set(body)
    # Never again.
    again = cast.api("ada").get(f"{URL}{endpoint.pk}/").json()
    assert body["secret"] not in str(again) and "secret" not in again


def test_a_hub_endpoint_keeps_only_a_digest(cast):
    body = cast.api("ada").post(URL, {"name": "hub", "kind": "huggingface"}, format="json").json()
    endpoint = WebhookEndpoint.objects.get(pk=body["id"])
    assert endpoint.secret_ciphertext == ""
    assert body["secret"] not in endpoint.secret_digest
    assert secret_matches(body["secret"], endpoint.secret_digest)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "generic"}, "name"),
        ({"name": "x", "kind": "gitlab"}, "kind"),
        ({"name": "x", "kind": "generic", "pool": "nope"}, "pool"),
        ({"name": "x", "kind": "generic", "quiet_period_s": -1}, "quiet_period_s"),
    ],
)
def test_create_refuses_bad_input(cast, body, field):
    response = cast.api("ada").post(URL, body, format="json")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == [field]


def test_a_taken_name_is_refused(cast, endpoint):
    response = cast.api("ada").post(URL, {"name": "hub-main", "kind": "generic"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"] == {
        "code": "invalid",
        "message": "An endpoint named 'hub-main' exists already.",
    }


@pytest.mark.parametrize(
    ("who", "expected"), [(None, 401), ("nina", 403), ("mona", 403), ("eli", 403), ("ada", 204)]
)
def test_only_admins_delete_endpoints(cast, endpoint, who, expected):
    assert cast.api(who).delete(f"{URL}{endpoint.pk}/").status_code == expected
    assert WebhookEndpoint.objects.filter(pk=endpoint.pk).exists() == (expected != 204)


def test_a_malformed_id_is_a_404(cast):
    response = cast.api("ada").get(f"{URL}not-a-uuid/")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_endpoints_cannot_be_edited_through_the_api(cast, endpoint):
    response = cast.api("ada").patch(f"{URL}{endpoint.pk}/", {"name": "x"}, format="json")
    assert response.status_code == 405


def test_an_endpoint_with_deliveries_is_not_deleted_but_refused_with_409(cast, endpoint):
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint, status_code=401, verdict=DeliveryVerdict.REJECTED
    )
    response = cast.api("ada").delete(f"{URL}{endpoint.pk}/")

    assert response.status_code == 409
    assert response.json() == {
        "error": {
            "code": "conflict",
            "message": "Endpoint 'hub-main' has received deliveries, which are kept as its "
            "log: disable it instead (uncheck Enabled in the admin), and it answers 404.",
        }
    }
    assert WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()
    assert WebhookDelivery.objects.filter(pk=delivery.pk).exists()


def test_an_endpoint_with_a_pending_upload_is_not_deleted(cast, endpoint, seeded):
    PendingUpload.objects.create(
        endpoint=endpoint, pool=seeded.cpu, hub_endpoint="https://huggingface.co",
        repo_id="acme-ai/x", revision="a" * 40,
    )  # fmt: skip
    assert cast.api("ada").delete(f"{URL}{endpoint.pk}/").status_code == 409
    assert WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()

"""The table of hub kinds (`engine.hubs.kinds`): each row is complete, and a new row is all the
engine needs for a new kind (its source, its configured endpoint, its token rule)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.hubs import HubSpec, canonical_endpoint, hub_source, kinds, trust
from engine.hubs.kinds import HubKindSpec, hub_kind_spec

ENV_EXAMPLE = Path(__file__).resolve().parents[3] / ".env.example"


class TableSource:
    """A source for the test row: remembers its spec, lists nothing."""

    def __init__(self, spec: HubSpec) -> None:
        self.spec = spec

    def list_releases(self, *, limit: int = 50) -> list:
        return []


NEW_ROW = HubKindSpec(
    kind="acmehub",
    label="Acme Hub",
    source=f"{__name__}.TableSource",
    endpoint="url",
    endpoint_variable="ACMEHUB_ENDPOINT",
    public_endpoint="https://hub.acme.example",
    token_variable="ACMEHUB_TOKEN",
    repo_url="{endpoint}/m/{repo_id}",
)


@pytest.fixture
def new_row(monkeypatch: pytest.MonkeyPatch) -> HubKindSpec:
    """`NEW_ROW` added to the table, with no app check registered."""
    monkeypatch.setattr(kinds, "HUB_KIND_SPECS", (*kinds.HUB_KIND_SPECS, NEW_ROW))
    monkeypatch.setattr(trust, "_token_check", None)
    monkeypatch.delenv("ACMEHUB_ENDPOINT", raising=False)
    return NEW_ROW


def test_the_stored_values_and_labels_are_the_ones_rows_hold():
    assert kinds.hub_kind_choices() == [
        ("huggingface", "Hugging Face Hub"),
        ("modelscope", "ModelScope"),
        ("mirror", "Mirror folder"),
    ]
    assert kinds.allow_list_kind_choices() == [
        ("huggingface", "Hugging Face Hub"),
        ("modelscope", "ModelScope"),
    ]
    assert kinds.kinds_without_publication_time() == ("mirror",)


@pytest.mark.parametrize("spec", kinds.HUB_KIND_SPECS, ids=lambda spec: spec.kind)
def test_every_row_names_an_importable_source(spec: HubKindSpec):
    source = spec.source_class()
    for method in ("list_releases", "latest_release", "release_at", "fetch_release", "fetch_files"):
        assert callable(getattr(source, method, None)), f"{spec.source} lacks {method}"


@pytest.mark.parametrize("spec", kinds.HUB_KIND_SPECS, ids=lambda spec: spec.kind)
def test_every_variable_a_row_reads_is_documented(spec: HubKindSpec):
    documented = set(re.findall(r"^#?([A-Z][A-Z0-9_]*)=", ENV_EXAMPLE.read_text(), re.M))
    named = {spec.endpoint_variable, spec.token_variable} - {""}
    assert named <= documented, f".env.example lacks {named - documented}"


def test_a_url_hub_needs_its_variables_and_a_folder_has_none():
    with pytest.raises(ValueError, match="not a lower-case identifier"):
        HubKindSpec(kind="my-hub", label="M", source="m.M", endpoint="folder")
    with pytest.raises(ValueError, match="needs its endpoint variable"):
        HubKindSpec(kind="x", label="X", source="x.X", endpoint="url", public_endpoint="https://x")
    with pytest.raises(ValueError, match="has no endpoint or token variable"):
        HubKindSpec(kind="y", label="Y", source="y.Y", endpoint="folder", token_variable="Y_TOKEN")


def test_an_unknown_kind_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown hub kind 'gitea': known kinds are huggingface"):
        hub_kind_spec("gitea")
    assert kinds.known_hub_kind("gitea") is None
    # A stored row of an unknown kind keeps its endpoint as written.
    assert canonical_endpoint(HubSpec(kind="gitea", endpoint="https://g.example/")) == (
        "https://g.example/"
    )


def test_a_new_row_is_a_source_with_its_endpoint_and_token_rule(new_row, monkeypatch):
    source = hub_source(HubSpec(kind="acmehub", author="acme"))
    assert isinstance(source, TableSource) and source.spec.author == "acme"
    # A blank endpoint is the kind's variable, else its public hub, without a trailing slash.
    assert canonical_endpoint(HubSpec(kind="acmehub")) == "https://hub.acme.example"
    monkeypatch.setenv("ACMEHUB_ENDPOINT", "https://acme.internal:8443/")
    assert canonical_endpoint(HubSpec(kind="acmehub")) == "https://acme.internal:8443"
    assert new_row.repo_page("https://acme.internal:8443/", "acme/m-7b") == (
        "https://acme.internal:8443/m/acme/m-7b"
    )

    # Its token goes to its configured hub however spelled, elsewhere only when the check says.
    assert trust.token_allowed("HTTPS://Acme.Internal:8443/", "acmehub") is True
    assert trust.token_allowed("https://other.example", "acmehub") is False
    asked: list[tuple[str, str]] = []

    def check(endpoint: str, kind: str) -> bool:
        asked.append((endpoint, kind))
        return kind == "acmehub"

    trust.token_check_set(check)
    assert trust.token_allowed("https://other.example", "acmehub") is True
    assert trust.token_allowed("https://other.example", "huggingface") is False
    assert asked == [("https://other.example", "acmehub"), ("https://other.example", "huggingface")]


def test_a_kind_without_a_token_takes_none():
    with pytest.raises(ValueError, match="takes no token"):
        trust.token_allowed("/srv/mirror", "mirror")


def test_a_hub_compatible_row_reuses_the_hugging_face_source_with_its_own_token(
    fake_hub, monkeypatch
):
    row = HubKindSpec(
        kind="sitehub",
        label="Site Hub",
        source="engine.hubs.huggingface.HuggingFaceSource",
        endpoint="url",
        endpoint_variable="SITEHUB_ENDPOINT",
        public_endpoint="https://hub.site.example",
        token_variable="SITEHUB_TOKEN",
    )
    monkeypatch.setattr(kinds, "HUB_KIND_SPECS", (*kinds.HUB_KIND_SPECS, row))
    monkeypatch.setattr(trust, "_token_check", None)
    fake_hub.valid_tokens.add("site-token")
    fake_hub.add_repo("acme/gated-7b", {"config.json": b'{"model_type": "llama"}'}, gated=True)
    monkeypatch.setenv("HF_TOKEN", "hf_fake_valid_token")
    monkeypatch.setenv("SITEHUB_ENDPOINT", fake_hub.url)
    monkeypatch.setenv("SITEHUB_TOKEN", "site-token")

    source = hub_source(HubSpec(kind="sitehub"))
    assert source.fetch_release("acme/gated-7b", "main").files["config.json"]
    sent = {r.headers.get("authorization") for r in fake_hub.requests}
    assert sent == {"Bearer site-token"}  # its own token, never HF_TOKEN

    # Elsewhere (not its configured hub, no check): no token at all, not even HF_TOKEN.
    monkeypatch.setenv("SITEHUB_ENDPOINT", "https://hub.site.example")
    fake_hub.clear_log()
    elsewhere = hub_source(HubSpec(kind="sitehub", endpoint=fake_hub.url))
    assert elsewhere.latest_release("acme/gated-7b").repo_id == "acme/gated-7b"
    assert fake_hub.requests
    assert {r.headers.get("authorization") for r in fake_hub.requests} == {None}

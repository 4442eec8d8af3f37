"""The release page's "Known limitations" panel, adding and editing notes by role, Markdown
rendered safely, the board's count per release, and the admin."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from adaptation.models import AcceleratorPool, KnownLimitation, StageRun
from adaptation.services import limitations
from adaptation.templatetags.day0_markdown import markdown
from tests import dom
from tests.factories import make_job, make_release

pytestmark = pytest.mark.django_db

XSS = {
    "script": "<script>alert(1)</script>",
    "javascript link": "[x](javascript:alert(1))",
    "img onerror": "<img src=x onerror=alert(1)>",
}


def stage_note(release, **fields) -> KnownLimitation:
    """A note as a stage raises it (`key` set)."""
    defaults = {
        "title": "aten::_grouped_mm is missing on pool cpu",
        "body": "The backend has **no kernel** for `aten::_grouped_mm`.",
        "severity": "blocker",
        "key": "operators:missing:aten::_grouped_mm",
        "stage": "operators",
        "pool": AcceleratorPool.objects.get(name="cpu"),
    }
    return KnownLimitation.objects.create(release=release, **(defaults | fields))


def panel(html: str) -> str:
    """The markup of the release page's limitations panel."""
    return dom.find(html, "section#limitations").html


@pytest.mark.parametrize("case", list(XSS))
def test_markdown_renders_script_injection_inert(case):
    html = str(markdown(XSS[case]))
    assert "<script" not in html and "<img" not in html
    assert "javascript:" not in html or "href" not in html
    assert html.startswith("<p>")


def test_markdown_keeps_its_own_formatting():
    html = str(markdown("**bold** `code` [docs](https://example.org/a)\n\n- item"))
    assert "<strong>bold</strong>" in html and "<code>code</code>" in html
    assert '<a href="https://example.org/a" rel="nofollow noopener noreferrer">docs</a>' in html
    assert "<li>item</li>" in html


def test_the_release_page_renders_a_hostile_note_inert(client, cast):
    release = make_release()
    limitations.limitation_create(
        release=release, author=cast.eli, title="<b>t</b>", body="\n\n".join(XSS.values())
    )
    client.force_login(cast.mona)
    html = panel(client.get(f"/releases/{release.pk}/").content.decode())
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)" in html
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert 'href="javascript' not in html and "[x](javascript:alert(1))" in html
    assert "&lt;b&gt;t&lt;/b&gt;" in html  # the title is escaped text


def test_the_panel_groups_by_severity_open_first_and_collapses_resolved(client, cast):
    release = make_release()
    make_job(release=release)
    minor = limitations.limitation_create(
        release=release, author=cast.eli, title="Minor thing", severity="minor"
    )
    blocker = stage_note(release)
    gone = limitations.limitation_create(
        release=release, author=cast.eli, title="Fixed thing", severity="blocker", status="resolved"
    )
    client.force_login(cast.mona)

    html = panel(client.get(f"/releases/{release.pk}/").content.decode())

    groups = [
        group["data-severity"]
        for group in dom.find_all(html, 'section[class="limitation-group"][data-severity]')
    ]
    assert groups == ["blocker", "minor"]
    assert html.index(f'id="limitation-{blocker.pk}"') < html.index(f'id="limitation-{minor.pk}"')
    resolved = dom.find(html, "details.limitations-resolved").html
    assert f'id="limitation-{gone.pk}"' in resolved and "Resolved (1)" in resolved
    assert f'id="limitation-{blocker.pk}"' not in resolved
    assert "· 2 open" in html
    assert "raised by the Operator coverage stage" in html and "written by eli" in html
    assert "cpu" in html and "all pools" in html
    assert "<strong>no kernel</strong>" in html  # the body's Markdown, rendered


def test_a_manager_sees_no_form_and_cannot_add_or_edit(client, cast):
    release = make_release()
    note = stage_note(release)
    client.force_login(cast.mona)

    html = panel(client.get(f"/releases/{release.pk}/").content.decode())
    assert "Add a known limitation" not in html and "<form" not in html

    add = reverse("adaptation:limitation_add", args=[release.pk])
    assert client.get(add).status_code == 403
    assert (
        client.post(
            add,
            {"limitation-title": "x", "limitation-severity": "minor", "limitation-status": "open"},
        ).status_code
        == 403
    )
    edit = reverse("adaptation:limitation_edit", args=[note.pk])
    assert client.post(edit, {"limitation-status": "resolved"}).status_code == 403
    status = reverse("adaptation:limitation_set_status", args=[note.pk])
    assert client.post(status, {"status": "resolved"}).status_code == 403
    assert KnownLimitation.objects.get().status == "open"
    assert KnownLimitation.objects.count() == 1


def test_an_engineer_adds_a_note_and_edits_it(client, cast):
    release = make_release()
    pool = AcceleratorPool.objects.get(name="cpu")
    client.force_login(cast.eli)
    assert "Add a known limitation" in client.get(f"/releases/{release.pk}/").content.decode()

    response = client.post(
        reverse("adaptation:limitation_add", args=[release.pk]),
        {
            "limitation-title": "Needs firmware 1.3",
            "limitation-severity": "major",
            "limitation-pool": pool.pk,
            "limitation-status": "open",
            "limitation-body": "Older firmware **hangs**.",
        },
    )
    note = KnownLimitation.objects.get()
    assert response.status_code == 302
    assert response.url == f"/releases/{release.pk}/#limitation-{note.pk}"
    assert (note.title, note.severity, note.pool, note.author, note.key) == (
        "Needs firmware 1.3",
        "major",
        pool,
        cast.eli,
        "",
    )

    client.post(
        reverse("adaptation:limitation_edit", args=[note.pk]),
        {
            "limitation-title": "Needs firmware 1.3 or later",
            "limitation-severity": "minor",
            "limitation-pool": "",
            "limitation-status": "resolved",
            "limitation-body": "Fixed in 1.3.",
        },
    )
    note.refresh_from_db()
    assert (note.title, note.severity, note.pool, note.status) == (
        "Needs firmware 1.3 or later",
        "minor",
        None,
        "resolved",
    )
    assert note.resolved_at is not None


def test_a_blank_title_is_refused_with_the_form_again(client, cast):
    release = make_release()
    client.force_login(cast.eli)
    response = client.post(
        reverse("adaptation:limitation_add", args=[release.pk]),
        {"limitation-title": "", "limitation-severity": "major", "limitation-status": "open"},
    )
    assert response.status_code == 400
    assert "This field is required." in response.content.decode()
    assert not KnownLimitation.objects.exists()


def test_an_engineer_resolves_a_stage_note_but_cannot_rewrite_it(client, cast):
    release = make_release()
    note = stage_note(release)
    client.force_login(cast.eli)

    html = panel(client.get(f"/releases/{release.pk}/").content.decode())
    assert f'id="limitation-{note.pk}-resolved"' in html
    assert f'id="limitation-{note.pk}-edit"' not in html  # the stage's text is not people's

    edit = client.get(reverse("adaptation:limitation_edit", args=[note.pk])).content.decode()
    assert 'name="limitation-status"' in edit and 'name="limitation-title"' not in edit

    client.post(
        reverse("adaptation:limitation_edit", args=[note.pk]),
        {"limitation-status": "mitigated", "limitation-title": "rewritten"},
    )
    note.refresh_from_db()
    assert (note.status, note.title) == ("mitigated", "aten::_grouped_mm is missing on pool cpu")

    response = client.post(
        reverse("adaptation:limitation_set_status", args=[note.pk]), {"status": "resolved"}
    )
    assert response.url == f"/releases/{release.pk}/#limitation-{note.pk}"
    note.refresh_from_db()
    assert note.status == "resolved" and note.resolved_at is not None

    with pytest.raises(limitations.LimitationError, match="only its status can change"):
        limitations.limitation_update(limitation=note, by=cast.eli, title="rewritten")


def test_a_bad_status_is_refused_with_a_message(client, cast):
    note = stage_note(make_release())
    client.force_login(cast.eli)
    response = client.post(
        reverse("adaptation:limitation_set_status", args=[note.pk]),
        {"status": "gone"},
        follow=True,
    )
    assert "Unknown status &#x27;gone&#x27;" in response.content.decode()
    note.refresh_from_db()
    assert note.status == "open"


def _board_release(index: int):
    release = make_release(repo_id=f"org/board-{index}")
    make_job(release=release, statuses={"fetch": "succeeded", "analyze": "succeeded"})
    stage_note(release, severity="major")
    stage_note(release, key="analyze:mtp", stage="analyze", severity="minor", pool=None)
    limitations.limitation_create(
        release=release, author=None, title="resolved", severity="blocker", status="resolved"
    )
    return release


def test_the_board_counts_open_limitations_coloured_by_the_most_severe(client, cast):
    release = _board_release(0)
    quiet = make_release(repo_id="org/quiet")
    client.force_login(cast.mona)

    html = client.get("/").content.decode()

    badge = dom.find(html, f"a.limitation-count#limitation-count-{release.pk}")
    assert badge.classes == ["limitation-count", "severity-major"]
    assert badge.text == "2 open limitations"
    assert f'id="limitation-count-{quiet.pk}"' not in html


def test_the_board_query_count_does_not_grow_with_releases(client, cast):
    client.force_login(cast.mona)
    for i in range(2):
        _board_release(i)
    client.get("/")  # warm per-process caches (content types, sessions)
    with CaptureQueriesContext(connection) as few:
        assert client.get("/").status_code == 200
    for i in range(2, 8):
        _board_release(i)
    with CaptureQueriesContext(connection) as many:
        html = client.get("/").content.decode()
    assert html.count('class="limitation-count severity-major"') == 8
    assert len(many) == len(few), [q["sql"] for q in many.captured_queries]


def test_the_admin_lists_and_filters_notes_and_keeps_stage_text_read_only(client, cast):
    note = stage_note(make_release())
    client.force_login(cast.eli)  # engineers are staff with the note permissions
    listing = client.get("/admin/adaptation/knownlimitation/?severity__exact=blocker&q=grouped")
    assert listing.status_code == 200 and note.title in listing.content.decode()
    change = client.get(f"/admin/adaptation/knownlimitation/{note.pk}/change/").content.decode()
    assert (
        'name="status"' in change and 'name="title"' not in change and 'name="body"' not in change
    )
    response = client.post(
        f"/admin/adaptation/knownlimitation/{note.pk}/change/", {"status": "resolved"}
    )
    assert response.status_code == 302
    note.refresh_from_db()
    assert note.status == "resolved" and note.resolved_at is not None
    assert StageRun.objects.count() == 0


def test_the_live_refresh_swaps_the_list_and_leaves_the_add_form_alone(client, cast):
    release = make_release()
    make_job(release=release, statuses={"fetch": "succeeded", "analyze": "running"})
    note = stage_note(release)
    client.force_login(cast.eli)

    html = client.get(f"/releases/{release.pk}/", HTTP_HX_REQUEST="true").content.decode()

    assert '<div id="limitations-list" class="limitations-list" hx-swap-oob="true">' in html
    assert f'id="limitation-{note.pk}"' in html
    assert "Add a known limitation" not in html  # what someone is typing survives the poll

"""The release page's analysis tables fit their grid at common desktop widths and on a
narrow screen: no table runs under its neighbour, no source text is clipped (the folded
tables too, once opened)."""

from __future__ import annotations

import pytest

from tests.browser.test_board import demo_releases

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Each facts table's box, and whether its content is wider than the box.
TABLE_BOXES = """() => [...document.querySelectorAll('#analysis table.facts-table')].map(t => {
  const r = t.getBoundingClientRect();
  const cells = [...t.querySelectorAll('th, td')];
  const overflow = cells.some(c => c.getBoundingClientRect().right > r.right + 0.5);
  return {title: t.caption.textContent.trim(), left: r.left, right: r.right, top: r.top,
          bottom: r.bottom, overflow};
})"""


def overlaps(a: dict, b: dict) -> bool:
    return (
        a["left"] < b["right"] - 0.5
        and b["left"] < a["right"] - 0.5
        and a["top"] < b["bottom"] - 0.5
        and b["top"] < a["bottom"] - 0.5
    )


@pytest.mark.parametrize(
    ("width", "columns"), [(1280, 3), (1300, 3), (1366, 3), (1440, 3), (390, 1)]
)
def test_analysis_tables_fit_their_grid(live_server, browser, width, columns):
    rows = demo_releases()
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(10_000)
    try:
        page = context.new_page()
        page.goto(f"{live_server.url}/accounts/login/")
        page.get_by_label("Username").fill("demo")
        page.get_by_label("Password").fill("day0-demo")
        page.get_by_role("button", name="Log in").click()
        page.goto(f"{live_server.url}/releases/{rows['ready'].pk}/")
        page.locator("#analysis table.facts-table").first.wait_for()
        # The tables past the model, size and shape are folded: open them to measure them all.
        page.locator("#analysis-more summary").click()
        page.locator("#analysis-more table.facts-table").first.wait_for()
        page.screenshot(path=f"/tmp/day0-release-{width}.png", full_page=True)

        boxes = page.evaluate(TABLE_BOXES)
        main_right = page.evaluate("document.querySelector('main').getBoundingClientRect().right")
        assert len(boxes) >= 6
        assert len({round(box["left"]) for box in boxes}) == columns
        for box in boxes:
            assert not box["overflow"], f"{box['title']} at {width} px: a cell sticks out"
            assert box["right"] <= main_right + 0.5, f"{box['title']} at {width} px: past main"
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                assert not overlaps(a, b), f"{a['title']} and {b['title']} overlap at {width} px"
        page_width = page.evaluate("document.documentElement.scrollWidth")
        assert page_width <= width, f"the page scrolls sideways at {width} px"
    finally:
        context.close()

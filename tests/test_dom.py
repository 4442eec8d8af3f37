"""The tests' HTML reader (tests/dom.py): the tree it builds from pages that leave end tags
out, the text a reader sees, and the selectors the tests use."""

from __future__ import annotations

import pytest

from tests import dom

PAGE = """<!doctype html><html><head><title>Board</title>
<script>var tag = "<p>";</script></head><body>
<section id="pool-cpu" class="pool wide"><h2>Pool &amp; queue</h2>
<table class="data-table"><thead><tr><th>Stage<th>Wait</thead><tbody>
<tr data-pool="cpu"><td>fetch<td><strong>3</strong> h</tr>
<tr data-pool="h200"><td>serve</td><td>4<abbr>m</abbr></td></tr></tbody></table>
<ul><li>one<li>two<ul><li>inner</ul><li>three</ul>
<dl class="facts"><dt>Size<dd>3 GB<dt>Kind</dt><dd>dense</dd></dl>
<p>first<p>second<br>line<img src="x.png" alt=""><input value="v"/>
<script type="application/json" id="speed-figure">{"a": "<b>&amp;"}</script>
</section><p id="job-12-verdict" class="verdict">Passed</p></body></html>"""


def test_text_is_what_a_reader_sees() -> None:
    # Scripts and the title are left out; cells and blocks stay apart, inline elements join.
    assert dom.text(PAGE) == (
        "Pool & queue Stage Wait fetch 3 h serve 4m one two inner three "
        "Size 3 GB Kind dense first second line Passed"
    )


def test_end_tags_left_out_close_as_in_a_browser() -> None:
    assert dom.rows(PAGE, "table") == [["Stage", "Wait"], ["fetch", "3 h"], ["serve", "4m"]]
    assert dom.rows(PAGE, "table tbody") == [["fetch", "3 h"], ["serve", "4m"]]
    assert dom.texts(PAGE, "section > ul > li") == ["one", "two inner", "three"]
    assert dom.texts(PAGE, "p") == ["first", "second line", "Passed"]
    assert dom.facts(PAGE, "dl.facts") == {"Size": "3 GB", "Kind": "dense"}
    assert dom.row(PAGE, "serve") == ["4m"]
    assert dom.find(PAGE, "tbody td + td").text_without("strong") == "h"
    assert dom.find(PAGE, "tr[data-pool=h200] td + td").strings == ["4", "m"]
    with pytest.raises(AssertionError, match="no row headed 'deploy'"):
        dom.row(PAGE, "deploy")


def test_selectors() -> None:
    assert dom.attr(PAGE, "tbody tr + tr", "data-pool") == "h200"
    assert dom.text(PAGE, '[id^="job-"][id$="-verdict"]') == "Passed"
    assert dom.text(PAGE, "section.pool.wide > h2") == "Pool & queue"
    assert dom.texts(PAGE, "dt ~ dd") == ["3 GB", "dense"]
    assert dom.texts(PAGE, "th, td")[:3] == ["Stage", "Wait", "fetch"]
    assert dom.find_all(PAGE, "tr[data-pool=gpu]") == []
    with pytest.raises(AssertionError, match="nothing matches"):
        dom.find(PAGE, "section .missing")
    with pytest.raises(ValueError):
        dom.find_all(PAGE, "td:first-child")


def test_a_selection_from_an_element_stays_inside_it() -> None:
    section = dom.by_id(PAGE, "pool-cpu")
    assert dom.texts(section, "p") == ["first", "second line"]
    assert dom.texts(section, "section ul ul li") == ["inner"]


def test_markup_and_raw_text_as_the_page_wrote_them() -> None:
    figure = dom.by_id(PAGE, "speed-figure")
    assert figure.inner_html == '{"a": "<b>&amp;"}'
    assert (
        dom.find(PAGE, "tbody tr").html
        == '<tr data-pool="cpu"><td>fetch<td><strong>3</strong> h</tr>'
    )
    assert dom.find(PAGE, "h2").html == "<h2>Pool &amp; queue</h2>"

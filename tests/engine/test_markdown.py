"""The one set of Markdown escapers: what a stored string can never do to a note."""

from __future__ import annotations

import pytest

from adaptation.safe_markdown import render_markdown
from engine import markdown as md


@pytest.mark.parametrize(
    ("value", "html"),
    [
        ("1.5 GiB over the budget", "<p>1.5 GiB over the budget</p>\n"),
        ("3) the third", "<p>3) the third</p>\n"),
        ("# not a heading", "<p># not a heading</p>\n"),
        ("- not a list", "<p>- not a list</p>\n"),
        ("aten::_weight_int8pack_mm", "<p>aten::_weight_int8pack_mm</p>\n"),
        ("_emphasis_ and *bold*", "<p>_emphasis_ and *bold*</p>\n"),
        ("[link](http://x) ![img](http://y)", "<p>[link](http://x) ![img](http://y)</p>\n"),
        ("<script>alert(1)</script>", "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>\n"),
        ("&lt; ~~struck~~ a | b", "<p>&amp;lt; ~~struck~~ a | b</p>\n"),
        ("two\nlines", "<p>two lines</p>\n"),
    ],
)
def test_text_renders_literally(value, html):
    assert render_markdown(md.text(value)) == html


def test_snake_case_stays_readable_in_the_source():
    assert md.text("snake_case _x_") == "snake_case \\_x\\_"


@pytest.mark.parametrize("value", ["a ` b", "``x``", "`", ""])
def test_code_spans_hold_any_backticks(value):
    rendered = render_markdown(md.code(value))
    assert rendered.startswith("<p><code>")
    assert value.strip("`") in rendered


def test_a_code_block_fence_outlasts_the_backticks_inside():
    block = md.code_block("a\n````\nb", info="text")
    assert block.startswith("`````text\n") and block.endswith("\n`````")


def test_first_line_skips_blank_lines_and_cuts():
    assert md.first_line("\n\n  boom: it broke \nsecond") == "boom: it broke"
    assert md.first_line("x" * 400, limit=10) == "x" * 9 + "…"

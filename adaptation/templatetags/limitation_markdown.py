"""Filters and tags of the known-limitation templates (`templates/limitations/`, the
"markdown" engine, autoescape off; `adaptation.limitation_words` renders them).

The Markdown loader keeps every line that holds text, so a sentence written over several
template lines would come out over several lines. `{% paragraph %}` writes its content as one
line (a paragraph of the note), and `{% joined ", " %}` joins the non-blank lines of its
content with a separator: a list of optional clauses, each on its own line under its `{% if %}`,
comes out with the separator only between the clauses that are there.

Strings from a result go through `md`/`md_code` (`notes_markdown`) or the filters here that
escape them (`sentence`, `md_codes`); `counted` and `signed_count` write numbers as
`engine.formatting` does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import template
from django.template.base import Parser, Token
from django.utils.safestring import SafeString, mark_safe

from engine import findings, formatting, markdown

register = template.Library()


@register.filter
def counted(value: Any, noun: str) -> str:
    """A count with its noun, singular for exactly one (`engine.formatting.counted`):
    `{{ 3|counted:"tensor" }}` → "3 tensors"."""
    return formatting.counted(value, noun)


@register.filter
def signed_count(value: Any) -> str:
    """A whole number with its sign and thousands separators: 16384 → "+16,384", 0 → "+0";
    an em dash for a value that is not a number."""
    number = formatting.finite(value)
    return formatting.MISSING if number is None else f"{round(number):+,}"


@register.filter
def gist(value: Any) -> str:
    """The first clause of a stage's reason, for a title (`engine.findings.gist`): its first
    line up to ": " or "; ", without a closing full stop. Plain text, not escaped."""
    return findings.gist(value)


@register.filter
def first_clause_if_long(value: Any) -> str:
    """A title (stripped) that fits its column (`engine.findings.TITLE_MAX_CHARS`), or its
    first clause (`gist`) when it is longer: `{% filter first_clause_if_long %}…{% endfilter %}`."""
    text = str(value).strip()
    return findings.gist(text) if len(text) > findings.TITLE_MAX_CHARS else text


@register.filter
def sentence(value: Any) -> str:
    """`value` as Markdown text ending with one full stop (`engine.findings.sentence`)."""
    return findings.sentence(value)


@register.filter
def spaced(value: Any) -> str:
    """A stored name with its underscores as spaces: "lm_head" → "lm head"."""
    return str(value).replace("_", " ")


@register.filter
def md_codes(values: Iterable[Any] | None) -> str:
    """Each value as an inline code span (`engine.markdown.code`), joined with ", "; "" for
    none."""
    return ", ".join(markdown.code(value) for value in values or ())


class JoinedNode(template.Node):
    """The non-blank lines of the rendered content, each stripped, joined by `separator`,
    then `end`."""

    def __init__(self, nodelist: template.NodeList, separator: str, end: str) -> None:
        self.nodelist, self.separator, self.end = nodelist, separator, end

    def render(self, context: template.Context) -> SafeString:
        lines = (line.strip() for line in self.nodelist.render(context).splitlines())
        # Autoescape is off in this engine: the parts are the template's own output.
        return mark_safe(self.separator.join(line for line in lines if line) + self.end)


@register.tag
def paragraph(parser: Parser, token: Token) -> JoinedNode:
    """`{% paragraph %}…{% endparagraph %}`: the content's lines on one line, joined with a
    space, ending with a line break (so the line after `{% endparagraph %}` starts a new
    one)."""
    nodelist = parser.parse(("endparagraph",))
    parser.delete_first_token()
    return JoinedNode(nodelist, " ", "\n")


@register.tag
def joined(parser: Parser, token: Token) -> JoinedNode:
    """`{% joined "; " %}…{% endjoined %}`: the content's non-blank lines, stripped, joined
    with the quoted separator, on the line the tag stands in."""
    bits = token.split_contents()
    if len(bits) != 2 or bits[1][:1] not in "\"'" or bits[1][-1:] != bits[1][:1]:
        raise template.TemplateSyntaxError('{% joined %} takes one quoted separator: ", "')
    nodelist = parser.parse(("endjoined",))
    parser.delete_first_token()
    return JoinedNode(nodelist, bits[1][1:-1], "")

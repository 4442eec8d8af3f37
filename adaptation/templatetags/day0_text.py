"""`{% oneline %}` and `{% words %}`: write a template's words a branch per line, render them
on one line.

Django templates have no whitespace control, so a long `{% if %}` chain of labels, or a
sentence built from several conditions, would have to be one unreadable line to come out
without stray line breaks. Inside `{% oneline %}` every line is stripped of its surrounding
whitespace and the lines are joined with nothing between them: put the spaces a sentence needs
inside its lines. `{% words "partial.html" with … %}` is an `{% include %}` rendered so: the
partials that word a value (a split, a node count, a waiting stage) are written readably and
come out as a phrase inside a sentence or a table cell.
"""

from __future__ import annotations

from django import template
from django.template.base import Parser, Token
from django.template.loader_tags import do_include
from django.utils.safestring import SafeString, mark_safe

register = template.Library()


class OnelineNode(template.Node):
    def __init__(self, nodelist: template.NodeList) -> None:
        self.nodelist = nodelist

    def render(self, context: template.Context) -> SafeString:
        # The rendered nodes are already escaped: joining their lines keeps them safe.
        text = self.nodelist.render(context)
        return mark_safe("".join(line.strip() for line in text.splitlines()))


@register.tag
def oneline(parser: Parser, token: Token) -> OnelineNode:
    """`{% oneline %}…{% endoneline %}`: the content's lines, each stripped, joined."""
    nodelist = parser.parse(("endoneline",))
    parser.delete_first_token()
    return OnelineNode(nodelist)


@register.tag
def words(parser: Parser, token: Token) -> OnelineNode:
    """`{% words "template" with name=value %}`: the template included (as `{% include %}`
    takes it) and rendered on one line."""
    include = do_include(parser, token)
    # The parser sets these on the nodes it returns; the include is wrapped, so set them here.
    include.token, include.origin = token, parser.origin
    return OnelineNode(template.NodeList([include]))

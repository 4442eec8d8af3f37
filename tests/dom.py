"""Read rendered pages the way a browser sees them: parsed into elements, found by CSS selector.

Tests ask for what a reader sees: the text of the page or of one element, the texts of every
element a selector matches, an attribute's value, a table's rows as lists of cell texts (or the
row a header names), definition lists as a mapping. The parser is the standard library's
`html.parser`, so tests need no extra package; it builds a tree with the end tags HTML lets a
page leave out (`<li>`, `<p>`, `<td>`, ...) closed as a browser closes them.

Selectors: a tag or `*`, `#id`, `.class`, `[attr]`, `[attr=value]`, `[attr^=value]`,
`[attr$=value]`, `[attr*=value]`, `[attr~=value]`, `[attr|=value]`; joined by descendant
(space), child (`>`), adjacent (`+`) and sibling (`~`) combinators; groups with `,`. Every
function takes a page as text, bytes, a Django response or an `Element` found before.

Errors: a selector that matches nothing where one element is wanted fails the test with an
`AssertionError` naming the selector; a selector this module cannot read raises `ValueError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from html.parser import HTMLParser
from typing import Protocol


def _names(words: str) -> frozenset[str]:
    return frozenset(words.split())


# Elements with no end tag.
VOID = _names("area base br col embed hr img input link meta param source track wbr")
# Elements whose text a reader does not see.
HIDDEN = _names("script style template head title")
# Elements a browser lays out on their own line or cell: their text is kept apart from the
# text around them (`<td>1</td><td>2</td>` reads "1 2"), while inline elements join
# (`3<abbr>h</abbr>` reads "3h").
BLOCK = _names(
    """address article aside blockquote body br caption dd details dialog div dl dt fieldset
    figcaption figure footer form h1 h2 h3 h4 h5 h6 header hr html li main nav ol option p pre
    section summary table tbody td tfoot th thead tr ul legend"""
)
# An open element that a new start tag closes, as the HTML parsing rules say: a new `<li>`
# closes the open `<li>`, a block closes an open `<p>`, and so on.
CLOSED_BY = {
    "li": {"li"},
    "dt": {"dt", "dd"},
    "dd": {"dt", "dd"},
    "tr": {"tr", "td", "th"},
    "td": {"td", "th"},
    "th": {"td", "th"},
    "thead": {"tbody", "tfoot", "tr", "td", "th"},
    "tbody": {"thead", "tbody", "tfoot", "tr", "td", "th"},
    "tfoot": {"thead", "tbody", "tr", "td", "th"},
    "option": {"option"},
}
# Where the search for an element to close stops: a `<li>` does not close a `<li>` of an
# outer list.
SCOPES = frozenset({"ul", "ol", "dl", "table", "select", "div", "section", "article", "details"})
CLOSES_P = _names(
    """address article aside blockquote details div dl fieldset figcaption figure footer form
    h1 h2 h3 h4 h5 h6 header hr main nav ol p pre section table ul"""
)


@dataclass(eq=False)
class Element:
    """One element of a parsed page (the document itself is tag "#document").

    `start`/`end` are character offsets of its markup in the page's source, tags included;
    `inner_start`/`inner_end` those of its content."""

    tag: str
    attrs: dict[str, str]
    parent: Element | None
    source: str
    start: int
    inner_start: int
    inner_end: int = -1
    end: int = -1
    children: list[Element | str] = field(default_factory=list)

    def __repr__(self) -> str:
        names = "".join(f' {k}="{v}"' for k, v in self.attrs.items())
        return f"<{self.tag}{names}>"

    @property
    def html(self) -> str:
        """The element's own markup, as the page wrote it."""
        return self.source[self.start : self.end]

    @property
    def inner_html(self) -> str:
        """The markup between the element's start and end tags, as the page wrote it (the raw
        text of a `<script>` or `<pre>`, entities not decoded)."""
        return self.source[self.inner_start : self.inner_end]

    @property
    def raw_text(self) -> str:
        """Every character of text inside, entities decoded and whitespace kept (the JSON of
        a `<script type="application/json">`, the lines of a `<pre>`)."""
        return "".join(
            child if isinstance(child, str) else child.raw_text for child in self.children
        )

    @property
    def text(self) -> str:
        """The text a reader sees, whitespace collapsed to single spaces: hidden elements
        (`script`, `style`, ...) left out, block elements and cells kept apart by a space."""
        return self.text_without(None)

    @property
    def strings(self) -> list[str]:
        """Each piece of visible text inside, whitespace collapsed, empty ones left out: for
        parts a style sheet lays out apart though their tags are inline (" ".join them)."""
        pieces: list[str] = []
        for child in self.children:
            if isinstance(child, str):
                if words := " ".join(child.split()):
                    pieces.append(words)
            elif child.tag not in HIDDEN:
                pieces.extend(child.strings)
        return pieces

    def text_without(self, selector: str | None) -> str:
        """The text a reader sees (as `text`), leaving out the elements inside that `selector`
        matches (a figure without the note under it)."""
        parts: list[str] = []
        self._visible(parts, set(self.select(selector)) if selector else set())
        return " ".join("".join(parts).split())

    def _visible(self, parts: list[str], left_out: set[Element]) -> None:
        for child in self.children:
            if isinstance(child, str):
                parts.append(child)
            elif child.tag not in HIDDEN and child not in left_out:
                block = child.tag in BLOCK
                if block:
                    parts.append(" ")
                child._visible(parts, left_out)
                if block:
                    parts.append(" ")

    @property
    def next_element(self) -> Element | None:
        """The element right after this one among its parent's children, or None."""
        if self.parent is None:
            return None
        siblings = self.parent.elements
        index = siblings.index(self) + 1
        return siblings[index] if index < len(siblings) else None

    @property
    def classes(self) -> list[str]:
        """The element's class names, in order."""
        return self.attrs.get("class", "").split()

    def get(self, name: str, default: str | None = None) -> str | None:
        """The value of attribute `name` ("" for one written bare), or `default`."""
        return self.attrs.get(name, default)

    def __getitem__(self, name: str) -> str:
        """The value of attribute `name`; `KeyError` when the element has none."""
        return self.attrs[name]

    @property
    def elements(self) -> list[Element]:
        """The element's child elements, text left out."""
        return [child for child in self.children if isinstance(child, Element)]

    def iter(self) -> Iterator[Element]:
        """Every element inside, in document order (the element itself not included)."""
        for child in self.elements:
            yield child
            yield from child.iter()

    def select(self, selector: str) -> list[Element]:
        """Every element inside that `selector` matches, in document order."""
        groups = _compile(selector)
        return [el for el in self.iter() if any(_matches(el, chain, self) for chain in groups)]

    def select_one(self, selector: str) -> Element:
        """The first element inside that `selector` matches; `AssertionError` when none does."""
        found = self.select(selector)
        assert found, f"nothing matches {selector!r}"
        return found[0]


class _HasContent(Protocol):
    content: bytes


Page = str | bytes | Element | _HasContent


class _TreeBuilder(HTMLParser):
    def __init__(self, source: str) -> None:
        super().__init__(convert_charrefs=True)
        self.source = source
        # Offsets of the line starts, to turn the parser's (line, column) into an offset.
        self.lines = [0] + [m.end() for m in re.finditer("\n", source)]
        self.root = Element("#document", {}, None, source, 0, 0)
        self.stack = [self.root]

    def _offset(self) -> int:
        line, column = self.getpos()
        return self.lines[line - 1] + column

    def _close(self, element: Element, at: int, end: int) -> None:
        element.inner_end = at
        element.end = end

    def _close_to(self, index: int, at: int) -> None:
        """Close the open elements from the top down to and including stack[index], at offset
        `at` (an end tag left out ends where the next tag starts)."""
        while len(self.stack) > index:
            self._close(self.stack.pop(), at, at)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        at = self._offset()
        text = self.get_starttag_text() or ""
        if tag in CLOSED_BY:
            # Close the outermost open element the new one ends (a `<tr>` ends the open `<td>`
            # and its `<tr>`), looking no further out than the enclosing list or table.
            outermost = None
            for index in range(len(self.stack) - 1, 0, -1):
                open_tag = self.stack[index].tag
                if open_tag in CLOSED_BY[tag]:
                    outermost = index
                elif open_tag in SCOPES:
                    break
            if outermost is not None:
                self._close_to(outermost, at)
        if tag in CLOSES_P and self.stack[-1].tag == "p":
            self._close_to(len(self.stack) - 1, at)
        parent = self.stack[-1]
        element = Element(
            tag, {k: v or "" for k, v in attrs}, parent, self.source, at, at + len(text)
        )
        parent.children.append(element)
        if tag in VOID or text.endswith("/>"):
            self._close(element, element.inner_start, element.inner_start)
        else:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # `<x/>`: handle_starttag sees the "/>" and leaves the element closed.
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        at = self._offset()
        for index in range(len(self.stack) - 1, 0, -1):
            if self.stack[index].tag == tag:
                end = self.source.find(">", at) + 1 or len(self.source)
                while len(self.stack) > index + 1:
                    self._close(self.stack.pop(), at, at)
                self._close(self.stack.pop(), at, end)
                return
        # A stray end tag (no such element open) is ignored, as browsers do.

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)

    def finish(self) -> Element:
        self.close()
        self._close_to(1, len(self.source))
        self._close(self.root, len(self.source), len(self.source))
        return self.root


@lru_cache(maxsize=16)
def _parse_text(source: str) -> Element:
    builder = _TreeBuilder(source)
    builder.feed(source)
    return builder.finish()


def parse(page: Page) -> Element:
    """The page as a tree of elements: `page` is HTML text, UTF-8 bytes, a response (its
    `content`) or an element already parsed (returned as it is)."""
    if isinstance(page, Element):
        return page
    if isinstance(page, bytes):
        page = page.decode()
    elif not isinstance(page, str):
        page = page.content.decode()
    return _parse_text(page)


def find(page: Page, selector: str) -> Element:
    """The first element of `page` that `selector` matches; `AssertionError` when none does."""
    return parse(page).select_one(selector)


def find_all(page: Page, selector: str) -> list[Element]:
    """Every element of `page` that `selector` matches, in document order (maybe none)."""
    return parse(page).select(selector)


def by_id(page: Page, element_id: str) -> Element:
    """The element of `page` whose id is `element_id`; `AssertionError` when there is none.
    Takes any id, even one a selector would need escaped."""
    for element in parse(page).iter():
        if element.attrs.get("id") == element_id:
            return element
    raise AssertionError(f"no element with id {element_id!r}")


def text(page: Page, selector: str | None = None) -> str:
    """The visible text of `page` (`selector` None) or of the first element `selector`
    matches, whitespace collapsed (see `Element.text`)."""
    root = parse(page)
    return (root if selector is None else root.select_one(selector)).text


def texts(page: Page, selector: str) -> list[str]:
    """The visible text of each element `selector` matches, in document order."""
    return [element.text for element in parse(page).select(selector)]


def attr(page: Page, selector: str, name: str) -> str:
    """Attribute `name` of the first element `selector` matches; `AssertionError` when no
    element matches or the element has no such attribute."""
    element = find(page, selector)
    assert name in element.attrs, f"{element!r} ({selector!r}) has no {name!r}"
    return element.attrs[name]


def rows(page: Page, selector: str = "table") -> list[list[str]]:
    """The rows (`tr`) inside the first element `selector` matches, each as the texts of its
    cells (`th` and `td`, in order). Select a `tbody` to leave the header row out."""
    return [
        [cell.text for cell in row.elements if cell.tag in ("td", "th")]
        for row in find(page, selector).select("tr")
    ]


def row(page: Page, header: str) -> list[str]:
    """The texts of the cells after the first one in the first row (`tr`) of `page` whose
    first cell (`th` or `td`) reads `header`; `AssertionError` when no row does."""
    for found in parse(page).select("tr"):
        cells = [cell for cell in found.elements if cell.tag in ("td", "th")]
        if cells and cells[0].text == header:
            return [cell.text for cell in cells[1:]]
    raise AssertionError(f"no row headed {header!r}")


def facts(page: Page, selector: str | None = None) -> dict[str, str]:
    """Each term (`dt`) of the definition lists in `page` (or in the first element `selector`
    matches) mapped to the text of the `dd` right after it; a term that repeats keeps its
    first."""
    root = parse(page) if selector is None else find(page, selector)
    found: dict[str, str] = {}
    for term in root.select("dt"):
        definition = term.next_element
        if definition is not None and definition.tag == "dd":
            found.setdefault(term.text, definition.text)
    return found


# --- Selectors --------------------------------------------------------------------------------

_ATTRIBUTE = re.compile(
    r"""\[\s*([\w:-]+)\s*(?:([~^$*|]?=)\s*(?:"([^"]*)"|'([^']*)'|([^\]\s]+))\s*)?\]"""
)
_PART = re.compile(r"#([\w-]+)|\.([\w-]+)")
_COMPOUND = re.compile(r"""(\*|[a-zA-Z][\w-]*)?((?:#[\w-]+|\.[\w-]+|\[[^\]]*\])*)""")


@dataclass(frozen=True)
class _Compound:
    tag: str | None
    ids: tuple[str, ...]
    classes: tuple[str, ...]
    attributes: tuple[tuple[str, str | None, str], ...]

    def matches(self, element: Element) -> bool:
        attrs = element.attrs
        if self.tag is not None and element.tag != self.tag:
            return False
        if any(attrs.get("id") != wanted for wanted in self.ids):
            return False
        classes = element.classes
        if any(wanted not in classes for wanted in self.classes):
            return False
        for name, operator, value in self.attributes:
            if name not in attrs:
                return False
            have = attrs[name]
            if operator is None:
                continue
            if not {
                "=": have == value,
                "^=": bool(value) and have.startswith(value),
                "$=": bool(value) and have.endswith(value),
                "*=": bool(value) and value in have,
                "~=": value in have.split(),
                "|=": have == value or have.startswith(value + "-"),
            }[operator]:
                return False
        return True


# A chain of compounds, right to left: [(compound, combinator to the one before), ...].
_Chain = tuple[tuple[_Compound, str], ...]


def _compound(text: str, selector: str) -> _Compound:
    found = _COMPOUND.fullmatch(text)
    if not text or not found:
        raise ValueError(f"cannot read selector {selector!r} at {text!r}")
    tag, rest = found.group(1), found.group(2)
    ids: list[str] = []
    classes: list[str] = []
    attributes: list[tuple[str, str | None, str]] = []
    for name, operator, double, single, bare in _ATTRIBUTE.findall(rest):
        attributes.append((name, operator or None, double or single or bare))
    for element_id, class_name in _PART.findall(_ATTRIBUTE.sub("", rest)):
        if element_id:
            ids.append(element_id)
        else:
            classes.append(class_name)
    name = None if tag in (None, "*") else tag.lower()
    return _Compound(name, tuple(ids), tuple(classes), tuple(attributes))


_TOKENS = re.compile(r"""\s*([>+~])\s*|\s+|((?:[^\s>+~\[]|\[[^\]]*\])+)""")


@lru_cache(maxsize=256)
def _compile(selector: str) -> tuple[_Chain, ...]:
    groups: list[_Chain] = []
    for group in selector.split(","):
        compounds: list[tuple[_Compound, str]] = []
        combinator = " "
        position = 0
        group = group.strip()
        while position < len(group):
            token = _TOKENS.match(group, position)
            if not token or token.end() == position:
                raise ValueError(f"cannot read selector {selector!r}")
            position = token.end()
            if token.group(2):
                compounds.append((_compound(token.group(2), selector), combinator))
                combinator = " "
            else:
                combinator = token.group(1) or " "
        if not compounds:
            raise ValueError(f"empty selector in {selector!r}")
        groups.append(tuple(reversed(compounds)))
    return tuple(groups)


def _previous_siblings(element: Element) -> list[Element]:
    if element.parent is None:
        return []
    siblings = element.parent.elements
    return list(reversed(siblings[: siblings.index(element)]))


def _matches(element: Element, chain: _Chain, scope: Element) -> bool:
    """Whether `element` matches the chain. Ancestors are looked for up to `scope` itself:
    a selection from an element narrowed to one section reads that section alone (the DOM's
    `querySelectorAll` would also match ancestors outside it)."""
    compound, combinator = chain[0]
    if not compound.matches(element):
        return False
    if len(chain) == 1:
        return True
    rest = chain[1:]
    if combinator == ">":
        parent = element.parent
        return parent is not None and _matches(parent, rest, scope)
    if combinator == " ":
        parent = element.parent
        while parent is not None:
            if _matches(parent, rest, scope):
                return True
            if parent is scope:
                return False
            parent = parent.parent
        return False
    siblings = _previous_siblings(element)
    if combinator == "+":
        return bool(siblings) and _matches(siblings[0], rest, scope)
    return any(_matches(sibling, rest, scope) for sibling in siblings)

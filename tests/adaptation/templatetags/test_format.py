"""The formatting filters write exact strings with their units."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest

from adaptation.templatetags import day0_format

# The filters as the pages call them, by their registered names.
fmt = SimpleNamespace(**day0_format.register.filters)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (671026404352, "671.0 B params"),
        (3606752256, "3.61 B params"),
        (20914757184, "20.9 B params"),
        (124439808, "124.4 M params"),
        (0, "0 params"),
        (None, "—"),
        ("not a number", "—"),
        (True, "—"),
    ],
)
def test_params(value, expected):
    assert fmt.params(value) == expected


def test_params_short_has_no_word():
    assert fmt.params_short(3606752256) == "3.61 B"
    assert fmt.params_short(671026404352) == "671.0 B"
    assert fmt.params_short(None) == "—"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1342497964032, "1,250.3 GiB"),
        (688586727753, "641.3 GiB"),
        (2**30, "1.0 GiB"),
        (70272 * 1024, "0.067 GiB"),
        (0, "0.0 GiB"),
        (None, "—"),
    ],
)
def test_gib_is_binary(value, expected):
    assert fmt.gib(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(70272, "70,272 bytes/token"), (131072.0, "131,072 bytes/token"), (None, "—")],
)
def test_bytes_per_token(value, expected):
    assert fmt.bytes_per_token(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (timedelta(hours=1, minutes=2, seconds=40), "1 h 02 m"),
        (timedelta(seconds=3.42), "3.4 s"),
        (3.0, "3.0 s"),
        (timedelta(minutes=5, seconds=7), "5 m 07 s"),
        (timedelta(hours=2, minutes=14), "2 h 14 m"),
        (timedelta(days=2, hours=3, minutes=59), "2 d 03 h"),
        (timedelta(seconds=-90), "-1 m 30 s"),
        (None, "—"),
    ],
)
def test_duration(value, expected):
    assert fmt.duration(value) == expected


def test_count_and_dash_and_revision():
    assert fmt.count(129280) == "129,280"
    assert fmt.count(None) == "—"
    assert fmt.dash("") == "—"
    assert fmt.dash("worker-1") == "worker-1"
    assert fmt.short_revision("0123456789abcdef0123") == "0123456789ab"
    assert fmt.short_revision("") == "—"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (7168, "7,168"),
        (True, "yes"),
        (None, "—"),
        (["full_attention"], '["full_attention"]'),
        ({"type": "yarn", "factor": 40}, '{"type": "yarn", "factor": 40}'),
        ("silu", "silu"),
    ],
)
def test_plain_config_values(value, shown):
    assert fmt.plain(value) == shown


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (7.450580596923828e-07, "7.45e-07"),
        (0.9030786752700806, "9.03e-01"),
        (0.0001277678942680359, "1.28e-04"),
        (0, "0.00e+00"),
        (None, "—"),
        (True, "—"),
    ],
)
def test_scientific_errors(value, shown):
    assert fmt.scientific(value) == shown


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (5775.99, "5,776 tokens/s"),
        (42.26, "42.3 tokens/s"),
        (8.456, "8.46 tokens/s"),
        (None, "—"),
        ("fast", "—"),
    ],
)
def test_tokens_per_s_writes_the_rate_with_its_unit(value, shown):
    assert fmt.tokens_per_s(value) == shown


def test_signed_percent_keeps_the_sign():
    assert fmt.signed_percent(0.0123) == "+1.2%"
    assert fmt.signed_percent(-0.05) == "-5.0%"
    assert fmt.signed_percent(0.2, 0) == "+20%"
    assert fmt.signed_percent(None) == "—"


def test_oneline_joins_the_stripped_lines_and_keeps_escaping():
    from django.template import Context, Template

    template = Template(
        "{% load day0_text %}<b>{% oneline %}\n"
        "  {% if n == 1 %}one thing\n"
        "  {% else %}{{ n }} things, {{ name }}\n"
        "  {% endif %}\n"
        "{% endoneline %}</b>"
    )
    assert template.render(Context({"n": 1})) == "<b>one thing</b>"
    assert template.render(Context({"n": 2, "name": "<x>"})) == "<b>2 things, &lt;x&gt;</b>"


def test_words_includes_a_partial_on_one_line():
    from django.template import Context, Template

    template = Template(
        '{% load day0_text %}<td>{% words "adaptation/partials/nodes.html" with nodes=2 '
        "per_node=8 %}</td>"
    )
    assert template.render(Context()) == "<td>2 nodes of 8</td>"

"""The release page's filters for what it writes many times (`templatetags.day0_release`):
they write what the partial and the writers they stand for write."""

from __future__ import annotations

import pytest
from django.template import Context, Template

from adaptation.presenters.analysis_figures import Figure
from adaptation.templatetags.day0_release import analysis_label, perf_value


def through_partial(figure: Figure) -> str:
    """The label as `{% words %}` renders the partial itself."""
    template = Template('{% load day0_text %}{% words "adaptation/partials/analysis_label.html" %}')
    return template.render(Context({"figure": figure}))


@pytest.mark.parametrize(
    "key",
    [
        "num_layers",  # a label of its own
        "attention.kv_lora_rank",  # a labelled grouped key
        "rope.original_max_position_embeddings",  # a rope key without one: "RoPE ..."
        "moe.routed_scaling_factor",  # a key without a label: its title
    ],
)
def test_the_label_is_the_partials(key):
    figure = Figure(key=key, value=1, source="config")
    assert analysis_label(figure) == through_partial(figure)


def test_named_labels_and_titles():
    assert analysis_label(Figure(key="num_layers", value=1, source="")) == "Layers"
    assert analysis_label(Figure(key="rope.low_freq_factor", value=1, source="")) == (
        "RoPE low freq factor"
    )


@pytest.mark.parametrize(
    ("value", "unit", "written"),
    [
        (0.01643, "ms", "16.4 ms"),  # seconds, written in ms
        (17.7, "ms", "17.7 s"),  # a long time in s, never thousands of ms
        (93.42, "tokens/s", "93.4 tokens/s"),
        (1234.4, "tokens/s", "1,234 tokens/s"),
        (395403264, "MiB", "377.09 MiB"),
        (0.1109, "%", "11.1 %"),
        (1397000.0, "bytes", "1.397e+06 bytes"),
        (0.98765, "", "0.9877"),
        (None, "ms", "—"),
        (float("nan"), "tokens/s", "—"),
    ],
)
def test_a_performance_figure_in_its_columns_unit(value, unit, written):
    assert perf_value(value, unit) == written

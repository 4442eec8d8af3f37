"""The release page's analysis when the checkpoint's safetensors headers were read: its counts
with their source, the config's beside them with the difference, and the checkpoint section
(tensors, groups, dtypes, the check against the config)."""

from __future__ import annotations

import pytest

from engine.architecture import analyze_config
from engine.architecture.checkpoint_analysis import with_checkpoint
from engine.stages.fetch.run import summarize_weights
from tests.adaptation.views.test_release_page import (
    analysed_release,
    page_url,
    row_source,
    row_value,
)
from tests.checkpoint_cases import Case, llama

pytestmark = pytest.mark.django_db


def counted(case: Case) -> dict:
    tensors = {n: {"dtype": d, "shape": list(s)} for n, (d, s) in case.table.items()}
    weights = summarize_weights(None, {"total_size": 0, "shard_count": 2, "tensors": tensors})
    analysis = analyze_config(case.config, weights=weights).to_dict()
    return with_checkpoint(analysis, case.config, weights)


def test_the_checkpoints_count_stands_beside_the_configs(logged_in_client):
    case = llama()
    release = analysed_release(counted(case), config=case.config)

    html = logged_in_client.get(page_url(release)).content.decode()

    assert row_value(html, "Total params") == f"{case.params:,} params"
    assert row_source(html, "Total params") == "counted from the safetensors headers"
    assert row_source(html, "Weight bytes") == "counted from the safetensors headers"
    assert row_value(html, "Total params from the config") == (
        f"{case.params:,} params (the same as the checkpoint's)"
    )
    assert row_source(html, "Total params from the config") == "computed from config"
    assert row_value(html, "Tensors") == str(len(case.table))
    assert row_value(html, "Decoder layers") == "3"
    assert row_value(html, "Params by stored dtype") == f"BF16: {case.params:,}"
    assert row_value(html, "Against the config") == (
        f"{len(case.table)} of the {len(case.table)} tensors transformers' LlamaForCausalLM "
        "builds from the config; no problem"
    )
    assert "Checkpoint (safetensors headers)" in html
    assert "or counted from its checkpoint's safetensors headers" in html


def test_a_config_count_that_differs_shows_by_how_much(logged_in_client):
    case = llama()
    config = dict(case.config, model_type="acme_nova", architectures=["NovaForCausalLM"])
    config["tie_word_embeddings"] = True  # the config says tied; the checkpoint has a head
    lm_head = case.config["vocab_size"] * case.config["hidden_size"]
    result = counted(Case("nova", config, case.table, case.params))
    release = analysed_release(result, config=config)

    html = logged_in_client.get(page_url(release)).content.decode()

    relative = lm_head / (case.params - lm_head)
    assert row_value(html, "Total params from the config") == (
        f"{case.params - lm_head:,} params (the checkpoint's is +{lm_head:,}, {relative:+.2%})"
    )
    assert row_value(html, "Against the config").startswith("layer counts only (transformers")

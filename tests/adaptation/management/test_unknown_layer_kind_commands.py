"""`manage.py analyze` and `plan` on MiniMax-M3's published config, whose `layer_types` names
a kind day0 does not know ("minimax_m3_sparse"): the analysis says what it assumed, text and
JSON, the plan is made from it, and a config without the keys to count the kind is refused
with one line naming them."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.conftest import DATA_DIR

MINIMAX_M3 = str(DATA_DIR / "unknown_layer_kinds" / "MiniMaxAI__MiniMax-M3.json")
ASSUMED = (
    "estimated: layer kind 'minimax_m3_sparse' is not known to day0; counted as full "
    "attention on 57 layers (3-59)"
)


def test_analyze_json_holds_the_assumption_and_the_guess():
    out = io.StringIO()
    call_command("analyze", MINIMAX_M3, "--format", "json", stdout=out)
    result = json.loads(out.getvalue())
    assert any(a.startswith(ASSUMED) for a in result["assumptions"])
    assert [g["name"] for g in result["estimated_layer_kinds"]] == ["minimax_m3_sparse"]
    # K/V on 60 layers (4 heads x 128 at bf16) and the guessed indexer's key on 57.
    assert result["kv_cache_bytes_per_token"] == 60 * 2048 + 57 * 256


def test_analyze_text_prints_the_assumption():
    out = io.StringIO()
    call_command("analyze", MINIMAX_M3, stdout=out)
    text = out.getvalue()
    assert f"  assumed: {ASSUMED}" in text
    assert "137,472 bytes/token at bf16" in text


def test_analyze_refuses_an_unknown_kind_without_the_keys_naming_them(tmp_path):
    config = {
        "model_type": "zephyrine",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 100,
        "layer_types": ["full_attention", "hyena_mixer"],
    }
    path = tmp_path / "zephyrine.json"
    path.write_text(json.dumps(config))
    with pytest.raises(CommandError) as err:
        call_command("analyze", str(path))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("layer_types[1] = 'hyena_mixer' is not a known layer kind")
    assert "num_key_value_heads" in message and "intermediate_size" in message


@pytest.mark.django_db
def test_plan_on_the_analysis_prints_a_plan():
    out = io.StringIO()
    call_command("plan", MINIMAX_M3, "--accelerator", "h200", "--devices", "8", stdout=out)
    text = out.getvalue()
    assert text.startswith("MiniMaxAI__MiniMax-M3 on 8 x h200")
    assert "decode at batch 1:" in text and "vllm serve MiniMaxAI__MiniMax-M3" in text

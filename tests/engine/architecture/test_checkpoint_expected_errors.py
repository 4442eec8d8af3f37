"""A config transformers refuses fails the expected-tensor build with a short reason: the
library's message (which may quote the config's kilobytes) is cut to 200 characters."""

from __future__ import annotations

import pytest

from engine.architecture.checkpoint_expected import ExpectedBuildError, expected_tensors
from engine.architecture.meta_bounds import short_message


def test_a_refused_config_s_reason_stays_short():
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_act": "x" * 5000,  # transformers quotes the unknown activation
        "num_hidden_layers": 1,
        "hidden_size": 8,
        "intermediate_size": 8,
        "num_attention_heads": 1,
        "vocab_size": 8,
    }

    with pytest.raises(ExpectedBuildError) as raised:
        expected_tensors(config)
    reason = str(raised.value)
    assert reason.startswith("LlamaForCausalLM: 'xxx")
    # one short message per class tried (the class, then three auto classes)
    assert len(reason) <= 4 * (200 + 40)


def test_short_message_is_one_line_cut_with_an_ellipsis():
    assert short_message(ValueError("a\n  b")) == "a b"
    cut = short_message(ValueError("y" * 500))
    assert len(cut) == 200 and cut.endswith("...")

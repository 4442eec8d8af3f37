"""Family defaults come from transformers' config classes: each figure read equals the class's.

The expected values are read here from a default instance of the class (`AutoConfig.for_model`),
not from the dataclass fields the engine reads, so a wrong read (a derived value, a missed
`attribute_map` spelling, the wrong class of a multimodal wrapper) fails.
"""

from __future__ import annotations

import subprocess
import sys
from types import MappingProxyType

import pytest

from engine.architecture import analyze_config, families
from engine.architecture.families import FAMILIES
from engine.architecture.family_spec import FamilySpec
from engine.architecture.transformers_defaults import class_defaults

from .test_architecture_vs_transformers import _MLA, _SMALL, meta_param_count

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _default_config(model_type: str):
    return transformers.AutoConfig.for_model(model_type)


@pytest.mark.parametrize(
    ("family", "model_type", "key"),
    [
        ("llama", "llama", "intermediate_size"),
        ("llama", "llama", "max_position_embeddings"),
        ("mistral", "mistral", "num_key_value_heads"),
        ("mixtral", "mixtral", "num_local_experts"),
        ("qwen3", "qwen3", "head_dim"),
        ("qwen3_moe", "qwen3_moe", "moe_intermediate_size"),
        ("deepseek_v3", "deepseek_v3", "n_routed_experts"),
        ("deepseek_v3", "deepseek_v3", "routed_scaling_factor"),
        ("gpt_oss", "gpt_oss", "sliding_window"),
        ("ernie4_5_moe", "ernie4_5_moe", "moe_k"),
        # attribute_map spellings: transformers reads both names from one attribute.
        ("kimi_linear", "kimi_linear", "num_local_experts"),
        ("kimi_linear", "kimi_linear", "max_position_embeddings"),
        ("ernie4_5_moe", "ernie4_5_moe", "num_experts"),
        # A multimodal wrapper's family reads its text_config class.
        ("gemma3", "gemma3_text", "head_dim"),
        ("gemma3", "gemma3_text", "vocab_size"),
        ("llama4", "llama4_text", "num_local_experts"),
    ],
)
def test_family_default_equals_transformers_class(family, model_type, key):
    expected = getattr(_default_config(model_type), key)
    assert expected is not None
    assert FAMILIES[family].defaults[key] == expected


@pytest.mark.parametrize(
    ("family", "model_type"),
    [("llama", "llama"), ("mixtral", "mixtral"), ("smollm3", "smollm3"), ("glm4", "glm4")],
)
def test_rope_defaults_equal_the_default_instance(family, model_type):
    """RoPE base and partial rotary factor live in `rope_parameters`, set in __post_init__."""
    params = _default_config(model_type).rope_parameters
    defaults = FAMILIES[family].defaults
    assert defaults["rope_theta"] == params["rope_theta"]
    assert defaults.get("partial_rotary_factor") == params.get("partial_rotary_factor")


def test_gemma3_theta_per_layer_type_equals_transformers():
    """Gemma 3 keeps one RoPE dict per layer type: full-attention theta, sliding theta."""
    params = _default_config("gemma3_text").rope_parameters
    defaults = FAMILIES["gemma3"].defaults
    assert defaults["rope_theta"] == params["full_attention"]["rope_theta"] == 1_000_000.0
    assert defaults["rope_local_base_freq"] == params["sliding_attention"]["rope_theta"]


@pytest.mark.parametrize(
    ("family", "key"),
    [
        # Derived in __post_init__ from other values (heads, hidden size): no fixed default.
        ("llama", "head_dim"),
        ("llama", "num_key_value_heads"),
        ("cohere", "num_key_value_heads"),
        ("qwen3_vl_moe_text", "head_dim"),
    ],
)
def test_derived_values_are_not_defaults(family, key):
    assert FAMILIES[family].defaults.get(key) is None


@pytest.mark.parametrize("model_type", ["cohere", "olmoe", "arcee", "apertus"])
def test_absent_kv_heads_follow_the_config_heads_as_transformers(model_type):
    """num_key_value_heads absent: transformers uses the config's own head count (the class
    derives it), not the default model's."""
    config = {k: v for k, v in _SMALL.items() if k != "num_key_value_heads"}
    config["model_type"] = model_type
    analysis = analyze_config(config)
    assert analysis.num_kv_heads == _SMALL["num_attention_heads"]
    assert analysis.total_params == meta_param_count(config)


def test_attribute_map_spelling_wins_over_the_class_default():
    """DeepSeek-V3 spelled with `num_local_experts` (its attribute_map name for
    n_routed_experts): the config's 8 experts, not the class's 256."""
    config = {
        **_SMALL,
        **_MLA,
        "model_type": "deepseek_v3",
        "q_lora_rank": 32,
        "num_local_experts": 8,
        "moe_intermediate_size": 24,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
    }
    analysis = analyze_config(config)
    assert analysis.moe["num_experts"] == 8
    assert analysis.total_params == meta_param_count(config)


def test_ernie_moe_end_index_default_is_the_last_layer():
    """Ernie4_5_MoeConfig's moe_layer_end_index default -1 means the last layer (the default
    model's 27 would leave layers 28-39 dense)."""
    config = {
        **_SMALL,
        "num_hidden_layers": 40,
        "model_type": "ernie4_5_moe",
        "moe_num_experts": 8,
        "moe_k": 2,
        "moe_intermediate_size": 24,
        "moe_layer_start_index": 1,
    }
    assert FAMILIES["ernie4_5_moe"].defaults["moe_layer_end_index"] == -1
    analysis = analyze_config(config)
    assert analysis.moe["moe_layers"] == 39
    assert analysis.total_params == meta_param_count(config)


@pytest.mark.parametrize(("model_type", "rope_type"), [("gpt_oss", "yarn"), ("apertus", "llama3")])
def test_default_rope_scaling_is_the_class_default(model_type, rope_type):
    """A config without rope_scaling gets the scaling its class sets in __post_init__."""
    config = {**_SMALL, "model_type": model_type, "head_dim": 16}
    expected = _default_config(model_type).rope_parameters
    rope = analyze_config(config).rope
    assert rope["type"] == expected["rope_type"] == rope_type
    assert rope["factor"] == expected["factor"]
    assert rope["original_max_position_embeddings"] == expected["original_max_position_embeddings"]


# --- overrides: defaults a family's code applies that its config class does not declare -------


@pytest.mark.parametrize(
    ("family", "model_type"),
    [
        ("gpt_oss", "gpt_oss"),
        ("gemma2", "gemma2"),
        ("gemma3", "gemma3_text"),
        ("olmo3", "olmo3"),
        ("cohere2", "cohere2"),
    ],
)
def test_sliding_window_pattern_override_matches_the_class_layer_types(family, model_type):
    pattern = FAMILIES[family].overrides["sliding_window_pattern"]
    layer_types = _default_config(model_type).layer_types
    expected = [
        "sliding_attention" if (i + 1) % pattern else "full_attention"
        for i in range(len(layer_types))
    ]
    assert layer_types == expected


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"])
def test_full_attention_interval_override_matches_the_class_layer_types(family):
    interval = FAMILIES[family].overrides["full_attention_interval"]
    layer_types = _default_config(family).layer_types
    expected = [
        "linear_attention" if (i + 1) % interval else "full_attention"
        for i in range(len(layer_types))
    ]
    assert layer_types == expected


@pytest.mark.parametrize("family", ["glm4_moe_lite", "kimi_linear"])
def test_first_k_dense_replace_override_matches_the_class_mlp_layer_types(family):
    first = FAMILIES[family].overrides["first_k_dense_replace"]
    mlp_types = _default_config(family).mlp_layer_types
    assert mlp_types == ["dense"] * first + ["sparse"] * (len(mlp_types) - first)


@pytest.mark.parametrize(
    ("family", "wrapper"), [("qwen3_vl_text", "qwen3_vl"), ("qwen3_vl_moe_text", "qwen3_vl_moe")]
)
def test_tie_override_is_the_wrapper_class_default(family, wrapper):
    assert FAMILIES[family].defaults["tie_word_embeddings"] is False
    assert _default_config(wrapper).tie_word_embeddings is False


def test_qwen3_moe_window_covers_every_layer_as_transformers():
    """Qwen3MoeConfig has no max_window_layers: with use_sliding_window every layer slides."""
    config = {**_SMALL, "model_type": "qwen3_moe", "use_sliding_window": True, "sliding_window": 8}
    config |= {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24}
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    cfg = transformers.AutoConfig.for_model("qwen3_moe", **kwargs)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    windows = [layer.self_attn.sliding_window for layer in model.model.layers]
    assert windows == [8] * _SMALL["num_hidden_layers"]
    attention = analyze_config(config).attention
    assert attention["sliding_layers"] == _SMALL["num_hidden_layers"]


@pytest.mark.parametrize("max_window_layers", [None, 2])
def test_dots1_sliding_layers_equal_transformers_layer_types(max_window_layers):
    """Dots1Config slides on layers >= max_window_layers (class default 62) when
    sliding_window is set (class default 4096)."""
    config = {**_SMALL, "model_type": "dots1", "n_routed_experts": 4, "num_experts_per_tok": 2}
    if max_window_layers is not None:
        config |= {"max_window_layers": max_window_layers, "sliding_window": 64}
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    cfg = transformers.AutoConfig.for_model("dots1", **kwargs)
    assert analyze_config(config).attention["layer_types"] == list(cfg.layer_types)


# --- a family the installed transformers does not know ----------------------------------------


def test_family_unknown_to_transformers_analyses_from_the_config(monkeypatch):
    """A family newer than the installed transformers keeps its spec; absent keys get no
    default, and the notes say so."""
    future = FamilySpec(name="day0_future_moe", qk_norm="head")
    monkeypatch.setattr(families, "FAMILIES", MappingProxyType({**FAMILIES, future.name: future}))
    assert not class_defaults(future.name).known
    config = {**_SMALL, "model_type": future.name, "num_experts": 4, "num_experts_per_tok": 2}
    analysis = analyze_config(config)
    assert analysis.family == future.name and analysis.family_known
    assert analysis.num_kv_heads == 2 and analysis.moe["num_experts"] == 4
    version = transformers.__version__
    assert any(
        f"transformers {version} has no config class for 'day0_future_moe'" in n
        for n in analysis.notes
    )
    # Required keys it leaves out are not filled from another family's class.
    with pytest.raises(Exception, match="missing required keys: vocab_size"):
        analyze_config({k: v for k, v in config.items() if k != "vocab_size"})


def test_importing_the_analysis_does_not_import_transformers():
    """The web process imports engine.architecture at startup; transformers waits for the
    first default that is needed."""
    code = "import sys, engine.architecture; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

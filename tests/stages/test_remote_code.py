"""Remote-code policy and the sandboxed child process (no Django).

The release here is a tiny custom architecture served from a local mirror folder: a Llama
subclass under a new name with `auto_map`, which transformers does not know.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.stages.realconfigs import load
from workers.stages import operators, remote_code
from workers.stages.base import PoolSpec, ReleaseRef, StageContext, StageFailed

CONFIGURATION = """
from transformers import LlamaConfig


class Day0TinyConfig(LlamaConfig):
    model_type = "day0tiny"
"""
MODELING = """
from transformers import LlamaForCausalLM

from .configuration_day0tiny import Day0TinyConfig


class Day0TinyForCausalLM(LlamaForCausalLM):
    config_class = Day0TinyConfig
"""
SLOW = (
    MODELING
    + """

import time


class Day0SlowForCausalLM(Day0TinyForCausalLM):
    def __init__(self, config):
        time.sleep(120)
        super().__init__(config)


class Day0HungryForCausalLM(Day0TinyForCausalLM):
    def __init__(self, config):
        import torch

        self.hog = torch.empty(64 * 1024**3, dtype=torch.uint8)  # 64 GiB of address space
        super().__init__(config)
"""
)


def tiny_config(model_class: str = "Day0TinyForCausalLM") -> dict:
    return dict(
        load("meta-llama__Llama-3.1-8B"),
        model_type="day0tiny",
        architectures=[model_class],
        auto_map={
            "AutoConfig": "configuration_day0tiny.Day0TinyConfig",
            "AutoModelForCausalLM": f"modeling_day0tiny.{model_class}",
        },
    )


@pytest.fixture
def mirror(tmp_path: Path) -> Path:
    folder = tmp_path / "acme" / "tiny-1"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(tiny_config()))
    (folder / "configuration_day0tiny.py").write_text(CONFIGURATION)
    (folder / "modeling_day0tiny.py").write_text(MODELING)
    return tmp_path


def context(root: Path, trusted: tuple[str, ...]) -> StageContext:
    return StageContext(
        release=ReleaseRef("mirror", str(root), "acme/tiny-1", "main"),
        pool=PoolSpec(name="cpu", backend="cpu", queue="cpu", trust_remote_code_orgs=trusted),
        previous={"fetch": {"config": tiny_config()}},
    )


def test_policy_is_off_by_default_and_per_org():
    pool = PoolSpec(name="cpu", backend="cpu", queue="cpu", trust_remote_code_orgs=("Acme",))
    assert remote_code.remote_code_allowed("acme/tiny-1", pool)
    assert not remote_code.remote_code_allowed("other/tiny-1", pool)
    assert not remote_code.remote_code_allowed("acme/tiny-1", PoolSpec("cpu", "cpu", "cpu"))


def test_only_architectures_transformers_lacks_need_remote_code():
    # DeepSeek-V3 ships modeling code too, but transformers has the class: that one is used
    assert not remote_code.needs_remote_code(load("deepseek-ai__DeepSeek-V3"))
    assert remote_code.needs_remote_code(tiny_config())
    assert remote_code.modeling_file_names(tiny_config()) == [
        "configuration_day0tiny.py",
        "modeling_day0tiny.py",
    ]


def test_an_untrusted_org_fails_without_running_anything(mirror):
    with pytest.raises(StageFailed) as err:
        operators.run(context(mirror, trusted=()))
    assert err.value.reason.startswith(
        "transformers has no Day0TinyForCausalLM; its shipped modeling code is not allowed for "
        "org acme (trust_remote_code is off for pool cpu)"
    )


def test_a_trusted_org_runs_its_code_in_a_child_process(mirror):
    result = operators.run(context(mirror, trusted=("acme",)))
    assert result["twin"]["code_source"] == "remote"
    assert result["twin"]["class"] == "Day0TinyForCausalLM"
    assert result["missing"] == [] and "aten::embedding.default" in {
        op["name"] for op in result["operators"]
    }


def test_the_child_is_killed_at_its_time_limit():
    files = {
        "configuration_day0tiny.py": CONFIGURATION.encode(),
        "modeling_day0tiny.py": SLOW.encode(),
    }
    with pytest.raises(StageFailed, match=r"ran past its time limit of 8 s .* was killed"):
        remote_code.run_sandboxed(
            "twin",
            tiny_config("Day0SlowForCausalLM"),
            files,
            PoolSpec("cpu", "cpu", "cpu"),
            org="acme",
            time_limit_s=8,
        )


def test_the_child_fails_at_its_memory_limit():
    files = {
        "configuration_day0tiny.py": CONFIGURATION.encode(),
        "modeling_day0tiny.py": SLOW.encode(),
    }
    with pytest.raises(StageFailed, match=r"exceeded the sandbox's memory limit of 4 GiB"):
        remote_code.run_sandboxed(
            "twin",
            tiny_config("Day0HungryForCausalLM"),
            files,
            PoolSpec("cpu", "cpu", "cpu"),
            org="acme",
            memory_limit_bytes=4 * 1024**3,
        )

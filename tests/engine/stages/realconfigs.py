"""The real published configs under tests/data/realconfigs and their published figures."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

REALCONFIGS_DIR = Path(__file__).resolve().parents[2] / "data" / "realconfigs"


@dataclass(frozen=True)
class Published:
    """Figures from tests/data/realconfigs/PUBLISHED.md (params, bytes)."""

    total_params: int
    active_params: int
    weight_bytes: int | None
    kv_bytes_per_token: int


PUBLISHED: dict[str, Published] = {
    "meta-llama__Llama-3.1-8B": Published(8_030_261_248, 7_504_924_672, 16_060_522_496, 131_072),
    "Qwen__Qwen2.5-72B-Instruct": Published(
        72_706_203_648, 71_460_495_360, 145_412_407_296, 327_680
    ),
    "Qwen__Qwen3-235B-A22B-Instruct-2507": Published(
        235_093_634_560, 21_568_433_664, None, 192_512
    ),
    "deepseek-ai__DeepSeek-V3": Published(671_026_404_352, 36_625_603_584, 688_586_727_753, 70_272),
    "moonshotai__Kimi-K2-Instruct": Published(
        1_026_408_209_408, 31_687_072_768, 1_029_173_256_720, 70_272
    ),
    "openai__gpt-oss-20b": Published(20_914_757_184, 3_608_307_264, None, 49_152),
    # Small dense models the cpu pool serves at full size with dummy weights (serve stage).
    "HuggingFaceTB__SmolLM2-135M": Published(134_515_008, 134_515_008, None, 23_040),
    "Qwen__Qwen3-0.6B": Published(596_049_920, 596_049_920, None, 114_688),
}


def load(name: str) -> dict:
    """A real config.json by file name (without .json)."""
    return json.loads((REALCONFIGS_DIR / f"{name}.json").read_text())

"""The plans API's input and output (`POST /api/v1/plans/`, docs/api.md): what to plan, where
and how, with an optional workload; each refusal under its field (`adaptation.plan_requests`)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from adaptation.api.serializers import StrictPrimaryKeyRelatedField
from adaptation.models import ModelRelease
from adaptation.plan_requests import (
    MAX,
    PlanRequestError,
    config_analysis,
    place_of_devices,
    place_of_pool,
    plan_inputs,
    pool_engine_kind,
    release_analysis,
)
from engine.stages.plan.layout import MAX_DEVICES_PER_NODE, MAX_NODES
from engine.stages.plan.steady_state import PHASES as WORKLOAD_PHASES


@extend_schema_field(
    {
        "oneOf": [{"type": "integer", "minimum": 1}, {"type": "string", "enum": ["max"]}],
        "description": "Without a workload, sequences the plan holds at once; with one "
        '(input_len and output_len), requests in flight across all devices, or "max" (the '
        "default there): the load of highest throughput the memory allows.",
    }
)
class ConcurrencyField(serializers.Field):
    """A whole number of at least 1, or "max" (checked further by `plan_inputs`)."""

    default_error_messages = {"invalid": 'Expected a whole number or "max", received {value!r}.'}

    def to_internal_value(self, data: Any) -> int | str:
        if data == MAX or (isinstance(data, int) and not isinstance(data, bool)):
            return data
        self.fail("invalid", value=data)

    def to_representation(self, value: Any) -> Any:
        return value


class PlanCreateInput(serializers.Serializer):
    """What to plan (a release or a config), where (a pool, or devices of a catalog kind),
    how, and optionally a workload to predict on the plan. Each refusal is under its field
    (`adaptation.plan_requests`)."""

    release = StrictPrimaryKeyRelatedField(
        queryset=ModelRelease.objects.prefetch_related("jobs__stage_runs"),
        required=False,
        help_text="A release's id: its newest analysis (else its stored config.json).",
    )
    config = serializers.DictField(
        required=False, help_text="A config.json as an object, in place of a release."
    )
    pool = serializers.CharField(required=False, help_text="A pool's name: plan on its layout.")
    accelerator = serializers.CharField(
        required=False, help_text="A catalog kind (h200, h100, ...; cpu), with devices."
    )
    devices = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_DEVICES_PER_NODE * MAX_NODES,
        help_text="Devices in all.",
    )
    devices_per_node = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_DEVICES_PER_NODE,
        help_text="Devices per node; absent: min(devices, the catalog's figure).",
    )
    split = serializers.CharField(
        required=False,
        max_length=100,
        help_text='Plan this split instead of choosing one: "TP8 PP1 EP1 DP1" (a degree left '
        "out is 1; EP is 1 or TP x DP).",
    )
    context_tokens = serializers.IntegerField(
        required=False,
        help_text="Tokens per sequence the plan sizes for; absent: input_len + output_len with "
        "a workload, else the release's max context capped at 32,768.",
    )
    concurrency = ConcurrencyField(required=False)
    dtype = serializers.CharField(
        required=False,
        help_text="Serving dtype: checkpoint (default), bfloat16, float16, fp8, int8.",
    )
    kv_dtype = serializers.CharField(
        required=False,
        help_text="KV-cache dtype: auto (16-bit, the default), bfloat16, float16, fp8.",
    )
    engine = serializers.CharField(
        required=False,
        help_text="The serving engine whose fitted constants predict: vllm (default; a pool's "
        "own engine with pool), sglang, tensorrt-llm.",
    )
    input_len = serializers.IntegerField(
        required=False, help_text="A workload's prompt tokens per request (with output_len)."
    )
    output_len = serializers.IntegerField(
        required=False, help_text="A workload's generated tokens per request (with input_len)."
    )
    phase = serializers.ChoiceField(
        choices=list(WORKLOAD_PHASES),
        required=False,
        help_text="What the workload's pool runs: both (default), or prefill or decode "
        "(disaggregated serving).",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """One of release and config; one of pool and accelerator with devices; the options
        checked (`plan_inputs`); then the place (`place_of_pool`, `place_of_devices`) and
        the analysis (`release_analysis`, `config_analysis`). Adds "inputs", "catalog",
        "layout", "note", "analysis", "release_name" and "analysis_note"."""
        if ("release" in attrs) == ("config" in attrs):
            field = "config" if "release" in attrs else "release"
            raise serializers.ValidationError(
                {field: ["Give a release id or a config, one of them."]}
            )
        if "pool" in attrs and ({"accelerator", "devices", "devices_per_node"} & attrs.keys()):
            raise serializers.ValidationError(
                {"pool": ["Give a pool, or an accelerator with devices, not both."]}
            )
        if "pool" not in attrs:
            for field in ("accelerator", "devices"):
                if field not in attrs:
                    raise serializers.ValidationError(
                        {field: ["Say where to plan: a pool, or an accelerator with devices."]}
                    )
        try:
            attrs["inputs"] = plan_inputs(
                context_tokens=attrs.get("context_tokens"),
                concurrency=attrs.get("concurrency"),
                dtype=attrs.get("dtype"),
                kv_dtype=attrs.get("kv_dtype"),
                split=attrs.get("split"),
                input_len=attrs.get("input_len"),
                output_len=attrs.get("output_len"),
                phase=attrs.get("phase"),
                engine=attrs.get("engine")
                or (pool_engine_kind(attrs["pool"]) if "pool" in attrs else None),
            )
            if "pool" in attrs:
                place = place_of_pool(attrs["pool"])
            else:
                place = place_of_devices(
                    attrs["accelerator"], attrs["devices"], attrs.get("devices_per_node")
                )
            attrs["catalog"], attrs["layout"], attrs["note"] = place
            if "release" in attrs:
                attrs["analysis"], attrs["analysis_note"] = release_analysis(attrs["release"])
                attrs["release_name"] = attrs["release"].repo_id
            else:
                attrs["release_name"], attrs["analysis"] = config_analysis(attrs["config"])
                attrs["analysis_note"] = "the config given, analysed now"
        except PlanRequestError as exc:
            raise serializers.ValidationError({exc.field: [str(exc)]}) from exc
        return attrs


class PlanOutput(serializers.Serializer):
    """A plan, and the workload's prediction on its split."""

    plan = serializers.DictField(
        help_text="The plan as `manage.py plan --format json` prints it (docs/stages/plan.md); "
        'when nothing fits, or the given split does not: {"fits": false, "reason", '
        '"suggestions", ...}.'
    )
    workload = serializers.DictField(
        allow_null=True,
        help_text="The workload's prediction (output_tokens_per_s, input_tokens_per_s, "
        "output_tokens_per_s_per_device, ttft_s, tpot_s, e2e_s: medians, batch, fit, ...); "
        "null without input_len and output_len, or when nothing fits.",
    )

"""`python manage.py plan PATH_OR_REPO_ID (--pool NAME | --accelerator KIND --devices N
[--devices-per-node M]) [--split "TP8 PP1 EP1 DP1"] [--context N] [--concurrency N|max]
[--dtype D] [--kv-dtype D] [--engine E] [--input-len N --output-len N [--phase both|prefill|decode]]
[--format text|json]`.

The distributed plan of one release on a pool, computed here without a worker or a job: the
TP/PP/EP/DP split with the fewest devices that fits (or the one --split gives, sized and
predicted), memory per device by part, predicted decode tokens/s and TPOT at batch 1 and at
the largest batch that fits, runners-up and launch commands. With --input-len and
--output-len, beside it a served workload's prediction (`workload`: output and input
tokens/s, per device, median TTFT, TPOT and end-to-end latency, the batch, the fit), where
--concurrency is requests in flight across all devices (`adaptation.plan_requests` says how
it reads beside the plan's). The accelerator's figures are the catalog's (the shipped file
plus the admin's rows); the `cpu` kind of a cpu pool is its live worker's machine as it
registered (else this machine).

Exit status: 0 with a plan; 2 when nothing fits, or the given split does not (the reason
says what would: more devices, a smaller context, a lower-precision dtype; with --format
json, {"fits": false, "reason", "suggestions", ...} is printed first); 1 with a one-line
reason for bad input (unknown kind or pool, --devices 0, a malformed config, a split not in
the notation or larger than the pool, one workload length without the other).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from adaptation.job_options import positive_int
from adaptation.plan_requests import (
    PlanInputs,
    PlanRequestError,
    flag_name,
    place_of_devices,
    place_of_pool,
    plan_and_workload,
    plan_inputs,
    pool_engine_kind,
)
from adaptation.targets import TargetError, resolve_target
from engine import formatting as fmt
from engine.architecture import AnalysisError, analyze_config
from engine.catalog import Catalog, CatalogError
from engine.contract import StageFailed
from engine.hubs import hub_source
from engine.hubs.base import HubError, is_valid_repo_id
from engine.stages.fetch.run import parse_json_file, parse_release_files
from engine.stages.plan.errors import NoFittingPlan, PlanInputError
from engine.stages.plan.layout import MAX_DEVICES_PER_NODE, MAX_NODES, PoolLayout
from engine.stages.plan.run import no_fit_result
from engine.stages.plan.steady_state import MAX_TOKENS

NO_FIT_EXIT_CODE = 2


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def add_plan_option_arguments(parser: Any, *, workload: bool = False) -> None:
    """--context, --concurrency and --dtype (shared by `plan` and `adapt`); `workload`: the
    `plan` command's --concurrency, which is also a workload's."""
    parser.add_argument("--context", default=None, help="Tokens per sequence to plan for.")
    parser.add_argument(
        "--concurrency",
        default=None,
        help="Sequences held at once; with --input-len/--output-len, requests in flight across "
        "all devices, or max (the default there: the load of highest throughput)."
        if workload
        else "Sequences held at once.",
    )
    parser.add_argument(
        "--dtype", default=None, help="checkpoint (default), bfloat16, float16, fp8, int8."
    )


def load_target(target: str) -> tuple[str, dict, dict | None]:
    """(release name, config dict, safetensors summary or None) for a config JSON file, a
    release folder or a Hub repo id, read as `analyze` reads it. A bare config file is named
    by its `_name_or_path` when that is an org/name repo id, else by the file's stem (the
    command's --model-id names it for the launch commands). Raises `TargetError`,
    `StageFailed` (malformed files) or `HubError`."""
    path = Path(target).expanduser()
    if path.is_file() and path.name != "config.json":
        config = parse_json_file(path.name, path.read_bytes())
        if not isinstance(config, dict):
            raise TargetError(f"{path.name} is valid JSON but not an object.")
        named = config.get("_name_or_path")
        if is_valid_repo_id(named):
            return named, config, None
        return path.stem, config, None
    resolved = resolve_target(target)
    fetched = hub_source(resolved.spec).fetch_release(
        resolved.candidate.repo_id, resolved.candidate.revision
    )
    parsed = parse_release_files(fetched)
    return resolved.candidate.repo_id, parsed["config"], parsed["weights"]


def _tokens_per_s(point: dict | None) -> str:
    if not point:
        return fmt.MISSING
    return (
        f"{fmt.tokens_per_s(point['decode_tokens_per_s'])} (TPOT {fmt.ms(point['tpot_s'])}, "
        f"{fmt.counted(point['concurrent_sequences'], 'sequence')})"
    )


# How a workload's phase reads: the pool runs both, or one side of disaggregated serving.
PHASE_WORDS = {
    "both": "prefill and decode",
    "prefill": "a prefill pool (disaggregated)",
    "decode": "a decode pool (disaggregated)",
}


# What a fit's points are, by its scope (`fits.Fit.scope`).
FIT_POINT_WORDS = {
    "pool": "measured point",
    "prior": "point",
    "accelerator+engine": "published point",
    "engine": "published point",
    "all": "published point",
}


def workload_lines(workload: dict) -> list[str]:
    """A workload prediction for a terminal (`WorkloadPrediction.to_dict()`): what is
    served on which split, the throughput of all devices and per device, the median
    latencies, the batch and the fit the figures come from."""
    requests = fmt.counted(workload["concurrency"], "request")
    load = f"max load: {requests}" if workload["concurrency_requested"] == "max" else requests
    fit = workload["fit"]
    accelerator = "any accelerator" if fit["accelerator"] == "*" else fit["accelerator"]
    residual = f", error factor x{fmt.sig(fit['residual'])}" if fit.get("residual") else ""
    return [
        f"  {'workload':<14}{fmt.count(workload['input_tokens'])} input + "
        f"{fmt.count(workload['output_tokens'])} output tokens per request, {load} in flight, "
        f"{PHASE_WORDS.get(workload['phase'], workload['phase'])}, on {workload['split']}, "
        f"KV cache {workload['kv_dtype']}",
        f"  {'predicted':<14}output {fmt.tokens_per_s(workload['output_tokens_per_s'])} "
        f"({fmt.tokens_per_s(workload['output_tokens_per_s_per_device'])} per device), input "
        f"{fmt.tokens_per_s(workload['input_tokens_per_s'])}",
        f"  {'':<14}median TTFT {fmt.ms(workload['ttft_s'])}, TPOT {fmt.ms(workload['tpot_s'])}, "
        f"end to end {fmt.ms(workload['e2e_s'])}; batch {fmt.sig(workload['batch'])} "
        f"sequences per replica (bound by {workload['batch_bound_by'].replace('_', ' ')}), "
        f"its KV cache holds {fmt.count(workload['kv_capacity_sequences'])}",
        f"  {'fit':<14}{accelerator} x {fit['engine']} ({fit['scope']}, "
        f"{fmt.counted(fit['points'], FIT_POINT_WORDS.get(fit['scope'], 'point'))}{residual})",
    ]


def summary_text(plan: dict, note: str, workload: dict | None = None) -> str:
    """The plan for a terminal: split, devices, memory parts in GiB, predicted figures
    (labelled predicted), runners-up and launch commands; then the workload's lines
    (`workload_lines`) when there is one."""
    mem = plan["memory_per_device_bytes"]
    pool = plan["pool"]
    inputs = plan["inputs"]
    lines = [
        f"{plan['release']} on {pool['devices']} x {plan['accelerator']}: "
        f"{plan['accelerator_name']}, {fmt.counted(pool['nodes'], 'node')} of "
        f"{pool['devices_per_node']}",
        f"  {'split':<14}{fmt.split(plan)} on {fmt.counted(plan['devices'], 'device')}, "
        f"{fmt.counted(plan['nodes'], 'node')}",
        f"  {'serving':<14}{plan['dtype_label']}; context {inputs['context_tokens']:,} tokens "
        f"x {inputs['concurrency']:,} sequence{'s' if inputs['concurrency'] != 1 else ''}",
        f"  {'memory/device':<14}weights {fmt.gib(mem['weights'])} + KV cache "
        f"{fmt.gib(mem['kv_cache'])} + activations {fmt.gib(mem['activations_workspace'])} "
        f"+ runtime {fmt.gib(mem['runtime_overhead'])} = {fmt.gib(mem['total_used'])}",
        f"  {'':<14}budget {fmt.gib(mem['budget'])} ({mem['budget'] / mem['capacity']:.0%} of "
        f"{fmt.gib(mem['capacity'])}); free {fmt.gib(mem['free'])}",
    ]
    predicted = plan["predicted"]
    if predicted.get("available"):
        lines += [
            f"  {'predicted':<14}decode at batch 1: {_tokens_per_s(predicted.get('batch_1'))}",
            f"  {'':<14}decode at the largest batch that fits: "
            f"{_tokens_per_s(predicted.get('largest_batch'))}",
        ]
    else:
        reason = predicted.get("reason")
        lines.append(f"  {'predicted':<14}no prediction" + (f": {reason}" if reason else ""))
    lines += [f"  {'warning':<14}{flag}" for flag in plan.get("validity_flags", [])]
    for row in plan["runners_up"][:5]:
        lines.append(f"  {'runner-up':<14}{fmt.split(row)} on {row['devices']}: {row['why_lost']}")
    for name in ("vllm", "sglang"):
        command = plan["artifacts"].get(name)
        if command:
            lines.append(f"  {name:<14}{command}")
    notes = [note, *plan.get("notes", []), *plan["artifacts"].get("notes", [])]
    lines += [f"  note: {line}" for line in notes if line]
    if workload is not None:
        lines += workload_lines(workload)
    lines.append(
        "Predicted figures are a model of one engine step at the accelerator's figures (where "
        "they come from: the first note) and efficiencies fitted on published serving results, "
        "on the pool's own full-size sweeps, or assumed (which: the fit, in the assumptions), "
        "not measurements of this model "
        f"(catalog {plan.get('catalog_version', '?')})."
    )
    return "\n".join(lines)


class Command(BaseCommand):
    help = (
        "Plan serving a release (config JSON file, release folder or org/name) on a pool or "
        "on N accelerators of a catalog kind, and predict a served workload on it."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("target", help="config JSON file, release folder, or org/name.")
        parser.add_argument("--pool", default=None, help="A pool's name: plan on its layout.")
        parser.add_argument(
            "--accelerator", default=None, help="A catalog kind (h200, h100, ...; cpu)."
        )
        parser.add_argument("--devices", default=None, help="Devices in all, with --accelerator.")
        parser.add_argument(
            "--devices-per-node",
            default=None,
            help="Devices per node (default: min(--devices, the catalog's figure)).",
        )
        parser.add_argument(
            "--split",
            default=None,
            help='Report this split instead of choosing one: "TP8 PP1 EP1 DP1" (a degree left '
            "out is 1; EP is 1 or TP x DP).",
        )
        add_plan_option_arguments(parser, workload=True)
        parser.add_argument(
            "--kv-dtype",
            default=None,
            help="KV-cache dtype: auto (16-bit, the default), bfloat16, float16, fp8.",
        )
        parser.add_argument(
            "--engine",
            default=None,
            help="The serving engine whose fitted constants predict: vllm (default; a pool's "
            "own engine with --pool), sglang, tensorrt-llm.",
        )
        parser.add_argument(
            "--input-len", default=None, help="A workload's prompt tokens per request."
        )
        parser.add_argument(
            "--output-len", default=None, help="A workload's generated tokens per request."
        )
        parser.add_argument(
            "--phase",
            default=None,
            help="What the workload's pool runs: both (default), prefill or decode "
            "(disaggregated serving).",
        )
        parser.add_argument(
            "--model-id",
            default=None,
            help="The model's repo id in the launch commands (default: the release's; a bare "
            "config file's _name_or_path or file name).",
        )
        parser.add_argument("--format", choices=["text", "json"], default="text")

    def handle(
        self,
        *args: Any,
        target: str,
        pool: str | None,
        accelerator: str | None,
        devices: str | None,
        devices_per_node: str | None,
        split: str | None,
        context: str | None,
        concurrency: str | None,
        dtype: str | None,
        kv_dtype: str | None,
        engine: str | None,
        input_len: str | None,
        output_len: str | None,
        phase: str | None,
        format: str,
        model_id: str | None,
        **options: Any,
    ) -> None:
        try:
            catalog, layout, note = self._layout(pool, accelerator, devices, devices_per_node)
        except DatabaseError as exc:
            raise CommandError(
                f"cannot read day0's database ({_one_line(exc)}): run "
                "`python manage.py migrate` first"
            ) from exc
        try:
            inputs = plan_inputs(
                context_tokens=positive_int("--context", context, limit=10**12),
                concurrency=concurrency,
                dtype=dtype,
                kv_dtype=kv_dtype,
                split=split,
                input_len=positive_int("--input-len", input_len, limit=MAX_TOKENS),
                output_len=positive_int("--output-len", output_len, limit=MAX_TOKENS),
                phase=phase,
                engine=engine or (pool_engine_kind(pool) if pool else None),
                spell=flag_name,
            )
        except PlanRequestError as exc:
            raise CommandError(_one_line(exc)) from exc
        try:
            name, config, weights = load_target(target)
            if model_id is not None and not is_valid_repo_id(model_id):
                raise TargetError(f"--model-id must be a repo id like org/name, got {model_id!r}")
            name = model_id or name
            analysis = analyze_config(config, weights=weights).to_dict()
        except (TargetError, StageFailed, AnalysisError, HubError) as exc:
            message = getattr(exc, "reason", None) or getattr(exc, "message", None) or str(exc)
            raise CommandError(_one_line(message)) from exc
        try:
            result, workload = plan_and_workload(
                analysis, layout, catalog, inputs, release=name, spell=flag_name, pool=pool
            )
        except NoFittingPlan as exc:
            if format == "json":
                self.stdout.write(
                    json.dumps(self._no_fit(exc, analysis, layout, catalog, inputs, name, note))
                )
            raise CommandError(_one_line(exc), returncode=NO_FIT_EXIT_CODE) from exc
        except (PlanRequestError, PlanInputError, CatalogError) as exc:
            raise CommandError(_one_line(exc)) from exc
        result["note"] = note
        if format == "json":
            if workload is not None:
                result["workload"] = workload
            self.stdout.write(json.dumps(result, indent=2, allow_nan=False))
            return
        self.stdout.write(summary_text(result, note, workload))

    @staticmethod
    def _no_fit(
        exc: NoFittingPlan,
        analysis: dict,
        layout: PoolLayout,
        catalog: Catalog,
        inputs: PlanInputs,
        name: str,
        note: str,
    ) -> dict[str, Any]:
        """What --format json prints when nothing fits: `no_fit_result`, the note, and the
        split that was given (its label) when there was one."""
        options = {
            "context_tokens": inputs.context_tokens,
            "concurrency": inputs.concurrency,
            "dtype": inputs.dtype,
        }
        result = no_fit_result(exc, analysis, layout, catalog, options, release=name)
        result["note"] = note
        if inputs.split is not None:
            result["split"] = inputs.split.label()
        return result

    @staticmethod
    def _layout(
        pool: str | None,
        accelerator: str | None,
        devices: str | None,
        devices_per_node: str | None,
    ) -> tuple[Catalog, PoolLayout, str]:
        """(catalog, layout, note on the accelerator's figures) from the options."""
        if pool and (accelerator or devices or devices_per_node):
            raise CommandError(
                "give --pool NAME, or --accelerator KIND --devices N [--devices-per-node M], "
                "not both"
            )
        try:
            if pool:
                return place_of_pool(pool)
            if not accelerator:
                raise CommandError(
                    "say where to plan: --pool NAME, or --accelerator KIND --devices N "
                    "[--devices-per-node M]"
                )
            count = positive_int("--devices", devices, limit=MAX_DEVICES_PER_NODE * MAX_NODES)
            if count is None:
                raise CommandError(f"--accelerator {accelerator} needs --devices N")
            per_node = positive_int(
                "--devices-per-node", devices_per_node, limit=MAX_DEVICES_PER_NODE
            )
            return place_of_devices(accelerator, count, per_node, spell=flag_name)
        except PlanRequestError as exc:
            raise CommandError(_one_line(exc)) from exc

"""`python manage.py plan PATH_OR_REPO_ID (--pool NAME | --accelerator KIND --devices N
[--devices-per-node M]) [--context N] [--concurrency N] [--dtype D] [--format text|json]`.

The distributed plan of one release on a pool, computed here without a worker or a job: the
TP/PP/EP/DP split with the fewest devices that fits, memory per device by part, predicted
decode tokens/s and TPOT at batch 1 and at the largest batch that fits, runners-up and launch
commands. The accelerator's figures are the catalog's (the shipped file plus the admin's
rows); the `cpu` kind of a cpu pool is its live worker's machine as it registered (else this
machine).

Exit status: 0 with a plan; 2 when nothing fits (the reason says what would: more devices, a
smaller context, a lower-precision dtype; with --format json, {"fits": false, "reason",
"suggestions", ...} is printed first); 1 with a one-line reason for bad input (unknown kind
or pool, --devices 0, a malformed config).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from adaptation.catalog import pool_catalog
from adaptation.job_options import plan_options_from_args, positive_int
from adaptation.models import AcceleratorKind, AcceleratorPool
from adaptation.targets import TargetError, resolve_target
from engine import formatting as fmt
from engine.architecture import AnalysisError, analyze_config
from engine.catalog import Catalog, CatalogError, cpu_accelerator
from engine.contract import StageFailed
from engine.hubs import hub_source
from engine.hubs.base import HubError, is_valid_repo_id
from engine.stages.fetch.run import parse_json_file, parse_release_files
from engine.stages.plan.errors import NoFittingPlan, PlanInputError
from engine.stages.plan.layout import MAX_DEVICES_PER_NODE, MAX_NODES, PoolLayout
from engine.stages.plan.planner import plan_release
from engine.stages.plan.run import no_fit_result

NO_FIT_EXIT_CODE = 2


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def add_plan_option_arguments(parser: Any) -> None:
    """--context, --concurrency and --dtype (shared by `plan` and `adapt`)."""
    parser.add_argument("--context", default=None, help="Tokens per sequence to plan for.")
    parser.add_argument("--concurrency", default=None, help="Sequences held at once.")
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


def layout_for_devices(
    catalog: Catalog, kind: str, devices: int, devices_per_node: int | None
) -> PoolLayout:
    """A pool of `devices` x `kind`: `devices_per_node` defaults to min(devices, the
    catalog's per-node figure); `devices` must be a whole number of nodes. Raises
    `CommandError` (and `CatalogError` for an unknown kind)."""
    accelerator = catalog.accelerator(kind)
    if devices_per_node is None:
        devices_per_node = min(devices, accelerator.devices_per_node)
        if devices % devices_per_node:
            lower = devices - devices % devices_per_node
            raise CommandError(
                f"--devices {devices} is not a whole number of {kind} nodes of "
                f"{devices_per_node}: use {lower} or {lower + devices_per_node}, or give "
                "--devices-per-node"
            )
    elif devices % devices_per_node:
        raise CommandError(
            f"--devices {devices} is not a multiple of --devices-per-node {devices_per_node}"
        )
    return PoolLayout(kind, devices_per_node=devices_per_node, nodes=devices // devices_per_node)


def _tokens_per_s(point: dict | None) -> str:
    if not point:
        return fmt.MISSING
    return (
        f"{fmt.tokens_per_s(point['decode_tokens_per_s'])} (TPOT {fmt.ms(point['tpot_s'])}, "
        f"{fmt.counted(point['concurrent_sequences'], 'sequence')})"
    )


def summary_text(plan: dict, note: str) -> str:
    """The plan for a terminal: split, devices, memory parts in GiB, predicted figures
    (labelled predicted), runners-up and launch commands."""
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
        lines.append(f"  {'predicted':<14}{predicted.get('reason') or 'no prediction'}")
    lines += [f"  {'warning':<14}{flag}" for flag in plan.get("validity_flags", [])]
    for row in plan["runners_up"][:5]:
        lines.append(f"  {'runner-up':<14}{fmt.split(row)} on {row['devices']}: {row['why_lost']}")
    for name in ("vllm", "sglang"):
        command = plan["artifacts"].get(name)
        if command:
            lines.append(f"  {name:<14}{command}")
    notes = [note, *plan.get("notes", []), *plan["artifacts"].get("notes", [])]
    lines += [f"  note: {line}" for line in notes if line]
    lines.append(
        "Predicted figures are a roofline model of the accelerator's figures (where they come "
        "from: the first note), not measurements of this model "
        f"(catalog {plan.get('catalog_version', '?')})."
    )
    return "\n".join(lines)


class Command(BaseCommand):
    help = (
        "Plan serving a release (config JSON file, release folder or org/name) on a pool or "
        "on N accelerators of a catalog kind."
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
        add_plan_option_arguments(parser)
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
        context: str | None,
        concurrency: str | None,
        dtype: str | None,
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
        planned_options = plan_options_from_args(context, concurrency, dtype)
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
            plan = plan_release(
                analysis,
                layout,
                context_tokens=planned_options.get("context_tokens"),
                concurrency=planned_options.get("concurrency"),
                dtype=planned_options.get("dtype"),
                release=name,
                catalog=catalog,
            )
        except NoFittingPlan as exc:
            if format == "json":
                result = no_fit_result(
                    exc, analysis, layout, catalog, planned_options, release=name
                )
                result["note"] = note
                self.stdout.write(json.dumps(result, indent=2))
            raise CommandError(_one_line(exc), returncode=NO_FIT_EXIT_CODE) from exc
        except (PlanInputError, CatalogError) as exc:
            raise CommandError(_one_line(exc)) from exc
        result = plan.to_dict()
        result["catalog_version"] = catalog.version
        result["note"] = note
        if format == "json":
            self.stdout.write(json.dumps(result, indent=2, allow_nan=False))
            return
        self.stdout.write(summary_text(result, note))

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
        if pool:
            row = AcceleratorPool.objects.filter(name=pool).first()
            if row is None:
                known = ", ".join(AcceleratorPool.objects.values_list("name", flat=True))
                raise CommandError(f"no pool {pool!r}; pools: {known or 'none'}")
            try:
                return pool_catalog(row)
            except CatalogError as exc:
                raise CommandError(_one_line(exc)) from exc
        if not accelerator:
            raise CommandError(
                "say where to plan: --pool NAME, or --accelerator KIND --devices N "
                "[--devices-per-node M]"
            )
        count = positive_int("--devices", devices, limit=MAX_DEVICES_PER_NODE * MAX_NODES)
        if count is None:
            raise CommandError(f"--accelerator {accelerator} needs --devices N")
        per_node = positive_int("--devices-per-node", devices_per_node, limit=MAX_DEVICES_PER_NODE)
        try:
            catalog = AcceleratorKind.objects.catalog()
            if accelerator == "cpu":
                cpu = cpu_accelerator()
                catalog = catalog.with_cpu(cpu)
                note = f"cpu is this machine as measured here ({fmt.gib(cpu.memory_bytes)})"
            else:
                note = ""
            layout = layout_for_devices(catalog, accelerator, count, per_node)
        except CatalogError as exc:
            raise CommandError(_one_line(exc)) from exc
        if not note:
            origin = (
                "the admin's catalog row"
                if AcceleratorKind.objects.filter(kind=accelerator).exists()
                else f"catalog {catalog.version}"
            )
            note = f"{accelerator} ({catalog.accelerator(accelerator).name}) figures from {origin}"
        return catalog, layout, note

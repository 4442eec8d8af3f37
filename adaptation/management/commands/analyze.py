"""`python manage.py analyze PATH_OR_REPO_ID [--format json]`: the architecture analysis of
one config, computed here without a worker or a job.

Engine-only: it reads no model and no URL, so Django's system checks are skipped and
`manage.py` runs it without loading the app registry (`ENGINE_ONLY_COMMANDS`); the family
defaults come from the on-disk cache (`engine.architecture.transformers_defaults`), so a run
imports transformers only the first time a family is seen with a transformers version.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from adaptation.targets import TargetError, resolve_target
from engine import formatting as fmt
from engine.architecture import AnalysisError, analyze_config
from engine.architecture.checkpoint_analysis import with_checkpoint
from engine.contract import StageFailed
from engine.hubs import hub_source
from engine.hubs.base import HubError
from engine.stages.fetch.run import parse_json_file, parse_release_files


def _layout(name: str, layout: dict | None, skip: tuple[str, ...] = ()) -> str:
    """One line for a nested part of the analysis (attention, RoPE, MoE, quantization)."""
    if not layout:
        return f"  {name:<14}none"
    parts = [
        f"{key}={value}"
        for key, value in layout.items()
        if key not in skip and value not in (None, [], {}, "", 0)
    ]
    return f"  {name:<14}" + ", ".join(parts)


def summary_text(a: dict) -> str:
    """The analysis for a terminal: sizes with units, nested layouts on one line each."""
    lines = [
        f"{a.get('architecture')} (model_type {a.get('model_type')}, family {a.get('family')}"
        f"{'' if a.get('family_known', True) else ', not a known family'})",
        f"  {'shape':<14}{a.get('num_layers')} layers, hidden {a.get('hidden_size'):,}, "
        f"{a.get('num_attention_heads')} heads / {a.get('num_kv_heads')} KV heads, "
        f"head_dim {a.get('head_dim')}, vocab {a.get('vocab_size'):,}",
        _layout("attention", a.get("attention"), skip=("layer_types",)),
        _layout("RoPE", a.get("rope")),
        _layout("MoE", a.get("moe"), skip=("moe_layer_indices", "dense_layer_indices")),
        _layout("quantization", a.get("quantization")),
        f"  {'total params':<14}{fmt.params_words(a.get('total_params'))} "
        f"({a.get('total_params'):,})",
        f"  {'active params':<14}{fmt.params_words(a.get('active_params'))} per token, "
        "excluding the input embedding",
        f"  {'extra params':<14}{fmt.params_words(a.get('extra_params'))} (MTP and the like)",
        f"  {'weight bytes':<14}{fmt.gib(a.get('weight_bytes'))}"
        + (
            f"; checkpoint as published {fmt.gib(a['checkpoint_total_size_bytes'])}"
            if a.get("checkpoint_total_size_bytes")
            else ""
        ),
        f"  {'KV cache':<14}{fmt.bytes_per_token(a.get('kv_cache_bytes_per_token'))} at bf16; "
        f"{fmt.gib(a.get('kv_cache_bytes_at_max_context'))} at max context "
        f"({a.get('max_position_embeddings'):,} tokens)",
    ]
    checkpoint = a.get("checkpoint")
    if a.get("params_counted_from") == "checkpoint" and isinstance(checkpoint, dict):
        config_total = (a.get("config_figures") or {}).get("total_params")
        lines.append(
            f"  {'checkpoint':<14}{checkpoint.get('tensor_count', 0):,} tensors: "
            f"{fmt.params_words(checkpoint.get('total_params'))}; the config gives "
            f"{fmt.params_words(config_total)}"
        )
    # What an estimate took for granted (an unknown model type or layer kind) comes first.
    lines += [f"  assumed: {item}" for item in a.get("assumptions") or []]
    lines += [f"  note: {note}" for note in a.get("notes", [])]
    if a.get("params_counted_from") == "checkpoint":
        lines.append(
            "Parameters and bytes are counted from the checkpoint's safetensors headers; the"
            " rest is computed from the config (nothing measured)."
        )
    else:
        lines.append("Every figure is computed from the config (nothing measured).")
    return "\n".join(lines)


class Command(BaseCommand):
    help = "Analyse a model config: a JSON file, a release folder, or a Hub repo id."
    # Engine-only: no database, no URLs. Django's checks would import every view, the API and
    # its schema (a second of a 1.5 s run) to check what this command never touches.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser) -> None:
        parser.add_argument("target", help="config JSON file, release folder, or org/name.")
        parser.add_argument("--format", choices=["text", "json"], default="text")

    def handle(self, *args, target: str, format: str, **options) -> None:
        # The settings export DAY0_VAR_DIR (where the defaults cache lives) and the hub's
        # environment; `manage.py` did not load them (no app registry for this command).
        settings.VAR_DIR  # noqa: B018
        try:
            config, weights = self._load(target)
            analysis = with_checkpoint(
                analyze_config(config, weights=weights).to_dict(), config, weights
            )
        except (TargetError, StageFailed, AnalysisError, HubError) as exc:
            message = getattr(exc, "reason", None) or getattr(exc, "message", None) or str(exc)
            raise CommandError(" ".join(str(message).split())) from exc
        if format == "json":
            self.stdout.write(json.dumps(analysis, indent=2))
            return
        self.stdout.write(summary_text(analysis))

    @staticmethod
    def _load(target: str) -> tuple[dict, dict | None]:
        path = Path(target).expanduser()
        if path.is_file() and path.name != "config.json":
            config = parse_json_file(path.name, path.read_bytes())
            if not isinstance(config, dict):
                raise TargetError(f"{path.name} is valid JSON but not an object.")
            return config, None
        resolved = resolve_target(target)
        fetched = hub_source(resolved.spec).fetch_release(
            resolved.candidate.repo_id, resolved.candidate.revision
        )
        parsed = parse_release_files(fetched)
        return parsed["config"], parsed["weights"]

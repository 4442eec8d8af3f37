"""`python manage.py analyze PATH_OR_REPO_ID [--format json]`: the architecture analysis of
one config, computed here without a worker or a job."""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from adaptation.hubs import hub_source
from adaptation.hubs.base import HubError
from adaptation.targets import TargetError, resolve_target
from workers.stages.architecture import AnalysisError, analyze_config
from workers.stages.base import StageFailed
from workers.stages.fetch import parse_json_file, parse_release_files


class Command(BaseCommand):
    help = "Analyse a model config: a JSON file, a release folder, or a Hub repo id."

    def add_arguments(self, parser) -> None:
        parser.add_argument("target", help="config JSON file, release folder, or org/name.")
        parser.add_argument("--format", choices=["text", "json"], default="text")

    def handle(self, *args, target: str, format: str, **options) -> None:
        try:
            config, weights = self._load(target)
            analysis = analyze_config(config, weights=weights).to_dict()
        except (TargetError, StageFailed, AnalysisError, HubError) as exc:
            message = getattr(exc, "reason", None) or getattr(exc, "message", None) or str(exc)
            raise CommandError(" ".join(str(message).split())) from exc
        if format == "json":
            self.stdout.write(json.dumps(analysis, indent=2))
            return
        width = max(len(key) for key in analysis)
        for key, value in analysis.items():
            shown = json.dumps(value) if isinstance(value, dict | list) else value
            self.stdout.write(f"{key:<{width}}  {shown}")

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

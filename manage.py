#!/usr/bin/env python
"""Django's command-line utility for day0."""

import os
import sys

# Commands that touch no model, URL or app (the engine's, on a file or a hub): run without
# loading the app registry, which imports every app's models and admin and is most of a short
# command's time. Each still reads the settings (`Command.handle`).
ENGINE_ONLY_COMMANDS = {"analyze": "adaptation.management.commands.analyze"}

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "day0web.settings")
    if len(sys.argv) > 1 and sys.argv[1] in ENGINE_ONLY_COMMANDS:
        from importlib import import_module

        # No Celery app either (day0web/__init__.py): these commands send no task.
        os.environ["DAY0_ENGINE_ONLY"] = "1"

        import_module(ENGINE_ONLY_COMMANDS[sys.argv[1]]).Command().run_from_argv(sys.argv)
        sys.exit(0)
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)

"""The release page's "Adapt on pool…" form (`adaptation.views.adapt`): a pool, the plan
options `manage.py adapt` takes as --context, --concurrency and --dtype, and any stage's
options as JSON (its --options). Each value goes through the checks the command uses
(`adaptation.job_options`: the plan stage's `plan_options` and every stage's `check_options`
through `engine.registry.job_options_check`), and each refusal is shown under its field."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.core.management.base import CommandError

from adaptation.job_options import (
    EXAMPLE_OPTIONS,
    job_options_from_args,
    plan_options_from_args,
)
from adaptation.models import AcceleratorPool

# The form's fields and the command's flags they stand for, as the shared checks name them.
_PLAN_FIELDS = {"context": "--context", "concurrency": "--concurrency", "dtype": "--dtype"}
# Serving dtypes besides the checkpoint's own (the blank choice), as `plan_options` takes them.
_DTYPES = ("bfloat16", "float16", "fp8", "int8")


def _reworded(exc: CommandError, words: dict[str, str]) -> str:
    """The check's one-line reason, naming the fields as the form labels them, not the flags."""
    text = str(exc)
    for flag, label in words.items():
        text = text.replace(flag, label)
    return text


class AdaptForm(forms.Form):
    """Start a job for a release on a pool, with the options `manage.py adapt` takes.

    `cleaned_data["job_options"]` holds the per-stage options as checked (the plan entry with
    the context, concurrency and dtype merged in), ready for `job_create`;
    `cleaned_data["allow_duplicate"]` is its `allow_duplicate`.
    """

    pool = forms.ModelChoiceField(
        queryset=AcceleratorPool.objects.none(),
        to_field_name="name",
        empty_label=None,
        help_text="The pool whose workers run the job.",
    )
    context = forms.CharField(
        required=False,
        label="Context",
        widget=forms.NumberInput(attrs={"min": 1, "placeholder": "release's, up to 32,768"}),
        help_text="Tokens per sequence the plan sizes for.",
    )
    concurrency = forms.CharField(
        required=False,
        label="Concurrency",
        widget=forms.NumberInput(attrs={"min": 1, "placeholder": "4"}),
        help_text="Sequences served at once.",
    )
    dtype = forms.ChoiceField(
        required=False,
        label="Dtype",
        choices=[("", "checkpoint's (default)"), *((d, d) for d in _DTYPES)],
        help_text="The serving dtype the plan and the measuring stages use.",
    )
    options = forms.CharField(
        required=False,
        label="Stage options (JSON)",
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60, "placeholder": EXAMPLE_OPTIONS}),
        help_text="Any stage's options keyed by stage name, as `manage.py adapt --options`.",
    )
    # Shown only once a job for the release on the pool was found still pending or running
    # (`views.adapt`): ticking it is asking for a second job explicitly.
    allow_duplicate = forms.BooleanField(
        required=False,
        label="Start another job anyway",
        help_text="Even though a job for this release on this pool has not ended.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "adapt")
        super().__init__(*args, **kwargs)
        pool = self.fields["pool"]
        pool.queryset = AcceleratorPool.objects.filter(enabled=True).order_by("name")
        pool.initial = settings.DAY0_DEFAULT_POOL

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        plan: dict[str, Any] = {}
        for name, flag in _PLAN_FIELDS.items():
            value = data.get(name) or None
            try:
                checked = plan_options_from_args(**{k: None for k in _PLAN_FIELDS} | {name: value})
            except CommandError as exc:
                self.add_error(name, _reworded(exc, {flag: self.fields[name].label}))
            else:
                plan |= checked
        if self.errors:
            return data
        try:
            data["job_options"] = job_options_from_args(data.get("options") or None, plan) or None
        except CommandError as exc:
            words = {"--context/--concurrency/--dtype": "the fields above", "--options": "Options"}
            self.add_error("options", _reworded(exc, words))
        return data

"""Forms of the known-limitation pages (`adaptation.views.limitations`)."""

from __future__ import annotations

from typing import Any

from django import forms

from adaptation.models import AcceleratorPool, KnownLimitation


class LimitationForm(forms.ModelForm):
    """A person's note: title, severity, pool (blank: all pools), status and Markdown body."""

    class Meta:
        model = KnownLimitation
        fields = ("title", "severity", "pool", "status", "body")
        widgets = {"body": forms.Textarea(attrs={"rows": 6, "cols": 80})}
        help_texts = {
            "body": "Markdown: lists, code, links and tables; raw HTML is shown as text.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        pool = self.fields["pool"]
        pool.queryset = AcceleratorPool.objects.order_by("name")
        pool.empty_label = "All pools"
        pool.help_text = "The pool it applies to; blank: every pool."


class LimitationStatusForm(forms.ModelForm):
    """What people may change on a note a stage raised: its status."""

    class Meta:
        model = KnownLimitation
        fields = ("status",)

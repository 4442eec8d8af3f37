"""The managers' pages: `/reports/` (a period's releases, summary figures and chart),
`/reports/releases.csv` (the same table) and `/reports/readiness` (releases x pools).

Read-only, for every role that reads jobs (`adaptation.view_adaptationjob`: managers,
engineers, admins); anonymous visitors go to the login page, a signed-in user without the
permission gets 403. Rows are read by `adaptation.selectors.reports`, in a fixed number of
queries, reduced to figures by `adaptation.domain.reports` (as the weekly summary is) and
shaped for the page, the CSV and the board by `adaptation.presenters.reports`.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta
from urllib.parse import urlencode

from django import forms
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from adaptation.charts import reports as report_charts
from adaptation.charts.cache import cached_figure
from adaptation.domain import reports as report_figures
from adaptation.models import AcceleratorPool
from adaptation.presenters import reports
from adaptation.selectors import reports as report_selectors
from adaptation.selectors.reports import ReportQuery
from adaptation.views.access import VIEW_JOBS, permission_required

# The time-to-Day-0 chart, drawn once per set of points (`charts.cache`: keyed by a digest of
# them and of the chart code, so never stale); plotly's validation of a figure of a thousand
# points costs more than the rest of the page.
time_to_day0_chart = cached_figure(report_charts.time_to_day0)

# Releases per page of the report's table (the summary, the chart and the CSV cover them all).
REPORT_ROWS_PER_PAGE = 50
# The longest period a report may cover.
MAX_PERIOD_DAYS = 3660


class ReportForm(forms.Form):
    """A report's period (UTC dates, inclusive; default the last 30 days) and pools (by
    name; none chosen: every pool), from the query string."""

    date_from = forms.DateField(
        required=False, label="From", widget=forms.DateInput(attrs={"type": "date"})
    )
    date_to = forms.DateField(
        required=False, label="To", widget=forms.DateInput(attrs={"type": "date"})
    )
    pools = forms.ModelMultipleChoiceField(
        queryset=AcceleratorPool.objects.order_by("name"),
        to_field_name="name",
        required=False,
        label="Pools",
        help_text="None chosen: every pool.",
        widget=forms.SelectMultiple(attrs={"size": 4}),
    )

    def clean(self) -> dict:
        data = super().clean()
        today = datetime.now(UTC).date()
        date_to = data.get("date_to") or today
        date_from = data.get("date_from") or date_to - timedelta(
            days=report_selectors.DEFAULT_PERIOD_DAYS - 1
        )
        if date_from > date_to:
            raise forms.ValidationError("The period's start comes after its end.")
        if date_to >= date.max - timedelta(days=1):  # the period ends at date_to + 1 day
            raise forms.ValidationError(f"The period must end before {date.max.isoformat()}.")
        if (date_to - date_from).days >= MAX_PERIOD_DAYS:
            raise forms.ValidationError(f"A report covers {MAX_PERIOD_DAYS} days at most.")
        data["date_from"], data["date_to"] = date_from, date_to
        return data

    def query(self) -> ReportQuery:
        """The report query of a valid form."""
        pools = tuple(sorted(pool.name for pool in self.cleaned_data.get("pools") or []))
        return ReportQuery(
            date_from=self.cleaned_data["date_from"],
            date_to=self.cleaned_data["date_to"],
            pools=pools,
        )


def _form(request: HttpRequest) -> tuple[ReportForm, ReportQuery | None]:
    """The form bound to the query string (unbound values take the defaults), and its query,
    or None when the parameters are invalid."""
    params = request.GET.copy()
    params.pop("page", None)
    form = ReportForm(params)
    if not form.is_valid():
        return form, None
    query = form.query()
    # The inputs show the period the report covers, defaults included.
    params["date_from"], params["date_to"] = query.date_from.isoformat(), query.date_to.isoformat()
    form.data = params
    return form, query


def _with_throughputs(query: ReportQuery, rows: Iterable[report_figures.ReleaseRow]) -> None:
    """Each row's full-size throughput (measured on the engine where it was, else predicted),
    read for these rows only: three queries."""
    rows = list(rows)
    measured, predicted = report_selectors.full_size_throughputs(
        query, [row.release_id for row in rows]
    )
    report_figures.with_throughputs(rows, report_figures.throughputs(measured, predicted))


def _url(name: str, query: ReportQuery, **extra: str) -> str:
    return f"{reverse(name)}?{urlencode([*query.params(), *extra.items()])}"


@permission_required(VIEW_JOBS)
@require_GET
def report(request: HttpRequest) -> HttpResponse:
    """The releases of a period and pools: per release its status, readiness, time to detect,
    time to Day-0, failed stages with why, open limitations; the summary figures and the
    time-to-Day-0 chart. Bad parameters answer 400 with the form's errors."""
    form, query = _form(request)
    if query is None:
        return render(request, "adaptation/reports.html", {"form": form}, status=400)
    result = report_figures.release_report(report_selectors.report_rows(query))
    page = Paginator(result.rows, REPORT_ROWS_PER_PAGE).get_page(request.GET.get("page"))
    _with_throughputs(query, page.object_list)
    context = {
        "form": form,
        "report": result,
        "page": page,
        "chart": time_to_day0_chart(reports.chart_points(result.rows)),
        "csv_url": _url("adaptation:report_csv", query),
        "readiness_url": _url("adaptation:report_readiness", query),
        "page_params": urlencode(query.params()),
        "within_h": report_figures.WITHIN_S // 3600,
    }
    return render(request, "adaptation/reports.html", context)


@permission_required(VIEW_JOBS)
@require_GET
def report_csv(request: HttpRequest) -> HttpResponse:
    """The report's table as CSV, every release of the period (`reports.CSV_COLUMNS`), with
    the numbers the page prints. Bad parameters answer 400."""
    form, query = _form(request)
    if query is None:
        errors = "; ".join(str(error) for errors in form.errors.values() for error in errors)
        return HttpResponse(errors, status=400, content_type="text/plain; charset=utf-8")
    result = report_figures.release_report(report_selectors.report_rows(query))
    _with_throughputs(query, result.rows)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = (
        f'attachment; filename="day0-releases-{_stamp(query.date_from)}-'
        f'{_stamp(query.date_to)}.csv"'
    )
    writer = csv.writer(response, lineterminator="\n")
    writer.writerow(reports.CSV_COLUMNS)
    for row in result.rows:
        writer.writerow(reports.csv_row(row))
    return response


def _stamp(day: date) -> str:
    return day.strftime("%Y%m%d")


@permission_required(VIEW_JOBS)
@require_GET
def report_readiness(request: HttpRequest) -> HttpResponse:
    """The managers' readiness board: a row per release of the period, a column per pool,
    each cell the readiness level, the blocking stage and the time to Day-0, linked to the
    job on the release's page. Bad parameters answer 400."""
    form, query = _form(request)
    if query is None:
        return render(request, "adaptation/readiness_board.html", {"form": form}, status=400)
    rows = report_selectors.readiness_rows(query, page_number=request.GET.get("page") or 1)
    board = reports.readiness_board(rows)
    context = {
        "form": form,
        "board": board,
        "report_url": _url("adaptation:report", query),
        "page_params": urlencode(query.params()),
    }
    return render(request, "adaptation/readiness_board.html", context)

"""How a notification is sent: the body and headers of the request for each subscription
format.

- `generic`: the payload as JSON, signed as the Standard Webhooks specification defines
  (`webhook-id`: the delivery's message id, the same on every retry; `webhook-timestamp`:
  seconds since the epoch of this attempt; `webhook-signature`: `v1,<base64 HMAC-SHA256 of
  "{id}.{timestamp}.{body}">` under the subscription's `whsec_…` secret, made by the
  `standardwebhooks` library).
- `slack`: a Slack-compatible incoming-webhook message, `{"text": ..., "blocks": [...]}`: one
  short mrkdwn line, the error (for a failure; for a regression, a line per figure) and a link
  to the job in day0 (for the weekly summary, its figures and a link to the report). Slack (and
  Mattermost, Rocket.Chat, Teams' Slack-compatible connectors) take it as is; nothing is
  signed, the URL itself is the secret.

Durations are written by the formatters the pages' filters use (`engine.formatting`:
`duration`, `hours_duration`, `ms`), so a time reads the same in a chat message as on the
page it links to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from math import floor
from typing import Any

from standardwebhooks import Webhook

from adaptation.domain.stages import stage_title
from adaptation.models import NotificationEvent, NotificationFormat
from engine.formatting import duration, hours_duration, ms

# Characters of a failure's error quoted in a Slack message (the payload has more).
SLACK_ERROR_MAX_CHARS = 500


@dataclass(frozen=True)
class OutboundMessage:
    """One request's body (bytes) and the headers that go with it."""

    body: bytes
    headers: dict[str, str]


def payload_json(payload: dict[str, Any]) -> str:
    """The payload as compact JSON with sorted keys: the same text on every attempt, whatever
    order the database gives the stored keys back in."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def generic_message(
    *, payload: dict[str, Any], message_id: str, secret: str, timestamp: datetime
) -> OutboundMessage:
    """The JSON body and its Standard Webhooks headers, signed with `secret` ("whsec_…") at
    `timestamp` (an aware datetime; whole seconds are signed). Raises `ValueError` for a
    blank or malformed secret."""
    if not secret:
        raise ValueError("A generic subscription needs its signing secret.")
    body = payload_json(payload)
    moment = timestamp.astimezone(UTC)
    try:
        signature = Webhook(secret).sign(msg_id=message_id, timestamp=moment, data=body)
    except Exception as exc:  # binascii.Error, EmptyWebhookSecretError: a broken stored key
        raise ValueError(f"The signing secret is not a usable whsec_ key: {exc}") from exc
    return OutboundMessage(
        body=body.encode(),
        headers={
            "Content-Type": "application/json",
            "webhook-id": message_id,
            "webhook-timestamp": str(floor(moment.timestamp())),
            "webhook-signature": signature,
        },
    )


def _slack_escape(text: str) -> str:
    """Text for Slack mrkdwn: &, < and > are control characters there."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _short_ref(release: dict[str, Any]) -> str:
    return f"{release.get('repo_id', '?')}@{str(release.get('revision', ''))[:12]}"


def _first_lines(error: str) -> str:
    """The start of an error for a chat message: up to `SLACK_ERROR_MAX_CHARS` characters,
    without the traceback that may follow a blank line."""
    head = error.strip().split("\n\n", 1)[0]
    if len(head) > SLACK_ERROR_MAX_CHARS:
        head = head[:SLACK_ERROR_MAX_CHARS] + "…"
    return head


def weekly_summary_text(data: dict[str, Any]) -> str:
    """The weekly summary in one mrkdwn line: releases, adapted within 24 h, median and p90
    time to Day-0, the stage that failed most, the regressions detected (when any)."""
    period = data.get("period") or {}
    pools = ", ".join(data.get("pools") or []) or "every pool"
    within = data.get("adapted_within_24h_percent")
    text = (
        f":bar_chart: *Weekly Day-0 summary* {period.get('from', '?')} to "
        f"{period.get('to', '?')} ({_slack_escape(pools)}): "
        f"*{data.get('releases_seen', 0)}* releases, "
        f"*{data.get('adapted_within_24h', 0)}* adapted within 24 h"
        f"{f' ({within:g}%)' if within is not None else ''}; time to Day-0 median "
        f"*{hours_duration(data.get('median_time_to_day0_h'))}*, "
        f"p90 *{hours_duration(data.get('p90_time_to_day0_h'))}*"
    )
    failures = data.get("failures_by_stage") or {}
    if failures:
        stage, count = max(failures.items(), key=lambda item: (item[1], item[0]))
        text += f"; most failures at *{_slack_escape(str(stage))}* ({count})"
    regressions = data.get("regressions_detected") or 0
    if regressions:
        jobs = data.get("jobs_regressed") or 0
        text += (
            f"; *{regressions}* regression{'' if regressions == 1 else 's'} detected "
            f"(in {jobs} job{'' if jobs == 1 else 's'})"
        )
    return text


# A regression's figure in a chat message, by its name (the payload's `figure`).
REGRESSION_FIGURE_WORDS = {
    "decode_tokens_per_s": "decode tokens/s at the knee",
    "ttft_p95_s": "TTFT p95 at the knee",
    "relative_logit_error": "relative logit error",
    "max_abs_logprob_diff": "largest log-probability difference from transformers",
    "load_s": "engine load time",
    "duration_s": "duration",
}
# What a figure was measured on, in words (the payload's `measured_on`).
MEASURED_ON_WORDS = {
    "twin": "the twin",
    "release": "the real weights",
    "engine-twin": "the engine serving the twin",
    "engine-release": "the engine serving the real weights",
    "worker": "the worker's clock",
}


def _amount(value: Any, unit: str) -> str:
    """A figure as the regressions panel writes it when it is a time (`unit` "s": "5.21 s",
    "16.4 ms", as `engine.formatting.ms`), else with 4 significant digits and its unit
    ("80 tokens/s", "0.00312"); "?" when it is not a number."""
    if not isinstance(value, int | float):
        return "?"
    if unit == "s":
        return ms(value)
    return f"{value:.4g} {unit}".strip()


def _spread(low: Any, high: Any, unit: str) -> str:
    """The last good runs' spread, "98 to 104 tokens/s"; times each with their unit, as
    `ms` may write the two ends in different units ("850 ms to 1.3 s")."""
    return f"{_amount(low, unit if unit == 's' else '')} to {_amount(high, unit)}"


def regression_line(item: dict[str, Any]) -> str:
    """One regression of a `regression.detected` payload in one plain line: "Fetch & parse
    duration on the worker's clock: 5.21 s, 372.7% worse than the median 1.1 s of 3 runs of
    the same release (1 s to 1.3 s)" (a stage by its title and a time as the pages write
    them)."""
    figure = str(item.get("figure") or "?")
    words = REGRESSION_FIGURE_WORDS.get(figure, figure)
    if figure == "duration_s":
        words = f"{stage_title(str(item.get('stage') or '?'))} {words}"
    on = MEASURED_ON_WORDS.get(str(item.get("measured_on")), str(item.get("measured_on") or "?"))
    at = [str(item["dtype"])] if item.get("dtype") else []
    if item.get("prompt_tokens") is not None:
        at.append(f"{item['prompt_tokens']}-token prompts")
    unit = str(item.get("unit") or "")
    base = item.get("baseline") or {}
    runs = base.get("runs", 0)
    scope = "family" if base.get("scope") == "family" else "release"
    worse_by = item.get("worse_by")
    worse = f"{100 * worse_by:.1f}% worse" if isinstance(worse_by, int | float) else "worse"
    where = f" ({', '.join(at)})" if at else ""
    return (
        f"{words} on {on}{where}: "
        f"{_amount(item.get('value'), unit)}, {worse} than the median "
        f"{_amount(base.get('median'), unit)} of {runs} run{'' if runs == 1 else 's'} of the "
        f"same {scope} ({_spread(base.get('low'), base.get('high'), unit)})"
    )


def regression_text(data: dict[str, Any]) -> tuple[str, str]:
    """(the one-line summary, one line per regression) of a `regression.detected` payload's
    data, in mrkdwn."""
    job = data.get("job") or {}
    items = data.get("regressions") or []
    count = len(items)
    summary = (
        f":chart_with_downwards_trend: Job {job.get('id', '?')} *regressed* "
        f"({count} figure{'' if count == 1 else 's'}): "
        f"*{_slack_escape(_short_ref(data.get('release') or {}))}* on pool "
        f"*{_slack_escape(str(data.get('pool', '?')))}*"
    )
    return summary, "\n".join(_slack_escape(regression_line(item)) for item in items)


def slack_text(payload: dict[str, Any]) -> tuple[str, str, str]:
    """(the one-line summary, the error or "", the link) of a payload, in mrkdwn."""
    event = payload.get("type")
    data = payload.get("data") or {}
    if event == NotificationEvent.REPORT_WEEKLY:
        return weekly_summary_text(data), "", str(data.get("url") or "")
    if event == NotificationEvent.REGRESSION_DETECTED:
        summary, lines = regression_text(data)
        return summary, lines, str((data.get("job") or {}).get("url") or "")
    job = data.get("job") or {}
    release = data.get("release") or {}
    ref = _slack_escape(_short_ref(release))
    pool = _slack_escape(str(data.get("pool", "?")))
    job_id = job.get("id", "?")
    if event == NotificationEvent.STAGE_FAILED:
        stage = data.get("stage") or {}
        summary = (
            f":x: Stage *{_slack_escape(str(stage.get('name', '?')))}* failed "
            f"(attempt {stage.get('attempt', '?')}) for *{ref}* on pool *{pool}* "
            f"(job {job_id}, worker {_slack_escape(str(stage.get('worker_host') or 'unknown'))})"
        )
        error = str(stage.get("error") or "")
        url = str(stage.get("url") or job.get("url") or "")
    elif event == NotificationEvent.JOB_FAILED:
        failed = data.get("failed_stage") or {}
        summary = (
            f":x: Job {job_id} *failed* at *{_slack_escape(str(failed.get('name', '?')))}*: "
            f"*{ref}* on pool *{pool}*"
        )
        error = str(failed.get("error") or "")
        url = str(job.get("url") or "")
    else:
        took = duration(job.get("duration_s")) if job.get("duration_s") is not None else ""
        summary = f":white_check_mark: Job {job_id} *succeeded*: *{ref}* on pool *{pool}*"
        if took:
            summary += f" in {took}"
        error = ""
        url = str(job.get("url") or "")
    return summary, _slack_escape(_first_lines(error)) if error else "", url


def slack_message(*, payload: dict[str, Any]) -> OutboundMessage:
    """The Slack incoming-webhook body for a payload: `text` (the summary, for notifications
    and clients without blocks) and `blocks` (summary, error quoted as code, link)."""
    summary, error, url = slack_text(payload)
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": summary}},
    ]
    if error:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"```{error}```"}})
    if url:
        job_id = ((payload.get("data") or {}).get("job") or {}).get("id", "")
        label = (
            "Open the report in day0"
            if payload.get("type") == NotificationEvent.REPORT_WEEKLY
            else f"Open job {job_id} in day0"
        )
        blocks.append(
            {"type": "context", "elements": [{"type": "mrkdwn", "text": f"<{url}|{label}>"}]}
        )
    text = f"{summary} <{url}|open in day0>" if url else summary
    body = json.dumps({"text": text, "blocks": blocks}, separators=(",", ":"))
    return OutboundMessage(body=body.encode(), headers={"Content-Type": "application/json"})


def render_message(
    *,
    format: str,
    payload: dict[str, Any],
    message_id: str,
    secret: str,
    timestamp: datetime,
) -> OutboundMessage:
    """The request for a subscription's `format` ("generic" or "slack"). Raises
    `ValueError` for an unknown format or an unusable secret."""
    if format == NotificationFormat.GENERIC:
        return generic_message(
            payload=payload, message_id=message_id, secret=secret, timestamp=timestamp
        )
    if format == NotificationFormat.SLACK:
        return slack_message(payload=payload)
    raise ValueError(f"Unknown notification format {format!r}.")

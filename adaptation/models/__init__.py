"""day0's domain: hub watches, model releases, accelerator pools, adaptation jobs and their
stage runs, and what stages and people write about them. Writes go through
`adaptation.services`, reads through `adaptation.selectors`.

One module per entity; Django finds every model through this package, which imports them
all (the Django convention for a models package).
"""

from __future__ import annotations

from adaptation.models.hub_endpoints import AllowedHubEndpoint
from adaptation.models.jobs import (
    ACTIVE_STAGE_STATUSES,
    AdaptationJob,
    AttemptEnd,
    Culprit,
    FailureClass,
    JobStatus,
    Readiness,
    StageRun,
    StageStatus,
)
from adaptation.models.limitations import KnownLimitation, LimitationStatus, Severity
from adaptation.models.notifications import (
    NotificationDelivery,
    NotificationEvent,
    NotificationFormat,
    NotificationSubscription,
    Team,
    default_notification_events,
)
from adaptation.models.pools import (
    DEVICE_PATTERN,
    SERVING_DTYPES,
    AcceleratorKind,
    AcceleratorKindQuerySet,
    AcceleratorPool,
    Worker,
    default_pool_dtypes,
)
from adaptation.models.regressions import BaselineScope, Regression
from adaptation.models.release_notes import ReleaseNotes, ReleaseNotesAdditions
from adaptation.models.releases import HubKind, HubWatch, ModelRelease, Trigger
from adaptation.models.results import LayerDrift, OperatorCheck, PerformancePoint, PrecisionResult
from adaptation.models.suites import StackChange, SuiteRun, SuiteTrigger
from adaptation.models.webhooks import (
    DeliveryVerdict,
    PendingUpload,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookKind,
)

__all__ = [
    "ACTIVE_STAGE_STATUSES",
    "DEVICE_PATTERN",
    "SERVING_DTYPES",
    "AcceleratorKind",
    "AcceleratorKindQuerySet",
    "AcceleratorPool",
    "AdaptationJob",
    "AllowedHubEndpoint",
    "AttemptEnd",
    "BaselineScope",
    "Culprit",
    "DeliveryVerdict",
    "FailureClass",
    "HubKind",
    "HubWatch",
    "JobStatus",
    "KnownLimitation",
    "LayerDrift",
    "LimitationStatus",
    "ModelRelease",
    "NotificationDelivery",
    "NotificationEvent",
    "NotificationFormat",
    "NotificationSubscription",
    "OperatorCheck",
    "PendingUpload",
    "PerformancePoint",
    "PrecisionResult",
    "Readiness",
    "Regression",
    "ReleaseNotes",
    "ReleaseNotesAdditions",
    "Severity",
    "StackChange",
    "StageRun",
    "StageStatus",
    "SuiteRun",
    "SuiteTrigger",
    "Team",
    "Trigger",
    "WebhookDelivery",
    "WebhookEndpoint",
    "WebhookKind",
    "Worker",
    "default_notification_events",
    "default_pool_dtypes",
]

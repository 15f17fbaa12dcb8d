#!/usr/bin/env bash
# The whole check: lint, types, migrations, then the test suite on SQLite and on a
# throw-away PostgreSQL. With CI=true, a PostgreSQL that cannot start is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"

echo "== ruff"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
echo "== mypy"
"$VENV/bin/mypy" ledon jobs outbox sagas testproject
echo "== makemigrations --check"
DATABASE_URL="sqlite:///$(mktemp -d)/check.sqlite3" "$PY" manage.py makemigrations --check --dry-run

echo "== docs (warnings are errors)"
"$VENV/bin/sphinx-build" -W --keep-going -q -b html docs "$(mktemp -d)/docs"

# The admin browser test drives Debian's Chromium; CI installs it when missing.
if [ "${CI:-}" = "true" ] || [ -x /usr/bin/chromium ]; then
    CHROMIUM=$(scripts/ensure-chromium.sh)
    export CHROMIUM
fi

pgdir=""
brokers_dir=""
cleanup() {
    if [ -n "$brokers_dir" ]; then scripts/brokers.sh stop "$brokers_dir" || true; fi
    if [ -n "$pgdir" ]; then scripts/pg.sh stop "$pgdir" || true; fi
}
trap cleanup EXIT

# RabbitMQ and the Kafka-protocol broker for the broker tests, shared by both runs.
# CI installs them when missing and fails if they cannot start; elsewhere the broker
# tests start what is installed themselves, or are skipped.
if [ "${CI:-}" = "true" ]; then
    scripts/brokers.sh install
fi
if [ "${CI:-}" = "true" ] || [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
    brokers_dir=$(mktemp -d /tmp/ledon-brokers.XXXXXX)
    started=$(date +%s)
    if addresses=$(scripts/brokers.sh start "$brokers_dir"); then
        while IFS= read -r line; do export "${line?}"; done <<<"$addresses"
        export BROKERS_DIR=$brokers_dir
        echo "== brokers started in $(($(date +%s) - started)) s: $(echo $addresses)"
    elif [ "${CI:-}" = "true" ]; then
        echo "error: the message brokers could not be started and CI=true: failing" >&2
        exit 1
    else
        echo "warning: the message brokers could not be started; broker tests may skip" >&2
        brokers_dir=""
    fi
fi

status=0
echo "== tests on SQLite"
DATABASE_URL="sqlite:///$(mktemp -d)/ledon.sqlite3" "$PY" -m pytest "$@" || status=$?
[ "$status" = 5 ] && { echo "error: no tests ran on SQLite" >&2; exit 1; }

pgdir=$(mktemp -d /tmp/ledon-pg.XXXXXX)
if url=$(scripts/pg.sh start "$pgdir"); then
    echo "== tests on PostgreSQL ($url)"
    pg_status=0
    DATABASE_URL="$url" "$PY" -m pytest "$@" || pg_status=$?
    [ "$pg_status" = 5 ] && { echo "error: no tests ran on PostgreSQL" >&2; exit 1; }
    [ "$pg_status" != 0 ] && status=$pg_status
else
    if [ "${CI:-}" = "true" ]; then
        echo "error: PostgreSQL could not be started and CI=true: failing" >&2
        exit 1
    fi
    echo "warning: PostgreSQL could not be started; PostgreSQL tests NOT run" >&2
fi
exit "$status"

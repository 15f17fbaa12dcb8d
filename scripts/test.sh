#!/usr/bin/env bash
# The whole check: lint, types, migrations, docs, then the test suite on SQLite and on
# a throw-away PostgreSQL, on every CI leg (a Python version and a Django version).
#
#   scripts/test.sh                      every leg
#   scripts/test.sh --leg 3.12           the legs of Python 3.12 only (make test LEG=3.12)
#   scripts/test.sh -k worker -x         pytest arguments are passed on to every run
#
# With CI=true, a Python, PostgreSQL or broker that cannot be had is a failure, never
# a skip. PYTEST_WORKERS (default 2) sets pytest-xdist's processes per run.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"

# The CI legs, one per line: Python version, Django requirement ("-": the range in
# pyproject.toml), and which tests run. "all" is the whole suite; "core" is every
# test that starts real processes plus the fast part of the suite, leaving out only
# the browser test and the benchmark smoke test (the primary leg runs those).
# A Django leg is one more line, e.g. "3.13 ~=5.2.0 core".
LEGS=(
    "3.13 - all"
    "3.12 - core"
)
CORE_DESELECT=(--ignore=tests/test_admin_browser.py --ignore=tests/test_bench_smoke.py)

only_leg=""
pytest_args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --leg)
        only_leg=${2:?--leg needs a Python version, e.g. --leg 3.12}
        shift 2
        ;;
    *)
        pytest_args+=("$1")
        shift
        ;;
    esac
done

started_all=$(date +%s)
step() { echo "== $* (at $(($(date +%s) - started_all)) s)"; }

step "ruff"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
step "mypy"
"$VENV/bin/mypy" ledon jobs outbox sagas testproject
step "import contracts (pyproject.toml [tool.importlinter])"
"$VENV/bin/lint-imports" --no-logo --no-cache
step "makemigrations --check"
DATABASE_URL="sqlite:///$(mktemp -d)/check.sqlite3" "$PY" manage.py makemigrations --check --dry-run

step "docs (warnings are errors)"
"$VENV/bin/sphinx-build" -W --keep-going -q -b html docs "$(mktemp -d)/docs"

# The admin browser test drives Debian's Chromium; CI installs it when missing.
if [ "${CI:-}" = "true" ] || [ -x /usr/bin/chromium ]; then
    CHROMIUM=$(scripts/ensure-chromium.sh)
    export CHROMIUM
fi

pgdir=""
brokers_dir=""
wheel_cache=$(mktemp -d /tmp/ledon-wheel.XXXXXX)
cleanup() {
    if [ -n "$brokers_dir" ]; then scripts/brokers.sh stop "$brokers_dir" || true; fi
    if [ -n "$pgdir" ]; then scripts/pg.sh stop "$pgdir" || true; fi
    rm -rf "$wheel_cache"
}
trap cleanup EXIT
# The wheel test's virtualenv, built once and shared by the runs of a leg.
export LEDON_WHEEL_CACHE=$wheel_cache

# RabbitMQ and the Kafka-protocol broker for the broker tests, shared by every run.
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

# One throw-away PostgreSQL for every leg (each run creates its own test databases).
pg_url=""
pgdir=$(mktemp -d /tmp/ledon-pg.XXXXXX)
if ! pg_url=$(scripts/pg.sh start "$pgdir"); then
    if [ "${CI:-}" = "true" ]; then
        echo "error: PostgreSQL could not be started and CI=true: failing" >&2
        exit 1
    fi
    echo "warning: PostgreSQL could not be started; PostgreSQL tests NOT run" >&2
    pg_url=""
fi

python_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true; }

# The virtualenv of a leg: .venv when it is that Python with pyproject's Django,
# else .venv-py<version>[-django<requirement>], created (or updated) by make.
leg_venv() {
    local version=$1 django=$2
    if [ "$django" = "-" ] && [ "$(python_of "$PY")" = "$version" ]; then
        echo "$VENV"
        return
    fi
    local name=".venv-py$version"
    [ "$django" != "-" ] && name="$name-django$(echo "$django" | tr -c 'A-Za-z0-9.\n' '_')"
    local spec=""
    [ "$django" != "-" ] && spec=$django
    make --no-print-directory venv VENV="$name" PYTHON_VERSION="$version" DJANGO="$spec" >&2
    echo "$name"
}

status=0
ran=0
run_suite() { # leg-name python database-name database-url pytest-args...
    local leg=$1 python=$2 db=$3 url=$4
    shift 4
    step "tests on $db, leg $leg"
    local code=0
    DATABASE_URL="$url" "$python" -m pytest -p no:cacheprovider "$@" || code=$?
    if [ "$code" = 5 ]; then
        echo "error: no tests ran on $db, leg $leg" >&2
        exit 1
    fi
    [ "$code" != 0 ] && status=$code
    return 0
}

for leg in "${LEGS[@]}"; do
    read -r version django scope <<<"$leg"
    if [ -n "$only_leg" ] && [ "$only_leg" != "$version" ]; then
        continue
    fi
    name="python $version, django ${django/-/as in pyproject.toml}, $scope"
    if ! scripts/find-python.sh "$version" >/dev/null; then
        if [ "${CI:-}" = "true" ]; then
            echo "error: no Python $version for the leg '$name' and CI=true: failing" >&2
            exit 1
        fi
        echo "warning: no Python $version: leg '$name' NOT run" >&2
        continue
    fi
    step "leg: $name"
    venv=$(leg_venv "$version" "$django")
    if [ "${CI:-}" = "true" ] && [ "$venv" != "$VENV" ]; then
        VENV=$venv scripts/brokers.sh install
    fi
    python="$venv/bin/python"
    args=(-n "${PYTEST_WORKERS:-2}" --dist loadgroup)
    [ "$scope" = "core" ] && args+=("${CORE_DESELECT[@]}")
    args+=(${pytest_args[@]+"${pytest_args[@]}"})
    run_suite "$version" "$python" SQLite "sqlite:///$(mktemp -d)/ledon.sqlite3" "${args[@]}"
    if [ -n "$pg_url" ]; then
        run_suite "$version" "$python" PostgreSQL "$pg_url" "${args[@]}"
    fi
    ran=$((ran + 1))
done
if [ "$ran" = 0 ]; then
    echo "error: no leg ran (--leg ${only_leg:-?}; legs: ${LEGS[*]})" >&2
    exit 1
fi
step "done, exit status $status"
exit "$status"

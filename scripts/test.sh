#!/usr/bin/env bash
# The whole check: lint, types, docs, then on every CI leg (a Python version and a
# Django version) the migrations check and the test suite on SQLite and on a
# throw-away PostgreSQL.
#
#   scripts/test.sh                      every leg
#   scripts/test.sh --leg 3.12           the legs of Python 3.12 (make test LEG=3.12)
#   scripts/test.sh --leg 3.12-5.2       one leg: Python 3.12 with Django 5.2
#   scripts/test.sh -k worker -x         pytest arguments are passed on to every run
#
# With CI=true, a Python, PostgreSQL, PgBouncer or broker that cannot be had is a
# failure, never a skip. PYTEST_WORKERS (default 4) sets pytest-xdist's processes
# per run.
set -euo pipefail
cd "$(dirname "$0")/.."
# Bytecode is written: an environment that turns it off (PYTHONDONTWRITEBYTECODE, as
# some containers do) makes every pytest-xdist worker rewrite and compile every test
# module again (about 6 CPU-seconds a worker, 9 instead of 3 for the collection), and
# every child process compile the project's modules.
unset PYTHONDONTWRITEBYTECODE
VENV=${VENV:-.venv}
PY="$VENV/bin/python"

# The CI legs, one per line: Python version, Django version (a feature release: the
# leg installs its newest patch release), and which tests run. "all" is the whole
# suite, on the newest combination. "core", on every other leg, is the fast part of
# the suite (every test not marked slow) and every test that starts real processes
# (marked slow), on SQLite and on PostgreSQL. It leaves out five tests that exercise
# no Django or Python difference the rest misses (docs/compatibility.md): the chaos
# run's short profile (tests/processes/test_chaos.py: a minute and a half of both
# cores through the code paths that the fault tests of tests/processes/ take on every
# leg) and the failover's smoke (tests/processes/test_failover.py: a primary and a
# standby, a minute; to the engines a failover is the outage those tests make), and
# three that start no process: the admin's browser test, the benchmarks'
# smoke test, and the plan test at a million rows (tests/ledon/test_observability_cost.py: PostgreSQL's
# plans of the observability queries, whose SQL is the same on every supported Django;
# loading its three million rows is a minute of the server's CPU). Its SIGTERM
# soaks stop each engine fewer times (CORE_SOAK_RUNS). On a "core" leg the jobs-alone test
# (tests/jobs/test_jobs_alone.py, a pytest of its own with outbox and sagas not
# installed) runs the part of the jobs core that goes through code which differs
# between versions (LEDON_JOBS_ALONE=versions: the tasks framework and the worker
# command); the rest of that core runs the same code on every leg, the import
# contracts (lint-imports, above, read the source of every branch) say that none of
# it imports outbox or sagas, and the newest leg runs the whole core alone.
# "compat" is a quick look at one leg, the tests of what differs between Django and
# Python versions (COMPAT_TESTS): the tasks framework and its backport, the admin,
# the checks and settings, threads and signals, the worker command; in and out of
# real processes (SCOPE=compat: on every older leg).
LEGS=(
    "3.13 6.1 all"
    "3.12 5.2 core"
    "3.13 6.0 core"
    "3.12 6.1 core"
)
CORE_DESELECT=(
    --ignore=tests/processes/test_chaos.py
    --ignore=tests/processes/test_failover.py
    --ignore=tests/test_admin_browser.py
    --ignore=tests/test_bench_smoke.py
    --ignore=tests/ledon/test_observability_cost.py
)
# The SIGTERM soaks of tests/processes/test_engine_processes.py on a "core" leg: 25 runs of
# run_jobs (10 of the outbox's and of the sagas' engines), against 100 (and 40) on
# the newest leg.
CORE_SOAK_RUNS=25
COMPAT_TESTS=(
    tests/jobs/test_tasks_backend.py
    tests/processes/test_tasks_backend_processes.py
    tests/jobs/test_jobs_admin.py
    tests/outbox/test_outbox_admin.py
    tests/sagas/test_sagas_admin.py
    tests/jobs/test_schedules_admin.py
    tests/test_settings_checks.py
    tests/ledon/test_pooler_checks.py
    tests/ledon/test_threads.py
    tests/ledon/test_engine_base.py
    tests/jobs/test_run_jobs_command.py
)

only_leg=""
pytest_args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --leg)
        only_leg=${2:?--leg needs a Python version or a leg, e.g. --leg 3.12 or --leg 3.12-5.2}
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

python_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true; }
django_of() { "$1" -c 'import django; print("%d.%d" % django.VERSION[:2])' 2>/dev/null || true; }

# The virtualenv of a leg: .venv when it has that Python and that Django, else
# .venv-py<python>-dj<django>, made (or updated) by make with the leg's Django and the
# extras its tests need (the django-tasks backport below Django 6).
leg_venv_name() {
    local version=$1 django=$2
    if [ "$(python_of "$PY")" = "$version" ] && [ "$(django_of "$PY")" = "$django" ]; then
        echo "$VENV"
    else
        echo ".venv-py$version-dj$django"
    fi
}
make_leg_venv() {
    local version=$1 django=$2 name
    name=$(leg_venv_name "$version" "$django")
    [ "$name" = "$VENV" ] && return 0
    # What the suite needs to run (no lint tools, no browser driver: the main
    # virtualenv runs those once).
    local extras="test-run,brokers-test"
    [ "${django%%.*}" -lt 6 ] && extras="$extras,tasks-backport"
    make --no-print-directory venv VENV="$name" PYTHON_VERSION="$version" \
        DJANGO="~=$django.0" EXTRAS="$extras"
}

selected() { [ -z "$only_leg" ] || [ "$only_leg" = "$1" ] || [ "$only_leg" = "$1-$2" ]; }

pgdir=""
brokers_dir=""
venv_builder=""
venv_logs=$(mktemp -d /tmp/ledon-venvs.XXXXXX)
wheel_cache=$(mktemp -d /tmp/ledon-wheel.XXXXXX)
cleanup() {
    if [ -n "$venv_builder" ]; then kill "$venv_builder" 2>/dev/null || true; fi
    rm -rf "$venv_logs"
    if [ -n "$brokers_dir" ]; then scripts/brokers.sh stop "$brokers_dir" || true; fi
    if [ -n "$pgdir" ]; then scripts/pg.sh stop "$pgdir" || true; fi
    rm -rf "$wheel_cache"
}
trap cleanup EXIT

# The legs' virtualenvs are made in the background, one after the other, while lint,
# types, docs and the first leg run; each leg waits for its own. A leg whose Python
# is missing is reported when its turn comes.
(
    for leg in "${LEGS[@]}"; do
        read -r version django _ <<<"$leg"
        selected "$version" "$django" || continue
        scripts/find-python.sh "$version" >/dev/null 2>&1 || continue
        log="$venv_logs/$version-$django"
        if make_leg_venv "$version" "$django" >"$log.log" 2>&1; then touch "$log.ok"; else touch "$log.failed"; fi
    done
) &
venv_builder=$!

step "ruff"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
step "mypy"
"$VENV/bin/mypy" ledon jobs outbox sagas workflows testproject
step "import contracts (pyproject.toml [tool.importlinter])"
"$VENV/bin/lint-imports" --no-logo --no-cache
step "docs (warnings are errors)"
"$VENV/bin/sphinx-build" -W --keep-going -q -b html docs "$(mktemp -d)/docs"

# The admin browser test drives Debian's Chromium; CI installs it when missing.
if [ "${CI:-}" = "true" ] || [ -x /usr/bin/chromium ]; then
    CHROMIUM=$(scripts/ensure-chromium.sh)
    export CHROMIUM
fi

# The wheel test's virtualenv, built once and shared by the runs of a leg.
export LEDON_WHEEL_CACHE=$wheel_cache

# RabbitMQ and the Kafka-protocol broker for the broker tests, shared by every run.
# CI installs them when missing and fails if they cannot start; elsewhere the broker
# tests start what is installed themselves, or are skipped.
if [ "${CI:-}" = "true" ]; then
    scripts/brokers.sh install
    # PgBouncer for the pooler tests (tests/processes/test_pgbouncer.py starts its own; with
    # CI=true its absence fails them).
    scripts/pgbouncer.sh install
    # libfaketime (Debian's faketime) for the clock-skew test
    # (tests/processes/test_clock_skew.py; with CI=true its absence fails it).
    if ! compgen -G "/usr/lib/*/faketime/libfaketimeMT.so.1" >/dev/null; then
        echo "installing Debian's faketime for the clock-skew test" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq --no-install-recommends faketime >&2 \
            || { apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends faketime >&2; }
    fi
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

status=0
ran=0
leg_times=()
# CPU seconds (user + system) of this script's finished children so far, into
# $cpu_now: the test runs' own, not the PostgreSQL server's or the brokers'. (The
# builtin runs in this shell, not in a subshell, whose children are not these.)
cpu_now=0
children_cpu() {
    times >"$venv_logs/times"
    cpu_now=$(awk 'function sec(t,  m) {
        m = substr(t, 1, index(t, "m") - 1); sub(/^[0-9]+m/, "", t); sub(/s$/, "", t)
        return m * 60 + t } NR == 2 { printf "%d", sec($1) + sec($2) }' "$venv_logs/times")
}
# CPU seconds of the PostgreSQL server so far, into $pg_cpu_now: the postmaster's own,
# its ended backends' (counted into it as they are reaped) and its live children's.
pg_cpu_now=0
pg_server_cpu() {
    pg_cpu_now=0
    [ -n "$pgdir" ] && [ -e "$pgdir/data/postmaster.pid" ] || return 0
    pg_cpu_now=$(python3 - "$(head -n 1 "$pgdir/data/postmaster.pid")" <<'PY'
import os, sys
postmaster, ticks, total = int(sys.argv[1]), os.sysconf("SC_CLK_TCK"), 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        continue
    if int(pid) == postmaster:
        total += sum(int(v) for v in fields[11:15])
    elif int(fields[1]) == postmaster:
        total += int(fields[11]) + int(fields[12])
print(total // ticks)
PY
    )
}
run_suite() { # leg-name python database-name database-url pytest-args...
    local leg=$1 python=$2 db=$3 url=$4
    shift 4
    step "tests on $db, leg $leg"
    local code=0 started cpu
    started=$(date +%s)
    children_cpu
    cpu=$cpu_now
    pg_server_cpu
    local pg_cpu=$pg_cpu_now
    DATABASE_URL="$url" LEDON_JOBS_ALONE=$jobs_alone LEDON_SOAK_RUNS=$soak_runs \
        "$python" -m pytest -p no:cacheprovider "$@" \
        || code=$?
    children_cpu
    pg_server_cpu
    local server=""
    [ "$db" = PostgreSQL ] && server=", server $((pg_cpu_now - pg_cpu)) s"
    run_times="$run_times; $db $(($(date +%s) - started)) s (CPU $((cpu_now - cpu)) s$server)"
    if [ "$code" = 5 ]; then
        echo "error: no tests ran on $db, leg $leg" >&2
        exit 1
    fi
    [ "$code" != 0 ] && status=$code
    return 0
}

for leg in "${LEGS[@]}"; do
    read -r version django scope <<<"$leg"
    selected "$version" "$django" || continue
    [ "$scope" != "all" ] && [ -n "${SCOPE:-}" ] && scope=$SCOPE
    name="python $version, django $django, $scope"
    if ! scripts/find-python.sh "$version" >/dev/null; then
        if [ "${CI:-}" = "true" ]; then
            echo "error: no Python $version for the leg '$name' and CI=true: failing" >&2
            exit 1
        fi
        echo "warning: no Python $version: leg '$name' NOT run" >&2
        continue
    fi
    step "leg: $name"
    leg_started=$(date +%s)
    run_times=""
    log="$venv_logs/$version-$django"
    while [ ! -e "$log.ok" ] && [ ! -e "$log.failed" ] && kill -0 "$venv_builder" 2>/dev/null; do
        sleep 1
    done
    if [ ! -e "$log.ok" ]; then
        cat "$log.log" >&2 2>/dev/null || true
        echo "error: the virtualenv of the leg '$name' could not be made" >&2
        exit 1
    fi
    venv=$(leg_venv_name "$version" "$django")
    python="$venv/bin/python"
    if [ "$(django_of "$python")" != "$django" ]; then
        echo "error: $venv has Django $(django_of "$python"), not $django" >&2
        exit 1
    fi
    if [ "${CI:-}" = "true" ] && [ "$venv" != "$VENV" ]; then
        VENV=$venv scripts/brokers.sh install
    fi
    step "makemigrations --check, leg $version-$django"
    DATABASE_URL="sqlite:///$(mktemp -d)/check.sqlite3" "$python" manage.py makemigrations --check --dry-run
    args=(-n "${PYTEST_WORKERS:-4}" --dist loadgroup)
    jobs_alone=all
    soak_runs=100
    if [ "$scope" = "core" ]; then
        args+=("${CORE_DESELECT[@]}")
        jobs_alone=versions
        soak_runs=$CORE_SOAK_RUNS
    fi
    [ "$scope" = "compat" ] && args+=("${COMPAT_TESTS[@]}")
    args+=(${pytest_args[@]+"${pytest_args[@]}"})
    run_suite "$version-$django" "$python" SQLite "sqlite:///$(mktemp -d)/ledon.sqlite3" "${args[@]}"
    if [ -n "$pg_url" ]; then
        run_suite "$version-$django" "$python" PostgreSQL "$pg_url" "${args[@]}"
    fi
    ran=$((ran + 1))
    leg_times+=("$version-$django $scope: $(($(date +%s) - leg_started)) s$run_times")
done
wait "$venv_builder" || true
if [ "$ran" = 0 ]; then
    echo "error: no leg ran (--leg ${only_leg:-?}; legs: ${LEGS[*]})" >&2
    exit 1
fi
for line in "${leg_times[@]}"; do echo "== leg $line"; done
children_cpu
echo "== CPU of this check's processes (user + system, the servers' left out): $cpu_now s"
step "done, exit status $status"
exit "$status"

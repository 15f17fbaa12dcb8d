#!/usr/bin/env bash
# A throw-away PgBouncer in transaction pooling mode in front of a PostgreSQL server,
# for the tests that run the engines through a pooler (docs/deployment.md).
#   scripts/pgbouncer.sh start DIR PG_HOST PG_PORT  -> prints the port it listens on
#   scripts/pgbouncer.sh stop DIR
#   scripts/pgbouncer.sh install   (CI, as root) Debian's pgbouncer when it is missing
# Every database name is passed through to the server (so each test database is
# reachable), with trust authentication for the user `postgres`, few server
# connections per database (clients really share them) and everything inside DIR.
# Runs as the `postgres` user when invoked as root (PgBouncer refuses root).
# PGBOUNCER overrides the binary (default: Debian's /usr/sbin/pgbouncer).
set -euo pipefail

usage="usage: pgbouncer.sh start DIR PG_HOST PG_PORT | pgbouncer.sh stop DIR | pgbouncer.sh install"
cmd=${1:?$usage}
bin=${PGBOUNCER:-/usr/sbin/pgbouncer}

if [ "$cmd" = install ]; then
    [ -x "$bin" ] && exit 0
    if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "error: PgBouncer not found at $bin, and apt-get as root is not available" >&2
        exit 1
    fi
    echo "installing Debian's pgbouncer for the pooler tests" >&2
    export DEBIAN_FRONTEND=noninteractive
    # The package's own service is not wanted (the tests start theirs): no daemon
    # starts while it installs.
    policy=/usr/sbin/policy-rc.d
    own_policy=""
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && own_policy=1
    fi
    apt-get install -y -qq --no-install-recommends pgbouncer >&2 \
        || { apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends pgbouncer >&2; } \
        || true
    [ -n "$own_policy" ] && rm -f "$policy"
    [ -x "$bin" ] || { echo "error: PgBouncer could not be installed" >&2; exit 1; }
    exit 0
fi
dir=${2:?$usage}

as_owner() {
    if [ "$(id -u)" = "0" ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "$cmd" in
start)
    host=${3:?$usage}
    pg_port=${4:?$usage}
    if [ ! -x "$bin" ]; then
        echo "error: PgBouncer not found at $bin (Debian: apt-get install pgbouncer; or set PGBOUNCER)" >&2
        exit 1
    fi
    mkdir -p "$dir"
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    echo '"postgres" ""' >"$dir/userlist.txt"
    cat >"$dir/pgbouncer.ini" <<EOF
[databases]
* = host=$host port=$pg_port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
admin_users = postgres
pool_mode = transaction
default_pool_size = 5
max_client_conn = 500
ignore_startup_parameters = extra_float_digits
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
    [ "$(id -u)" = "0" ] && chown -R postgres "$dir"
    as_owner "$bin" -d "$dir/pgbouncer.ini" >"$dir/start.log" 2>&1 \
        || { cat "$dir/start.log" "$dir/pgbouncer.log" >&2 2>/dev/null; exit 1; }
    for _ in $(seq 100); do
        if python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 0.2).close()" 2>/dev/null; then
            echo "$port"
            exit 0
        fi
        sleep 0.1
    done
    echo "error: PgBouncer did not listen on port $port:" >&2
    cat "$dir/pgbouncer.log" >&2 2>/dev/null || true
    exit 1
    ;;
stop)
    if [ -s "$dir/pgbouncer.pid" ]; then
        pid=$(cat "$dir/pgbouncer.pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -rf "$dir"
    ;;
*)
    echo "$usage" >&2
    exit 2
    ;;
esac

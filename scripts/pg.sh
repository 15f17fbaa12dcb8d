#!/usr/bin/env bash
# Throw-away PostgreSQL cluster for tests, demos and benchmarks.
#   scripts/pg.sh start DIR   -> prints a postgres:// URL on stdout
#   scripts/pg.sh stop DIR
#   scripts/pg.sh crash DIR   -> stops the server at once (-m immediate), as a crash would
#   scripts/pg.sh restart DIR -> starts a crashed or stopped server again, on its port
#   scripts/pg.sh standby PRIMARY_DIR DIR -> a streaming standby of PRIMARY_DIR's server
#                             (pg_basebackup), started on a port of its own; prints its URL.
#                             PG_PRIMARY_PORT: reach the primary there (a proxy) instead
#   scripts/pg.sh promote DIR -> promotes the standby of DIR to a primary (waits for it)
# PG_FSYNC / PG_SYNC_COMMIT (default off) set durability; PG_EXTRA_OPTS adds server
# options ("-c name=value …") to start and restart.
# Runs the server as the `postgres` user when invoked as root (initdb refuses root),
# listens on a free loopback port, and keeps everything inside DIR.
set -euo pipefail

usage="usage: pg.sh start|stop|crash|restart|promote DIR | pg.sh standby PRIMARY_DIR DIR"
cmd=${1:?$usage}
dir=${2:?$usage}

find_bindir() {
    if [ -n "${PG_BINDIR:-}" ]; then echo "$PG_BINDIR"; return; fi
    for d in /usr/lib/postgresql/*/bin; do
        [ -x "$d/initdb" ] && { echo "$d"; }
    done | sort -V | tail -n 1
}

as_owner() {
    if [ "$(id -u)" = "0" ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# A free port on the loopback interface.
free_port() {
    python3 - <<'PY'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
PY
}

# Start the server of DIR on PORT (and wait until it accepts connections).
start_server() {
    local bindir=$1 port=$2
    as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=200 -c fsync=${PG_FSYNC:-off} -c synchronous_commit=${PG_SYNC_COMMIT:-off} -c full_page_writes=${PG_FSYNC:-off} ${PG_EXTRA_OPTS:-}" \
        start >"$dir/pg_ctl.log" 2>&1 || { cat "$dir/pg_ctl.log" "$dir/server.log" >&2; exit 1; }
}

case "$cmd" in
start)
    bindir=$(find_bindir)
    if [ -z "$bindir" ]; then
        echo "error: PostgreSQL server binaries not found (looked in /usr/lib/postgresql/*/bin; set PG_BINDIR)" >&2
        exit 1
    fi
    mkdir -p "$dir"
    if [ "$(id -u)" = "0" ]; then
        id postgres >/dev/null 2>&1 || { echo "error: running as root but no 'postgres' user exists" >&2; exit 1; }
        chown postgres "$dir"
    fi
    port=$(free_port)
    as_owner "$bindir/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    start_server "$bindir" "$port"
    echo "$port" >"$dir/port"
    "$bindir/createdb" -h 127.0.0.1 -p "$port" -U postgres ledon
    echo "postgres://postgres@127.0.0.1:$port/ledon"
    ;;
stop)
    bindir=$(find_bindir)
    if [ -d "$dir/data" ]; then
        as_owner "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$dir"
    ;;
crash)
    as_owner "$(find_bindir)/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null
    ;;
restart)
    start_server "$(find_bindir)" "$(cat "$dir/port")"
    ;;
standby)
    # DIR is the standby's; the primary's directory came first.
    primary=$dir
    dir=${3:?$usage}
    bindir=$(find_bindir)
    mkdir -p "$dir"
    [ "$(id -u)" = "0" ] && chown postgres "$dir"
    # -R: standby.signal and primary_conninfo; -X stream: the WAL of the copy itself;
    # --checkpoint=fast: the copy starts at once, not after a checkpoint spread over
    # minutes (the primary's buffers, dirtied by migrate, are written at full speed).
    as_owner "$bindir/pg_basebackup" -h 127.0.0.1 -p "${PG_PRIMARY_PORT:-$(cat "$primary/port")}" -U postgres \
        -D "$dir/data" -R -X stream --no-sync --checkpoint=fast >"$dir/basebackup.log" 2>&1 \
        || { cat "$dir/basebackup.log" >&2; exit 1; }
    port=$(free_port)
    start_server "$bindir" "$port"
    echo "$port" >"$dir/port"
    echo "postgres://postgres@127.0.0.1:$port/ledon"
    ;;
promote)
    as_owner "$(find_bindir)/pg_ctl" -D "$dir/data" -w -t 60 promote >/dev/null
    ;;
*)
    echo "$usage" >&2
    exit 2
    ;;
esac

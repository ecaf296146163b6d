#!/usr/bin/env bash
# A local Narad cluster for development: N nodes on 127.0.0.1.
#
#   ops/dev-cluster.sh start [--nodes N]   # default 3; waits until every node is ready
#   ops/dev-cluster.sh status
#   ops/dev-cluster.sh stop                # SIGTERM, then waits for each node to exit
#
# Node i (1..N) gets node id i, client port 8080+i (http://127.0.0.1:808i),
# peer port 9080+i, one shard, a 64 MiB WAL ring and the shared cluster
# secret `narad-dev`. Its data folder, log and pid file are in
# $NARAD_DEV_DIR/node-i/ (data/, narad.log, narad.pid); NARAD_DEV_DIR
# defaults to ./narad-dev in the current folder.
#
# The binary: $NARAD_BIN if set, else the newer of target/release/narad
# and target/debug/narad of this repository (the one it picked is
# printed). Build one with
#   cargo build --release -p narad-broker --bin narad
#
# `stop` only signals processes whose pid file this script wrote and whose
# command line still names that node's data folder; anything else is left
# alone. Nothing here uses auth or TLS: do not expose these ports.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEV_DIR=${NARAD_DEV_DIR:-./narad-dev}
SECRET=narad-dev
START_DEADLINE_S=${NARAD_DEV_START_TIMEOUT:-120}
STOP_DEADLINE_S=${NARAD_DEV_STOP_TIMEOUT:-120}

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
    exit "${1:-0}"
}

die() {
    echo "dev-cluster: $*" >&2
    exit 1
}

find_binary() {
    if [[ -n ${NARAD_BIN:-} ]]; then
        [[ -x $NARAD_BIN ]] || die "NARAD_BIN=$NARAD_BIN is not an executable"
        BIN=$(cd "$(dirname "$NARAD_BIN")" && pwd)/$(basename "$NARAD_BIN")
    elif [[ -x $REPO/target/release/narad && -x $REPO/target/debug/narad ]]; then
        # The one built last: an old release build must not hide new code.
        if [[ $REPO/target/debug/narad -nt $REPO/target/release/narad ]]; then
            BIN=$REPO/target/debug/narad
        else
            BIN=$REPO/target/release/narad
        fi
    elif [[ -x $REPO/target/release/narad ]]; then
        BIN=$REPO/target/release/narad
    elif [[ -x $REPO/target/debug/narad ]]; then
        BIN=$REPO/target/debug/narad
    else
        die "no narad binary in $REPO/target/{release,debug}; build one with:
  cargo build --release -p narad-broker --bin narad"
    fi
}

client_port() { echo $((8080 + $1)); }
peer_port() { echo $((9080 + $1)); }

# The nodes of the dev folder, by number.
nodes() {
    local dir
    for dir in "$DEV_DIR"/node-*; do
        [[ -d $dir ]] || continue
        echo "${dir##*/node-}"
    done | sort -n
}

# The pid of node $1 if it is running and is the process this script
# started (its command line names the node's data folder), else nothing.
node_pid() {
    local i=$1 pidfile=$DEV_DIR/node-$1/narad.pid pid data
    [[ -f $pidfile ]] || return 0
    pid=$(<"$pidfile")
    [[ $pid =~ ^[0-9]+$ ]] || return 0
    [[ -r /proc/$pid/cmdline ]] || return 0
    data=$(cd "$DEV_DIR/node-$i" && pwd)/data
    if tr '\0' '\n' <"/proc/$pid/cmdline" | grep -qxF -- "$data"; then
        echo "$pid"
    fi
}

# Whether some process listens on TCP port $1 of 127.0.0.1 (ss, if there).
port_listened() {
    command -v ss >/dev/null || return 1
    [[ -n $(ss -Hltn "sport = :$1" 2>/dev/null) ]]
}

# Starts node $1 with the member list $2, detached (setsid: the nodes outlive
# this shell and a Ctrl-C in it).
spawn_node() {
    local i=$1 peers=$2 dir=$DEV_DIR/node-$1
    mkdir -p "$dir/data"
    setsid "$BIN" serve \
        --data-dir "$dir/data" \
        --node-id "$i" \
        --listen "127.0.0.1:$(client_port "$i")" \
        --peer-listen "127.0.0.1:$(peer_port "$i")" \
        --peers "$peers" \
        --cluster-secret "$SECRET" \
        --shards 1 \
        --set storage.wal_ring_bytes=67108864 \
        >>"$dir/narad.log" 2>&1 </dev/null &
    echo $! >"$dir/narad.pid"
}

readyz() {
    curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$(client_port "$1")/readyz" 2>/dev/null || true
}

cmd_start() {
    local n=3
    while (($#)); do
        case $1 in
            --nodes) [[ $# -ge 2 ]] || die "--nodes needs a number"; n=$2; shift 2 ;;
            --nodes=*) n=${1#--nodes=}; shift ;;
            -h | --help) usage ;;
            *) die "start: unknown argument $1" ;;
        esac
    done
    if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > 99)); then
        die "--nodes must be 1 to 99"
    fi
    command -v curl >/dev/null || die "curl is needed to wait for /readyz"
    find_binary
    mkdir -p "$DEV_DIR"
    DEV_DIR=$(cd "$DEV_DIR" && pwd)
    local i
    for i in $(nodes); do
        if [[ -n $(node_pid "$i") ]]; then
            die "node $i is already running ($DEV_DIR/node-$i); run stop first"
        fi
    done
    for i in $(nodes); do
        ((i <= n)) || die "$DEV_DIR holds node-$i from a larger cluster; stop it and remove $DEV_DIR first"
    done
    local peers="" sep=""
    for ((i = 1; i <= n; i++)); do
        peers+="$sep$i=127.0.0.1:$(peer_port "$i")"
        sep=,
    done
    echo "dev-cluster: $n nodes with $BIN"
    for ((i = 1; i <= n; i++)); do
        if port_listened "$(client_port "$i")"; then
            die "port $(client_port "$i") (node $i) is taken by another process"
        fi
        spawn_node "$i" "$peers"
    done
    local deadline=$((SECONDS + START_DEADLINE_S)) waiting told_time_wait=
    while :; do
        waiting=()
        for ((i = 1; i <= n; i++)); do
            # The pid file holds our own child's pid here (just started).
            if ! kill -0 "$(<"$DEV_DIR/node-$i/narad.pid")" 2>/dev/null; then
                # A node refuses its client port while connections that it
                # closed itself linger in TIME-WAIT (up to 60 s after the
                # previous run stopped). Nobody listens there: start it again.
                if tail -n 1 "$DEV_DIR/node-$i/narad.log" | grep -q 'is in use by another process' &&
                    ! port_listened "$(client_port "$i")" && ((SECONDS < deadline)); then
                    if [[ -z ${told_time_wait:-} ]]; then
                        echo "dev-cluster: port $(client_port "$i") still in TIME-WAIT from the last run; retrying (up to 60 s)"
                        told_time_wait=1
                    fi
                    sleep 1
                    spawn_node "$i" "$peers"
                    waiting+=("$i")
                    continue
                fi
                echo "dev-cluster: node $i exited while starting; the end of its log:" >&2
                tail -n 15 "$DEV_DIR/node-$i/narad.log" >&2
                cmd_stop >&2
                exit 1
            fi
            [[ $(readyz "$i") == 200 ]] || waiting+=("$i")
        done
        ((${#waiting[@]} == 0)) && break
        if ((SECONDS >= deadline)); then
            echo "dev-cluster: nodes ${waiting[*]} not ready after ${START_DEADLINE_S} s; logs in $DEV_DIR/node-*/narad.log" >&2
            cmd_stop >&2
            exit 1
        fi
        sleep 0.3
    done
    echo "dev-cluster: all $n nodes ready"
    for ((i = 1; i <= n; i++)); do
        echo "  node $i: http://127.0.0.1:$(client_port "$i")   (log $DEV_DIR/node-$i/narad.log)"
    done
    echo "try: NARAD_URL=http://127.0.0.1:$(client_port 1) $BIN cluster status"
}

cmd_status() {
    [[ -d $DEV_DIR ]] || { echo "dev-cluster: no cluster in $DEV_DIR"; return 0; }
    local i pid any=0
    for i in $(nodes); do
        any=1
        pid=$(node_pid "$i")
        if [[ -n $pid ]]; then
            local code
            code=$(readyz "$i")
            case $code in
                200) code="ready" ;;
                000 | "") code="not answering" ;;
                *) code="/readyz $code" ;;
            esac
            echo "node $i: running (pid $pid), http://127.0.0.1:$(client_port "$i"), $code"
        else
            echo "node $i: stopped"
        fi
    done
    ((any)) || echo "dev-cluster: no nodes in $DEV_DIR"
}

cmd_stop() {
    [[ -d $DEV_DIR ]] || { echo "dev-cluster: no cluster in $DEV_DIR"; return 0; }
    local i pid pids=() names=()
    for i in $(nodes); do
        pid=$(node_pid "$i")
        if [[ -n $pid ]]; then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
            names+=("$i")
        fi
    done
    if ((${#pids[@]} == 0)); then
        echo "dev-cluster: no node running in $DEV_DIR"
        return 0
    fi
    echo "dev-cluster: sent SIGTERM to nodes ${names[*]}; waiting for them to exit"
    local deadline=$((SECONDS + STOP_DEADLINE_S)) left k
    while :; do
        left=()
        for k in "${!pids[@]}"; do
            kill -0 "${pids[$k]}" 2>/dev/null && left+=("${names[$k]}")
        done
        ((${#left[@]} == 0)) && break
        if ((SECONDS >= deadline)); then
            echo "dev-cluster: nodes ${left[*]} still running after ${STOP_DEADLINE_S} s (left alone; see their logs)" >&2
            return 1
        fi
        sleep 0.2
    done
    for i in "${names[@]}"; do
        rm -f "$DEV_DIR/node-$i/narad.pid"
    done
    echo "dev-cluster: stopped (data kept in $DEV_DIR; remove it for a fresh cluster)"
}

case ${1:-} in
    start) shift; cmd_start "$@" ;;
    status) cmd_status ;;
    stop) cmd_stop ;;
    -h | --help | help) usage ;;
    *) usage 1 >&2 ;;
esac

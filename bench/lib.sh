# Shared by the bench scripts: waiting for a narad process started into
# "$work/NAME.out" to print its listening line (with a deadline), and
# stopping the processes a script started.
bench_work() { # makes $work (removed at exit, with every process in $pids stopped first)
  work="$(mktemp -d)"
  pids=()
  trap 'stop_all "${pids[@]}"; rm -rf "$work"' EXIT
}

stop_all() { # pid...: SIGTERM each, then wait for each to exit (so that its files can go)
  for p in "$@"; do kill "$p" 2>/dev/null || true; done
  for p in "$@"; do wait "$p" 2>/dev/null || true; done
}

address_of() { # name: prints the client address once the node listens
  for _ in $(seq 1 600); do
    if grep -q 'listening client=' "$work/$1.out" 2>/dev/null; then
      grep -o 'client=[^ ]*' "$work/$1.out" | head -1 | cut -d= -f2; return 0
    fi
    sleep 0.1
  done
  echo "$1 did not start" >&2; cat "$work/$1.err" >&2; return 1
}

remote_child() { # node parent child url topic: (re)points a remote child of parent at url's topic
  curl -sf -X PUT "http://$1/v1/topics/$2/children/$3" \
    -d "{\"kind\": \"remote\", \"remote\": {\"url\": \"$4\", \"topic\": \"$5\"}}" >/dev/null
}

held() { # node topic: the messages its partitions hold (the sum of their high watermarks)
  curl -sf "http://$1/v1/topics/$2" | grep -o '"high_watermark":[0-9]*' | cut -d: -f2 \
    | awk '{s+=$1} END {print s+0}'
}

ticks() { # pid: CPU time the process used so far, in clock ticks (user + system)
  awk '{print $14 + $15}' "/proc/$1/stat"
}

median() { # the median of the numbers on stdin, one per line
  sort -n | awk '{a[NR] = $1} END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

kafka_node() { # name shards: starts a release node with a Kafka listener and topic bench x16;
  # sets pid, node (client address) and kafka (Kafka address), and adds pid to pids
  target/release/narad serve --data-dir "$work/$1" --listen 127.0.0.1:0 \
    --kafka-listen 127.0.0.1:0 --shards "$2" >"$work/$1.out" 2>"$work/$1.err" &
  pid=$!
  pids+=("$pid")
  node=$(address_of "$1")
  kafka=$(grep -o 'kafka=[^ ]*' "$work/$1.out" | head -1 | cut -d= -f2)
  curl -sf -X PUT "http://$node/v1/topics/bench" \
    -d '{"partitions": 16, "visibility_timeout_ms": 60000}' >/dev/null
}

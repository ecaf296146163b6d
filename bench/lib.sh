# Shared by the bench scripts: waiting for a narad process started into
# "$work/NAME.out" to print its listening line (with a deadline).
address_of() { # name: prints the client address once the node listens
  for _ in $(seq 1 600); do
    if grep -q 'listening client=' "$work/$1.out" 2>/dev/null; then
      grep -o 'client=[^ ]*' "$work/$1.out" | cut -d= -f2; return 0
    fi
    sleep 0.1
  done
  echo "$1 did not start" >&2; cat "$work/$1.err" >&2; return 1
}

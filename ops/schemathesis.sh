#!/usr/bin/env bash
# Checks docs/openapi.yaml against the code and against a real node:
#
#   1. every path and method of the router's ROUTES table (broker/src/api/routes.rs)
#      is in the document with operationId LABEL_METHOD, and nothing else;
#   2. openapi-spec-validator accepts the document;
#   3. schemathesis sends generated requests to a fresh single node and checks
#      the answers against the document.
#
# Needs: a built narad binary ($NARAD_BIN, default target/debug/narad), curl,
# and `pip install openapi-spec-validator schemathesis` (tried with
# schemathesis 4.32.5 and openapi-spec-validator 0.9.0). The run takes about a
# minute on a 2-core machine. Exits non-zero when any step fails, including
# when schemathesis finds a failure; its report is printed.
#
# The schemathesis command (BASE is the node's client URL):
#
#   schemathesis run docs/openapi.yaml --url "$BASE" \
#     --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
#     --phases examples,coverage,fuzzing --max-examples 8 --max-time 40 \
#     --workers 1 --request-timeout 30 --generation-database none \
#     --exclude-operation-id cluster_nodes_post --no-color
#
# POST /v1/cluster/nodes is left out: it would admit generated addresses as
# cluster members, and the node would then try to reach them.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

NARAD_BIN=${NARAD_BIN:-target/debug/narad}
SPEC=docs/openapi.yaml
READY_DEADLINE_S=60

for tool in curl python3 openapi-spec-validator schemathesis; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "schemathesis.sh: $tool is missing (pip install openapi-spec-validator schemathesis)" >&2
        exit 2
    fi
done
if ! python3 -c 'import yaml' 2>/dev/null; then
    echo "schemathesis.sh: python3 cannot import yaml (pip install pyyaml)" >&2
    exit 2
fi
if [[ ! -x $NARAD_BIN ]]; then
    echo "schemathesis.sh: no narad binary at $NARAD_BIN (cargo build, or set NARAD_BIN)" >&2
    exit 2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/narad-schemathesis.XXXXXX")
node_pid=""
run_pid=""
cleanup() {
    local pid
    for pid in $run_pid $node_pid; do
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== ROUTES of broker/src/api/routes.rs against $SPEC"
python3 - "$SPEC" broker/src/api/routes.rs <<'EOF'
import re
import sys

import yaml

spec_path, api_path = sys.argv[1], sys.argv[2]
source = open(api_path, encoding="utf-8").read()
table = source[source.index("pub const ROUTES"):]
table = table[:table.index("];")]
# Each RouteId's label, from `RouteId::label`.
labels = dict(re.findall(r'Self::(\w+) => "([a-z_]+)",', source))
routes = {}
for variant, path, methods in re.findall(r'spec\(\s*RouteId::(\w+),\s*"([^"]+)",\s*&\[(.*?)\],?\s*\)', table, re.S):
    label = labels[variant]
    for method in re.findall(r"Method::([A-Z]+)", methods):
        routes[(path, method.lower())] = f"{label}_{method.lower()}"
if not routes:
    sys.exit("could not read the ROUTES table")
spec = yaml.safe_load(open(spec_path, encoding="utf-8"))
documented = {}
for path, item in spec["paths"].items():
    for method, operation in item.items():
        if method in ("get", "put", "post", "delete", "patch", "head", "options", "trace"):
            documented[(path, method)] = operation.get("operationId")
problems = []
for key in sorted(set(routes) - set(documented)):
    problems.append(f"missing from the document: {key[1].upper()} {key[0]}")
for key in sorted(set(documented) - set(routes)):
    problems.append(f"not a route: {key[1].upper()} {key[0]}")
for key in sorted(set(routes) & set(documented)):
    if routes[key] != documented[key]:
        problems.append(f"{key[1].upper()} {key[0]}: operationId {documented[key]!r}, expected {routes[key]!r}")
if problems:
    sys.exit("\n".join(problems))
print(f"{len(routes)} operations on {len({p for p, _ in routes})} paths match")
EOF

echo "== openapi-spec-validator $SPEC"
openapi-spec-validator "$SPEC"

# A free port for the peer network (the client port is picked by the node).
peer_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
echo "== starting $NARAD_BIN"
"$NARAD_BIN" serve --data-dir "$work/data" --listen 127.0.0.1:0 \
    --peer-listen "127.0.0.1:$peer_port" >"$work/node.out" 2>"$work/node.err" &
node_pid=$!

base=""
deadline=$((SECONDS + READY_DEADLINE_S))
while :; do
    if ! kill -0 "$node_pid" 2>/dev/null; then
        echo "schemathesis.sh: the node exited before it was ready" >&2
        cat "$work/node.out" "$work/node.err" >&2
        exit 1
    fi
    if [[ -z $base ]]; then
        # The node prints `listening client=HOST:PORT peer=...` once it listens.
        addr=$(sed -n 's/.*listening client=\([^ ]*\).*/\1/p' "$work/node.out" | head -n 1)
        if [[ -n $addr ]]; then
            base="http://$addr"
        fi
    fi
    if [[ -n $base ]] && [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$base/readyz" || true) == 200 ]]; then
        break
    fi
    if ((SECONDS >= deadline)); then
        echo "schemathesis.sh: the node was not ready within ${READY_DEADLINE_S}s" >&2
        cat "$work/node.out" "$work/node.err" >&2
        exit 1
    fi
    sleep 0.2 # the polling interval; the deadline above bounds the wait
done
echo "node ready at $base (pid $node_pid)"

echo "== schemathesis $(schemathesis --version | sed 's/.*version //')"
status=0
# Hypothesis keeps a cache in .hypothesis/ of the working folder unless told
# otherwise: keep it in the temp folder, out of the work tree. It runs in the
# background so that a signal to this script stops it at once.
HYPOTHESIS_STORAGE_DIRECTORY="$work/hypothesis" \
    schemathesis run "$SPEC" --url "$base" \
        --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
        --phases examples,coverage,fuzzing --max-examples 8 --max-time 40 \
        --workers 1 --request-timeout 30 --generation-database none \
        --exclude-operation-id cluster_nodes_post --no-color &
run_pid=$!
wait "$run_pid" || status=$?
run_pid=""

if ! kill -0 "$node_pid" 2>/dev/null; then
    echo "schemathesis.sh: the node died during the run" >&2
    tail -n 50 "$work/node.err" >&2
    status=1
fi
exit "$status"

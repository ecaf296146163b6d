#!/usr/bin/env bash
# Checks the monitoring files an operator deploys:
#   ops/prometheus/narad-alerts.yml       promtool check rules
#   ops/prometheus/narad-alerts.test.yml  promtool test rules
#   ops/grafana/narad-dashboard.json      parses; unique panel ids; titles;
#                                         every query names real metrics
# A "real metric" is a name defined in broker/src/metric_names.rs or
# storage/src/metric_names.rs; NAME_bucket, NAME_sum and NAME_count are
# accepted for the names docs/metrics.md lists as histograms.
# Needs promtool (Debian/Ubuntu: apt-get install prometheus) and python3.
# Runs from any directory; exits non-zero on the first failed check.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

fail() {
    echo "check-monitoring: FAILED: $*" >&2
    exit 1
}

command -v promtool >/dev/null 2>&1 \
    || fail "promtool not found (Debian/Ubuntu: apt-get install prometheus; or a Prometheus release tarball)"
command -v python3 >/dev/null 2>&1 || fail "python3 not found"

rules=ops/prometheus/narad-alerts.yml
tests=ops/prometheus/narad-alerts.test.yml
dashboard=ops/grafana/narad-dashboard.json
for file in "$rules" "$tests" "$dashboard" broker/src/metric_names.rs \
    storage/src/metric_names.rs docs/metrics.md; do
    [[ -f "$file" ]] || fail "$file is missing"
done

echo "== promtool check rules $rules"
promtool check rules "$rules" || fail "promtool check rules $rules"

echo "== promtool test rules $tests"
promtool test rules "$tests" || fail "promtool test rules $tests"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
queries="$work/dashboard-queries.yml"

echo "== metric names and dashboard"
python3 - "$rules" "$tests" "$dashboard" "$queries" <<'PY' || fail "metric names or dashboard (see above)"
import json
import re
import sys

rules_path, tests_path, dashboard_path, queries_path = sys.argv[1:5]
errors = []

# The metric names the code defines.
known = set()
for path in ("broker/src/metric_names.rs", "storage/src/metric_names.rs"):
    with open(path, encoding="utf-8") as f:
        known.update(re.findall(r'"(narad_[a-z0-9_]+)"', f.read()))
if not known:
    sys.exit("no metric names found in the metric_names.rs files")

# The histograms, from the table of docs/metrics.md.
histograms = set()
with open("docs/metrics.md", encoding="utf-8") as f:
    for line in f:
        m = re.match(r"\|\s*`(narad_[a-z0-9_]+)[^`]*`\s*\|\s*histogram\s*\|", line)
        if m:
            histograms.add(m.group(1))

SUFFIXES = ("_bucket", "_sum", "_count")


def metric_problem(name):
    """None if `name` is a series Narad exports, else why not."""
    if name in known:
        return None
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            if base in known:
                if base in histograms:
                    return None
                return f"{name}: {base} is not a histogram in docs/metrics.md"
    return f"{name} is not defined in broker/src/metric_names.rs or storage/src/metric_names.rs"


# 1. Every narad_* name in the rules and their tests.
for path in (rules_path, tests_path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for name in sorted(set(re.findall(r"(?<![A-Za-z0-9_])narad_[a-z0-9_]+", text))):
        problem = metric_problem(name)
        if problem:
            errors.append(f"{path}: {problem}")

# 2. The dashboard.
KEYWORDS = {
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
    "group_left", "group_right", "atan2", "inf", "nan", "Inf", "NaN",
}
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def metrics_in(expr):
    """The metric names an expression selects (a small PromQL tokenizer)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # strings
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)  # ranges and subqueries
    e = re.sub(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*", " 0 ", e)  # Grafana variables
    e = GROUPING.sub(" ", e)
    names = []
    for m in re.finditer(r"(?<![A-Za-z0-9_.:])[A-Za-z_:][A-Za-z0-9_:]*", e):
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or m.group(0) in KEYWORDS:
            continue  # a function or aggregation, or a keyword
        names.append(m.group(0))
    return names


try:
    with open(dashboard_path, encoding="utf-8") as f:
        dashboard = json.load(f)
except (OSError, ValueError) as e:
    sys.exit(f"{dashboard_path}: does not parse as JSON: {e}")

panels = []


def collect(items):
    for panel in items or []:
        panels.append(panel)
        collect(panel.get("panels"))


collect(dashboard.get("panels"))
if not panels:
    errors.append(f"{dashboard_path}: no panels")

seen = {}
queries = []
for panel in panels:
    pid = panel.get("id")
    title = panel.get("title")
    where = f"{dashboard_path}: panel {pid} ({title!r})"
    if not isinstance(pid, int):
        errors.append(f"{where}: no integer id")
    elif pid in seen:
        errors.append(f"{where}: id {pid} is also panel {seen[pid]!r}")
    else:
        seen[pid] = title
    if not isinstance(title, str) or not title.strip():
        errors.append(f"{where}: no title")
    if panel.get("type") == "row":
        continue
    targets = panel.get("targets") or []
    if not targets:
        errors.append(f"{where}: no targets")
    ref_ids = [t.get("refId") for t in targets]
    if len(set(ref_ids)) != len(ref_ids):
        errors.append(f"{where}: refIds repeat: {ref_ids}")
    for target in targets:
        expr = target.get("expr")
        if not isinstance(expr, str) or not expr.strip():
            errors.append(f"{where}: target {target.get('refId')} has no expr")
            continue
        queries.append((f"dashboard:panel{pid}:{target.get('refId')}", expr))
        names = metrics_in(expr)
        if not any(n.startswith("narad_") for n in names):
            errors.append(f"{where}: {expr!r} selects no narad_ metric")
        for name in names:
            problem = metric_problem(name)
            if problem:
                errors.append(f"{where}: {problem} (in {expr!r})")

# The template variables' queries name metrics too.
variables = dashboard.get("templating", {}).get("list", [])
names = {v.get("name") for v in variables}
if "topic" not in names:
    errors.append(f"{dashboard_path}: no topic template variable")
if not any(v.get("type") == "datasource" for v in variables):
    errors.append(f"{dashboard_path}: no datasource template variable")
for variable in variables:
    query = variable.get("query")
    if isinstance(query, dict):
        query = query.get("query")
    if variable.get("type") != "query" or not isinstance(query, str):
        continue
    for name in re.findall(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,", query):
        problem = metric_problem(name)
        if problem:
            errors.append(f"{dashboard_path}: variable {variable.get('name')}: {problem}")

if errors:
    for error in errors:
        print(error, file=sys.stderr)
    sys.exit(1)

# Every panel query as a recording rule, for promtool to parse: Grafana's
# interval variables become 5m, other variables match anything.
with open(queries_path, "w", encoding="utf-8") as f:
    f.write("groups:\n  - name: dashboard-queries\n    rules:\n")
    for record, expr in queries:
        e = re.sub(r"\$__[A-Za-z_]+|\$\{__[A-Za-z_]+\}", "5m", expr)
        e = re.sub(r"\$\{[A-Za-z0-9_]+\}|\$[A-Za-z_][A-Za-z0-9_]*", ".*", e)
        f.write(f"      - record: {json.dumps(record)}\n        expr: {json.dumps(e)}\n")
print(f"  {len(panels)} panels, ids unique, every query names only metrics Narad exports"
      f" ({len(known)} names known)")
PY

echo "== promtool check rules (the dashboard's queries, as recording rules)"
promtool check rules "$queries" || fail "a dashboard query does not parse as PromQL (see above)"

echo "check-monitoring: all checks passed"

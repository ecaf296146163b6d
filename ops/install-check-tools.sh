#!/usr/bin/env bash
# Installs the tools that check the files of ops/ and docs/openapi.yaml:
# promtool (Debian's prometheus package), openapi-spec-validator and
# schemathesis (PyPI). systemd-analyze comes with systemd. Tools already
# on the PATH are left as they are. Needs root for apt (CI runs as root).
set -euo pipefail

if ! command -v promtool >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    # The package's service may not start in a container; promtool is all
    # that is wanted.
    apt-get install -y -q --no-install-recommends prometheus || command -v promtool >/dev/null
fi
need_pip=()
command -v openapi-spec-validator >/dev/null 2>&1 || need_pip+=(openapi-spec-validator)
command -v schemathesis >/dev/null 2>&1 || need_pip+=(schemathesis)
python3 -c 'import yaml' 2>/dev/null || need_pip+=(pyyaml)
if ((${#need_pip[@]})); then
    python3 -m pip install -q --disable-pip-version-check "${need_pip[@]}"
fi
for tool in promtool openapi-spec-validator schemathesis systemd-analyze python3 curl; do
    command -v "$tool" >/dev/null 2>&1 || { echo "install-check-tools: $tool is still missing" >&2; exit 1; }
done
echo "install-check-tools: promtool, openapi-spec-validator, schemathesis, systemd-analyze ready"

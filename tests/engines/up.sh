#!/usr/bin/env bash
# Start the container engines the engine tests use, on data roots created fresh for this run,
# and build the test image from local files (no registry). docs/netcut.md#engines-in-ci.
#
#   tests/engines/up.sh      check the binaries, start containerd + dockerd, configure podman
#                            privately, import the test image
#   tests/engines/down.sh    stop everything up.sh started and remove every trace of the run
#   tests/engines/leftovers.sh  list what an earlier run left behind (nothing, after down.sh)
#
# Nothing survives a run: images, containers, networks, engine state and configuration live
# under $NETCUT_CI_RUN (default /run/netcut-ci) and $NETCUT_CI_DATA (default
# /var/lib/netcut-ci), both created here and refused if they already exist (an earlier run
# that was not taken down), and removed by down.sh. Nothing is written to /etc: podman reads
# only the configuration written here (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF,
# CONTAINERS_REGISTRIES_CONF), and its CNI network, IPAM leases included, lives in the run
# directory. No helper image is built: netcut builds its own on first use, which the tests
# thereby prove. Clients find these engines through the variables in $NETCUT_CI_RUN/env.
#
# One run at a time per machine: `./dev.sh test` holds an flock on /run/netcut-ci.lock from
# before up.sh until after down.sh, so engine-using runs of several checkouts take turns (the
# engines' bridges and subnets below are fixed, so two runs at once would collide).
#
# Networks: every engine bridge takes a /24 of 198.19.240.0/20, outside 198.18.0.0/17
# (tests/harness.py) and the 198.19.10-249 topologies of tests/netcut; nothing is routed or
# NATed beyond the host:
#   docker   bridge docker0 198.19.250.1/24 and network nc-ci 198.19.251.0/24 (embedded DNS);
#            dockerd runs with --iptables=false --ip6tables=false --ip-forward=false, so it
#            adds no FORWARD DROP, no NAT and never turns on forwarding in the root namespace.
#   podman   CNI network netcut-ci on bridge ncpod0 198.19.252.0/24: a bridge plugin without
#            isGateway/ipMasq and no firewall plugin, the gateway address put on the bridge
#            here, so podman adds no rules and never enables forwarding either.
#   containerd  `ctr run` containers get no network; the tests give them a veth of their own.
set -euo pipefail
RUN_DIR="${NETCUT_CI_RUN:-/run/netcut-ci}"
DATA_DIR="${NETCUT_CI_DATA:-/var/lib/netcut-ci}"
BOX=netcut-ci-box:latest
cd "$(dirname "$0")/../.."

log() { echo "engines: $*" >&2; }

# ---- every binary first, each with the Debian package that ships it
missing=()
for need in containerd:containerd ctr:containerd containerd-shim-runc-v2:containerd \
    runc:runc dockerd:docker.io docker:docker.io podman:podman conmon:conmon \
    busybox:busybox-static; do
    command -v "${need%%:*}" >/dev/null 2>&1 || missing+=("${need%%:*} (Debian package ${need#*:})")
done
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] ||
    missing+=("/usr/lib/cni/bridge, host-local (Debian package containernetworking-plugins)")
if ((${#missing[@]})); then
    log "cannot start the engines, missing: ${missing[*]}; install with ./dev.sh engines"
    exit 1
fi

PODMAN=$(command -v podman)  # the real one, before the run's PATH puts its own first

# ---- a fresh run or none
for dir in "$RUN_DIR" "$DATA_DIR"; do
    if [[ -e "$dir" ]]; then
        log "$dir exists: an earlier run was not taken down (tests/engines/down.sh does it)"
        exit 1
    fi
done
mkdir -p "$RUN_DIR" "$DATA_DIR"

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: poll a command, bounded
    local deadline=$((SECONDS + $1)) what=$2
    shift 2
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then log "$what did not come up; see $RUN_DIR/*.log"; return 1; fi
        sleep 0.1
    done
}

# Paths podman, runc and the CNI plugins write whatever their configuration (see down.sh):
# those absent now are recorded, for down.sh to remove what the run put there.
for path in /var/cache/containers /var/lib/cni /run/runc; do
    [[ -e "$path" ]] || echo "$path" >>"$RUN_DIR/created"
done

cat >"$RUN_DIR/env" <<ENV
export DOCKER_HOST=unix://$RUN_DIR/docker.sock
export CONTAINERD_ADDRESS=$RUN_DIR/containerd.sock
export CONTAINERS_CONF=$RUN_DIR/podman/containers.conf
export CONTAINERS_STORAGE_CONF=$RUN_DIR/podman/storage.conf
export CONTAINERS_REGISTRIES_CONF=$RUN_DIR/podman/registries.conf
export PATH=$RUN_DIR/bin:\$PATH
ENV
# shellcheck disable=SC1091
source "$RUN_DIR/env"

# ---- containerd (also dockerd's); the daemons get none of our file descriptors (the lock)
cat >"$RUN_DIR/containerd.toml" <<TOML
version = 2
root = "$DATA_DIR/containerd"
state = "$RUN_DIR/containerd-state"
[grpc]
  address = "$RUN_DIR/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  disable_cgroup = true
[plugins."io.containerd.internal.v1.opt"]
  path = "$DATA_DIR/containerd-opt"
TOML
setsid containerd --config "$RUN_DIR/containerd.toml" >"$RUN_DIR/containerd.log" 2>&1 \
    </dev/null 7>&- 8>&- 9>&- &
echo $! >"$RUN_DIR/containerd.pid"
wait_for 30 containerd ctr --address "$CONTAINERD_ADDRESS" version
log "containerd pid $(cat "$RUN_DIR/containerd.pid")"

# ---- dockerd
setsid dockerd --host "$DOCKER_HOST" --containerd "$CONTAINERD_ADDRESS" \
    --data-root "$DATA_DIR/docker" --exec-root "$RUN_DIR/docker-exec" \
    --pidfile "$RUN_DIR/dockerd.pidfile" --storage-driver overlay2 \
    --exec-opt native.cgroupdriver=cgroupfs \
    --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
    --bip 198.19.250.1/24 --userland-proxy=false \
    >"$RUN_DIR/dockerd.log" 2>&1 </dev/null 7>&- 8>&- 9>&- &
echo $! >"$RUN_DIR/dockerd.pid"
wait_for 60 dockerd docker info
log "dockerd pid $(cat "$RUN_DIR/dockerd.pid")"
docker network create --subnet 198.19.251.0/24 --gateway 198.19.251.1 nc-ci >/dev/null
# nc-ci's bridge, br-<first 12 of the network id>, for down.sh to remove
echo "br-$(docker network inspect -f '{{.Id}}' nc-ci | cut -c1-12)" >"$RUN_DIR/bridges"

# ---- podman: private configuration and storage, runc, the VM's limits, a CNI network that
# adds no firewall rules
mkdir -p "$RUN_DIR/podman/cni" "$RUN_DIR/podman/tmp" "$RUN_DIR/bin"
# The podman the run uses, first on its PATH. Run as root, podman keeps its blob info cache
# in /var/lib/containers/cache whatever its storage configuration (containers/image
# pkg/blobinfocache/default.go: systemBlobInfoCacheDir, used unless the caller's
# SystemContext names a directory, which podman's command line cannot), and writes it on
# every image copy: import, load, pull, build, commit, save, push. Those run in a mount
# namespace of their own in which /var/lib is read-only but for the run's data directory:
# podman then keeps the cache in memory ("using a memory-only cache") and writes nothing
# outside the run. Everything else runs as it is: a container started in a namespace of its
# own would keep its mounts from the rest of the machine.
cat >"$RUN_DIR/bin/podman" <<SHIM
#!/bin/sh
# podman for one test run, written by tests/engines/up.sh (docs/netcut.md#engines-in-ci).
case "\$1" in
import | load | pull | build | commit | save | push | image) ;;
*) exec $PODMAN "\$@" ;;
esac
exec unshare --mount --propagation private /bin/sh -c '
    mount --bind /var/lib /var/lib && mount -o remount,bind,ro /var/lib &&
    mount --bind "\$0" "\$0" && mount -o remount,bind,rw "\$0" && exec "\$@"' \\
    "$DATA_DIR" $PODMAN "\$@"
SHIM
chmod 755 "$RUN_DIR/bin/podman"
hard_nofile=$(ulimit -Hn)
cat >"$CONTAINERS_CONF" <<CONF
# Written by egress-netcut's tests/engines/up.sh for one test run (docs/netcut.md#engines-in-ci).
[containers]
default_ulimits = ["nofile=$hard_nofile:$hard_nofile", "nproc=32768:32768"]

[network]
network_backend = "cni"
network_config_dir = "$RUN_DIR/podman/cni"
default_network = "netcut-ci"
default_subnet = "198.19.252.0/24"

[engine]
runtime = "runc"
tmp_dir = "$RUN_DIR/podman/tmp"
events_logger = "file"
events_logfile_path = "$RUN_DIR/podman/events.log"
CONF
cat >"$CONTAINERS_STORAGE_CONF" <<CONF
[storage]
driver = "overlay"
graphroot = "$DATA_DIR/podman"
runroot = "$RUN_DIR/podman/storage"
CONF
cat >"$CONTAINERS_REGISTRIES_CONF" <<'CONF'
# No registry: every image is imported from local files.
unqualified-search-registries = []
CONF
cat >"$RUN_DIR/podman/cni/netcut-ci.conflist" <<CNI
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
        "dataDir": "$RUN_DIR/podman/cni-ipam",
        "routes": [{"dst": "0.0.0.0/0", "gw": "198.19.252.1"}],
        "ranges": [[{"subnet": "198.19.252.0/24", "gateway": "198.19.252.1"}]]
      }
    }
  ]
}
CNI
ip link add ncpod0 type bridge
ip addr add 198.19.252.1/24 dev ncpod0
ip link set ncpod0 up

# ---- the test image, from local files only (busybox-static: no libraries needed)
root="$RUN_DIR/box"
mkdir -p "$root"/{bin,etc,run,tmp,proc,sys,dev}
cp /bin/busybox "$root/bin/busybox"
for applet in sh sleep cat nc true ls; do ln -s busybox "$root/bin/$applet"; done
tar -C "$root" -cf "$root.tar" .
docker import "$root.tar" "$BOX" >/dev/null
"$RUN_DIR/bin/podman" import -q "$root.tar" "$BOX" >/dev/null
docker save "$BOX" -o "$root.image.tar"
ctr -n default images import "$root.image.tar" >/dev/null
rm -rf "$root" "$root.tar" "$root.image.tar"
log "built image $BOX for docker, podman and containerd"
log "ready ($RUN_DIR/env)"

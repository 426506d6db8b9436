#!/usr/bin/env bash
# Start the container engines the engine tests use, on data roots created fresh for this run,
# and build the test image from local files (no registry). docs/netcut.md#engines-in-ci.
#
#   tests/engines/up.sh      check the binaries, start containerd + dockerd, configure podman
#                            privately, create the run's unprivileged user (a docker-group
#                            user with rootless podman), import the test image for both
#   tests/engines/down.sh    stop everything up.sh started and remove every trace of the run
#   tests/engines/leftovers.sh  list what an earlier run left behind (nothing, after down.sh)
#
# Nothing survives a run: images, containers, networks, engine state and configuration live
# under $NETCUT_CI_RUN (default /run/netcut-ci) and $NETCUT_CI_DATA (default
# /var/lib/netcut-ci), both created here and refused if they already exist (an earlier run
# that was not taken down), and removed by down.sh. podman reads only the configuration
# written here (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF, CONTAINERS_REGISTRIES_CONF), and its
# CNI network, IPAM leases included, lives in the run directory. No helper image is built:
# netcut builds its own on first use, which the tests thereby prove. Clients find these
# engines through the variables in $NETCUT_CI_RUN/env.
#
# The run coexists with engines the machine runs itself: its bridges, sockets, user and
# names are its own (tests/engines/instance.sh chooses them; a second run with other ones
# can run beside it), and nothing of the machine's is stopped, deleted or re-addressed. What
# it must add outside its two directories is recorded there for down.sh to remove exactly:
# the run's user and group, their subordinate id ranges in /etc/subuid and /etc/subgid, and
# the traverse (x) ACL entries that let the user reach this checkout and its interpreters.
#
# One run per instance at a time: `./dev.sh test` holds an flock on $NETCUT_CI_RUN.lock
# from before up.sh until after down.sh, so engine-using runs of several checkouts take turns.
#
# Networks (N = NETCUT_CI_NET, default 250): every engine bridge takes a /24 of
# 198.19.240.0/20, outside 198.18.0.0/17 (tests/harness.py); nothing is routed or NATed
# beyond the host:
#   docker   bridge PREFIXdock0 198.19.N.1/24, made here and given to dockerd (--bridge), and
#            network nc-ci on bridge PREFIXdnet0 198.19.N+1.0/24 (embedded DNS); dockerd runs
#            with --iptables=false --ip6tables=false --ip-forward=false, so it adds no FORWARD
#            DROP, no NAT and never turns on forwarding in the root namespace.
#   podman   CNI network NAME on bridge PREFIXpod0 198.19.N+2.0/24: a bridge plugin without
#            isGateway/ipMasq and no firewall plugin, the gateway address put on the bridge
#            here, so podman adds no rules and never enables forwarding either. The user's
#            rootless podman runs its containers on slirp4netns (user-mode networking in the
#            user's own namespaces: nothing on the host's).
#   containerd  `ctr run` containers get no network; the tests give them a veth of their own
#            on a /30 of 198.19.N+3.0/24.
set -euo pipefail
# shellcheck source=tests/engines/instance.sh
source "$(dirname "$0")/instance.sh"
BOX=netcut-ci-box:latest
cd "$(dirname "$0")/../.."
CHECKOUT=$PWD

log() { echo "engines: $*" >&2; }

# ---- every binary first, each with the Debian package that ships it
missing=()
for need in containerd:containerd ctr:containerd containerd-shim-runc-v2:containerd \
    runc:runc dockerd:docker.io docker:docker.io podman:podman conmon:conmon \
    busybox:busybox-static newuidmap:uidmap newgidmap:uidmap slirp4netns:slirp4netns \
    setfacl:acl useradd:passwd setpriv:util-linux; do
    command -v "${need%%:*}" >/dev/null 2>&1 || missing+=("${need%%:*} (Debian package ${need#*:})")
done
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] ||
    missing+=("/usr/lib/cni/bridge, host-local (Debian package containernetworking-plugins)")
if ((${#missing[@]})); then
    log "cannot start the engines, missing: ${missing[*]}; install with ./dev.sh engines"
    exit 1
fi

PODMAN=$(command -v podman)  # the real one, before the run's PATH puts its own first

# ---- a fresh run or none, on names and addresses nobody else uses
for dir in "$RUN_DIR" "$DATA_DIR"; do
    if [[ -e "$dir" ]]; then
        log "$dir exists: an earlier run was not taken down (tests/engines/down.sh does it)"
        exit 1
    fi
done
for link in "${CI_BRIDGE_NAMES[@]}"; do
    if ip link show "$link" >/dev/null 2>&1; then
        log "a link named $link exists: another run's? (choose others with NETCUT_CI_BRIDGES)"
        exit 1
    fi
done
for net in 198.19.$CI_NET 198.19.$((CI_NET + 1)) 198.19.$((CI_NET + 2)) "$CTR_NET"; do
    if [[ -n "$(ip -4 -o addr show to "$net.0/24")" ]]; then
        log "$net.0/24 is in use on this machine: $(ip -4 -o addr show to "$net.0/24" | cut -c1-80)" \
            "(choose other subnets with NETCUT_CI_NET)"
        exit 1
    fi
done
for id in "$CI_USER" "$CI_GROUP"; do
    if getent passwd "$id" >/dev/null || getent group "$id" >/dev/null; then
        log "user or group $id exists: an earlier run was not taken down" \
            "(tests/engines/down.sh), or choose NETCUT_CI_NAME"
        exit 1
    fi
done
mkdir -p "$RUN_DIR" "$DATA_DIR"
chmod 755 "$RUN_DIR" "$DATA_DIR"

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
# dockerd creates /run/docker/plugins (plugin discovery) whatever its exec root.
for path in /var/cache/containers /var/lib/cni /run/runc /run/docker; do
    [[ -e "$path" ]] || echo "$path" >>"$RUN_DIR/created"
done

cat >"$RUN_DIR/env" <<ENV
export NETCUT_CI_RUN=$RUN_DIR
export NETCUT_CI_DATA=$DATA_DIR
export NETCUT_CI_NAME=$CI_NAME
export NETCUT_CI_BRIDGES=$CI_BRIDGES
export NETCUT_CI_NET=$CI_NET
export NETCUT_CI_DOCKER_GATEWAY=$DNET_ADDR
export NETCUT_CI_PODMAN_GATEWAY=$POD_ADDR
export NETCUT_CI_CTR_NET=$CTR_NET
export NETCUT_CI_USER=$CI_USER
export NETCUT_CI_GROUP=$CI_GROUP
export DOCKER_HOST=unix://$RUN_DIR/docker.sock
export CONTAINERD_ADDRESS=$RUN_DIR/containerd.sock
export CONTAINERS_CONF=$RUN_DIR/podman/containers.conf
export CONTAINERS_STORAGE_CONF=$RUN_DIR/podman/storage.conf
export CONTAINERS_REGISTRIES_CONF=$RUN_DIR/podman/registries.conf
export PATH=$RUN_DIR/bin:\$PATH
ENV
# shellcheck disable=SC1091
source "$RUN_DIR/env"

# ---- the run's unprivileged user: a member of the group that owns docker's socket (a
# "docker-group user", as framework users are), with subordinate ids for rootless podman.
# Tests run commands as it (tests/ciuser.py); everything it owns lives in the run's two
# directories, and what had to be added machine-wide is recorded for down.sh.
[[ -e /etc/subuid ]] || { touch /etc/subuid; echo /etc/subuid >>"$RUN_DIR/created-files"; }
[[ -e /etc/subgid ]] || { touch /etc/subgid; echo /etc/subgid >>"$RUN_DIR/created-files"; }
groupadd "$CI_GROUP"
echo "group $CI_GROUP" >>"$RUN_DIR/accounts"
# useradd gives a regular user a free range of subordinate ids of its own (SUB_UID_COUNT in
# /etc/login.defs, 65536 by default), under its lock, when /etc/subuid exists
useradd --no-create-home --home-dir "$DATA_DIR/user" --shell /bin/sh --user-group \
    --groups "$CI_GROUP" --comment "egress-netcut engine test run $RUN_DIR" "$CI_USER"
echo "user $CI_USER" >>"$RUN_DIR/accounts"
uid=$(id -u "$CI_USER")
gid=$(id -g "$CI_USER")
echo "$uid $gid" >"$RUN_DIR/user.ids"
for file in subuid subgid; do
    if ! grep -q "^$CI_USER:" "/etc/$file"; then
        # (SUB_UID_COUNT 0, or an older useradd): a range after every range in the file
        start=$(awk -F: 'BEGIN { m = 100000 } $2 + $3 > m { m = $2 + $3 } END { print m }' "/etc/$file")
        usermod "--add-sub${file#sub}s" "$start-$((start + 65535))" "$CI_USER"
    fi
    grep "^$CI_USER:" "/etc/$file" >"$RUN_DIR/user.$file"
done
mkdir -p "$DATA_DIR/user" "$RUN_DIR/user/xdg"
chown "$uid:$gid" "$DATA_DIR/user" "$RUN_DIR/user/xdg"
chmod 700 "$DATA_DIR/user" "$RUN_DIR/user/xdg"
# The user runs this checkout's Python and the frameworks' venvs, whose interpreters may live
# where it cannot go (pyenv's under /root, mode 700): it gets a traverse-only ACL entry on
# each directory on the way that others cannot cross, recorded for down.sh.
grant_traverse() {
    local path dir
    for path in "$@"; do
        [[ -e "$path" ]] || continue
        dir=$(realpath "$path")
        [[ -d "$dir" ]] || dir=$(dirname "$dir")
        while :; do
            if [[ -z "$(find "$dir" -maxdepth 0 -perm -o+x)" ]] &&
                ! grep -qxF -e "minimal $dir" -e "extended $dir" "$RUN_DIR/acl" 2>/dev/null; then
                # "minimal": no ACL beyond the mode bits, which down.sh then restores exactly
                if [[ -z "$(getfacl -cs "$dir" 2>/dev/null)" ]]; then
                    echo "minimal $dir" >>"$RUN_DIR/acl"
                else
                    echo "extended $dir" >>"$RUN_DIR/acl"
                fi
                setfacl -m "u:$uid:x" "$dir"
            fi
            [[ "$dir" == / ]] && break
            dir=$(dirname "$dir")
        done
    done
}
grant_traverse "$CHECKOUT" "$CHECKOUT"/.venv*/bin/python "$CHECKOUT"/.venv-frameworks/*/bin/python \
    "${EGRESS_VENV:-.venv}/bin/python" "${EGRESS_HARBOR_VENV:-.venv-harbor}/bin/python" \
    "${EGRESS_VERIFIERS_VENV:-.}/bin/python" "${EGRESS_INSPECT_VENV:-.}/bin/python"
# Rootless podman for the user: its own storage in the data directory, its runtime state in
# XDG_RUNTIME_DIR under the run directory, runc (crun fails on this machine's cgroup layout)
# without cgroups of its own (cgroupfs: a user cannot be given a v1 hierarchy), slirp4netns.
cat >"$RUN_DIR/user/containers.conf" <<CONF
# Written by egress-netcut's tests/engines/up.sh for one test run (docs/netcut.md#engines-in-ci).
[network]
network_config_dir = "$RUN_DIR/user/xdg/networks"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
tmp_dir = "$RUN_DIR/user/xdg/libpod-tmp"
events_logger = "file"
events_logfile_path = "$RUN_DIR/user/xdg/events.log"
image_copy_tmp_dir = "$DATA_DIR/user"
CONF
cat >"$RUN_DIR/user/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$DATA_DIR/user/storage"
runroot = "$RUN_DIR/user/xdg/storage"
CONF
# The user's environment, one NAME=VALUE a line (tests/ciuser.py reads it; `env -i` takes it)
cat >"$RUN_DIR/user/env" <<ENV
HOME=$DATA_DIR/user
USER=$CI_USER
LOGNAME=$CI_USER
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LANG=C.UTF-8
PYTHONDONTWRITEBYTECODE=1
XDG_RUNTIME_DIR=$RUN_DIR/user/xdg
DOCKER_HOST=unix://$RUN_DIR/docker.sock
CONTAINERS_CONF=$RUN_DIR/user/containers.conf
CONTAINERS_STORAGE_CONF=$RUN_DIR/user/storage.conf
CONTAINERS_REGISTRIES_CONF=$RUN_DIR/podman/registries.conf
ENV
as_user() {  # as_user COMMAND...: run it as the run's user, in the user's environment only
    local user_env
    mapfile -t user_env <"$RUN_DIR/user/env"
    (cd "$DATA_DIR/user" && setpriv --reuid="$uid" --regid="$gid" --init-groups --inh-caps=-all \
        env -i "${user_env[@]}" "$@")
}
log "user $CI_USER (uid $uid, group $CI_GROUP; subordinate ids $(cut -d: -f2,3 "$RUN_DIR/user.subuid"))"

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

# ---- dockerd: on a bridge made here (the machine's docker0, if any, is left as it is), its
# socket owned by the run's group, its configuration and identity key of its own (not
# /etc/docker's daemon.json and key.json)
echo "$DOCKER_BRIDGE" >>"$RUN_DIR/bridges"  # (the bridges down.sh removes: only these)
ip link add "$DOCKER_BRIDGE" type bridge
ip addr add "$DOCKER_ADDR/24" dev "$DOCKER_BRIDGE"
printf '{"deprecated-key-path": "%s"}\n' "$DATA_DIR/docker-key.json" >"$RUN_DIR/daemon.json"
setsid dockerd --host "$DOCKER_HOST" --containerd "$CONTAINERD_ADDRESS" \
    --config-file "$RUN_DIR/daemon.json" --group "$CI_GROUP" \
    --data-root "$DATA_DIR/docker" --exec-root "$RUN_DIR/docker-exec" \
    --pidfile "$RUN_DIR/dockerd.pidfile" --storage-driver overlay2 \
    --exec-opt native.cgroupdriver=cgroupfs \
    --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
    --bridge "$DOCKER_BRIDGE" --userland-proxy=false \
    >"$RUN_DIR/dockerd.log" 2>&1 </dev/null 7>&- 8>&- 9>&- &
echo $! >"$RUN_DIR/dockerd.pid"
wait_for 60 dockerd docker info
log "dockerd pid $(cat "$RUN_DIR/dockerd.pid")"
echo "$DNET_BRIDGE" >>"$RUN_DIR/bridges"
docker network create --subnet "${DNET_ADDR%.1}.0/24" --gateway "$DNET_ADDR" \
    -o "com.docker.network.bridge.name=$DNET_BRIDGE" nc-ci >/dev/null

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
default_network = "$CI_NAME"
default_subnet = "${POD_ADDR%.1}.0/24"

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
cat >"$RUN_DIR/podman/cni/$CI_NAME.conflist" <<CNI
{
  "cniVersion": "0.4.0",
  "name": "$CI_NAME",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$POD_BRIDGE",
      "isGateway": false,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$RUN_DIR/podman/cni-ipam",
        "routes": [{"dst": "0.0.0.0/0", "gw": "$POD_ADDR"}],
        "ranges": [[{"subnet": "${POD_ADDR%.1}.0/24", "gateway": "$POD_ADDR"}]]
      }
    }
  ]
}
CNI
echo "$POD_BRIDGE" >>"$RUN_DIR/bridges"
ip link add "$POD_BRIDGE" type bridge
ip addr add "$POD_ADDR/24" dev "$POD_BRIDGE"
ip link set "$POD_BRIDGE" up

# ---- the test image, from local files only (busybox-static: no libraries needed)
root="$RUN_DIR/box"
mkdir -p "$root"/{bin,etc,run,tmp,proc,sys,dev}
cp /bin/busybox "$root/bin/busybox"
for applet in sh sleep cat nc true ls; do ln -s busybox "$root/bin/$applet"; done
tar -C "$root" -cf "$root.tar" .
docker import "$root.tar" "$BOX" >/dev/null
"$RUN_DIR/bin/podman" import -q "$root.tar" "$BOX" >/dev/null
chmod 644 "$root.tar"
as_user podman import -q "$root.tar" "$BOX" >/dev/null
docker save "$BOX" -o "$root.image.tar"
ctr -n default images import "$root.image.tar" >/dev/null
rm -rf "$root" "$root.tar" "$root.image.tar"
log "built image $BOX for docker, podman, containerd and $CI_USER's rootless podman"
log "ready ($RUN_DIR/env)"

#!/usr/bin/env bash
# Take down what tests/engines/up.sh started and remove every trace of the run: containers,
# the daemons (by the PIDs up.sh recorded), their shims, mounts, bridges, the run and data
# directories (images, containers, networks, configuration). Safe to run again, and after a
# run that died half way (docs/netcut.md#engines-in-ci).
set -uo pipefail
RUN_DIR="${NETCUT_CI_RUN:-/run/netcut-ci}"
DATA_DIR="${NETCUT_CI_DATA:-/var/lib/netcut-ci}"
# shellcheck disable=SC1091
[[ -f "$RUN_DIR/env" ]] && source "$RUN_DIR/env"

stop() {  # stop PID NAME: SIGTERM, wait up to 20 s, then SIGKILL
    local pid=$1
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid"
    for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    echo "engines: stopped $2 (pid $pid)" >&2
}

# Containers first, while their engines still answer.
if [[ -S "$RUN_DIR/docker.sock" ]]; then
    docker ps -aq | xargs -r docker rm -f >/dev/null 2>&1
fi
if [[ -f "${CONTAINERS_CONF:-}" ]]; then
    podman rm -a -f -t 0 >/dev/null 2>&1
fi
run_namespaces=()
if [[ -S "$RUN_DIR/containerd.sock" ]]; then
    mapfile -t run_namespaces < <(ctr namespaces ls -q 2>/dev/null)
    for ns in "${run_namespaces[@]}"; do
        for t in $(ctr -n "$ns" tasks ls -q 2>/dev/null); do
            ctr -n "$ns" tasks kill -s KILL "$t" >/dev/null 2>&1
            ctr -n "$ns" tasks delete -f "$t" >/dev/null 2>&1
        done
        ctr -n "$ns" containers ls -q 2>/dev/null | xargs -r ctr -n "$ns" containers delete >/dev/null 2>&1
    done
fi
for name in dockerd containerd; do
    [[ -f "$RUN_DIR/$name.pid" ]] && stop "$(cat "$RUN_DIR/$name.pid")" "$name"
done
# What the daemons started and left (containerd shims, conmon): every process still running
# with our run directory on its command line.
for pid in $(pgrep -f -- "$RUN_DIR/" 2>/dev/null); do
    [[ "$pid" != "$$" ]] && stop "$pid" "$(ps -o comm= -p "$pid" 2>/dev/null)"
done
# Mounts under the run's directories (overlay roots, shm, netns), deepest first.
for dir in "$RUN_DIR" "$DATA_DIR"; do
    findmnt -rn -o TARGET | grep -F -- "$dir/" | sort -r | while read -r mnt; do
        umount -l "$mnt" 2>/dev/null
    done
done
# The bridges the engines made (dockerd leaves its bridges behind when it stops).
for link in ncpod0 docker0 $(cat "$RUN_DIR/bridges" 2>/dev/null); do
    ip link show "$link" >/dev/null 2>&1 && ip link del "$link"
done
# podman's CNI backend keeps each container's network result under libcni's fixed
# /var/lib/cni/results, named after the network (ours: netcut-ci), until the container's
# network is torn down; one a killed run left is ours by its name.
rm -f /var/lib/cni/results/netcut-ci-*
# Paths podman, runc and the CNI plugins write whatever their configuration, which up.sh found
# absent: the run created them, so what it put there goes (the short-name alias lock
# containers/image takes under /var/cache/containers, the CNI results directory, runc's
# state root /run/runc), then the directories, only those now empty. Anything else found
# there stays, for leftovers.sh to report.
if [[ -f "$RUN_DIR/created" ]]; then
    while read -r path; do
        rm -f "$path/short-name-aliases.conf.lock"
        [[ -d "$path" ]] && find "$path" -depth -type d -empty -delete 2>/dev/null
    done <"$RUN_DIR/created"
fi
rm -rf --one-file-system "$RUN_DIR" "$DATA_DIR"
# containerd's shim keeps runc's state under the fixed /run/containerd/runc/NAMESPACE and its
# sockets and fifos under /run/containerd/{s,fifo}, whatever the daemon's root: remove what the
# run's tasks left there, directories only and only when empty, so that a containerd serving
# this machine is never touched.
SHIM_DIR="${NETCUT_CONTAINERD_SHIM_DIR:-/run/containerd}"
for ns in "${run_namespaces[@]}"; do
    rmdir "$SHIM_DIR/runc/$ns" 2>/dev/null
done
for dir in "$SHIM_DIR/runc" "$SHIM_DIR/s" "$SHIM_DIR/fifo" "$SHIM_DIR"; do
    rmdir "$dir" 2>/dev/null
done
exit 0

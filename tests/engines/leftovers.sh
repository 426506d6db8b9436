#!/usr/bin/env bash
# List what an earlier engine run left on this machine, one line each; exit 1 if anything.
# A check, never a cleanup (tests/engines/down.sh removes it): .ci/run runs it before and
# after the tests (docs/netcut.md#engines-in-ci).
#
#   leftovers.sh                 what an earlier run left
#   leftovers.sh --record FILE   the same, and record the machine's podman state in FILE
#   leftovers.sh --since FILE    the same, and what was created or changed in the machine's
#                                podman state since FILE was recorded
#
# The machine's podman state (podman's default store and blob info cache /var/lib/containers,
# libcni's /var/lib/cni, the short-name alias cache /var/cache/containers, runc's /run/runc)
# may be the machine's own, so its mere presence is no leftover: what counts is what appeared
# or changed there while a run held the machine (files by size and modification time,
# directories by existence). None of it comes from a Debian package, which the run may
# install.
set -uo pipefail
RUN_DIR="${NETCUT_CI_RUN:-/run/netcut-ci}"
DATA_DIR="${NETCUT_CI_DATA:-/var/lib/netcut-ci}"
read -r -a MACHINE <<<"${NETCUT_MACHINE_PATHS:-/var/lib/containers /var/lib/cni /var/cache/containers /run/runc}"
found=0
say() { echo "left over: $*"; found=1; }

machine_state() {  # one line per file or directory under the machine's podman paths
    local path
    for path in "${MACHINE[@]}"; do
        [[ -e "$path" ]] && find "$path" \( -type d -printf 'd - %p\n' \) -o -printf '%y %s:%T@ %p\n'
    done | sort
}
case "${1:-}" in
--record) machine_state >"$2" ;;
--since)
    while read -r _ _ path; do
        say "$path (created or changed during the run: podman's machine-wide state)"
    done < <(comm -13 "$2" <(machine_state))
    ;;
esac

for dir in "$RUN_DIR" "$DATA_DIR"; do
    [[ -e "$dir" ]] && say "$dir (engine state, images, containers, networks)"
done
for pid in $(pgrep -f -- "$RUN_DIR/" 2>/dev/null); do
    [[ "$pid" != "$$" ]] && say "process $pid: $(ps -o args= -p "$pid" 2>/dev/null | cut -c1-120)"
done
findmnt -rn -o TARGET | grep -F -e "$RUN_DIR/" -e "$DATA_DIR/" | while read -r mnt; do
    echo "left over: mount $mnt"
done | grep . && found=1
# The engines' bridges: fixed names, and docker's user networks on 198.19.240.0/20.
while read -r link _ addrs; do
    case "$link" in
        ncpod0 | docker0) say "bridge $link" ;;
        br-*) [[ "$addrs" == *198.19.2[45]?.* ]] && say "bridge $link ($addrs)" ;;
    esac
done < <(ip -br -4 addr show 2>/dev/null)
ip -br link show ncpod0 >/dev/null 2>&1 && ! ip -br -4 addr show ncpod0 | grep -q . && say "bridge ncpod0"
# podman's CNI results of the run's network (libcni keeps them under its fixed cache dir).
for file in /var/lib/cni/results/netcut-ci-*; do
    [[ -e "$file" ]] && say "$file (a CNI result of the run's podman network)"
done
# containerd's shims write under the fixed /run/containerd whatever the daemon's root: a tree
# there without a file or socket in it, while no containerd runs, is what a run left (a machine's
# own containerd keeps its socket there).
SHIM_DIR="${NETCUT_CONTAINERD_SHIM_DIR:-/run/containerd}"
if [[ -d "$SHIM_DIR" ]] && ! pgrep -x containerd >/dev/null &&
    [[ -z "$(find "$SHIM_DIR" -mindepth 1 ! -type d -print -quit 2>/dev/null)" ]]; then
    say "$SHIM_DIR ($(find "$SHIM_DIR" -mindepth 1 -type d | wc -l) empty directories of containerd's shims)"
fi
# Configuration that older versions of up.sh wrote machine-wide.
for file in /etc/containers/containers.conf /etc/cni/net.d/50-netcut-ci.conflist; do
    grep -qs "netcut-ci" "$file" && say "$file (written by an earlier tests/engines/up.sh)"
done
exit "$found"

#!/usr/bin/env bash
# List what an earlier engine run left on this machine, one line each; exit 1 if anything.
# A check, never a cleanup (tests/engines/down.sh removes it): .ci/run runs it before and
# after the tests (docs/netcut.md#engines-in-ci).
#
#   leftovers.sh                 what an earlier run left
#   leftovers.sh --record FILE   the same, and record the machine's podman state in FILE
#                                and its bridges (not the run's) in FILE.bridges
#   leftovers.sh --since FILE    the same, and what was created or changed in the machine's
#                                podman state since FILE was recorded, and each of the
#                                machine's bridges deleted or re-addressed since
#
# The machine's podman state (podman's default store and blob info cache /var/lib/containers,
# libcni's /var/lib/cni, the short-name alias cache /var/cache/containers, runc's /run/runc)
# may be the machine's own, so its mere presence is no leftover: what counts is what appeared
# or changed there while a run held the machine (files by size and modification time,
# directories by existence). None of it comes from a Debian package, which the run may
# install.
#
# Everything else it checks is the run's by name or address (tests/engines/instance.sh: the
# same variables as up.sh), so the machine's own engines are never counted: their bridges
# (docker0 with its own address), users, /run/containerd with a containerd running.
set -uo pipefail
# shellcheck source=tests/engines/instance.sh
source "$(dirname "$0")/instance.sh"
read -r -a MACHINE <<<"${NETCUT_MACHINE_PATHS:-/var/lib/containers /var/lib/cni /var/cache/containers /run/runc}"
found=0
say() { echo "left over: $*"; found=1; }

machine_state() {  # one line per file or directory under the machine's podman paths
    local path
    for path in "${MACHINE[@]}"; do
        [[ -e "$path" ]] && find "$path" \( -type d -printf 'd - %p\n' \) -o -printf '%y %s:%T@ %p\n'
    done | sort
}
machine_bridges() {  # "NAME IPV4-ADDRESSES" of every bridge that is not one of the run's
    local link addrs v4 addr
    ip -br addr show type bridge 2>/dev/null | while read -r link _ addrs; do
        [[ " ${CI_BRIDGE_NAMES[*]} " == *" $link "* ]] && continue
        v4=-
        for addr in $addrs; do [[ "$addr" == *.* ]] && v4="${v4#-} $addr"; done
        echo "$link ${v4# }"
    done | sort
}
case "${1:-}" in
--record)
    machine_state >"$2"
    machine_bridges >"$2.bridges"
    ;;
--since)
    while read -r _ _ path; do
        say "$path (created or changed during the run: podman's machine-wide state)"
    done < <(comm -13 "$2" <(machine_state))
    # The machine's bridges (its own docker0 among them) as they were: none deleted or
    # re-addressed by the run.
    while read -r link addrs; do
        now=$(machine_bridges | awk -v l="$link" '$1 == l { $1 = ""; sub(/^ /, ""); print }')
        [[ "$now" == "$addrs" ]] ||
            say "bridge $link (the machine's) was ${addrs}, is now ${now:-gone}: the run changed it"
    done <"$2.bridges"
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
# The run's bridges, by name; a bridge holding an address of the run's subnets, by address
# (nc-ci's br-<id> and the re-addressed docker0 of versions of up.sh before the bridges had
# names of their own). docker0 with any other address is the machine's.
for link in "${CI_BRIDGE_NAMES[@]}"; do
    ip link show "$link" >/dev/null 2>&1 && say "bridge $link"
done
while read -r link _ addrs; do
    [[ " ${CI_BRIDGE_NAMES[*]} " == *" ${link%@*} "* ]] && continue
    for net in 198.19.$CI_NET 198.19.$((CI_NET + 1)) 198.19.$((CI_NET + 2)); do
        [[ " $addrs" == *" $net."* ]] && say "bridge $link ($addrs: the run's subnet $net.0/24)"
    done
done < <(ip -br -4 addr show type bridge 2>/dev/null)
# The run's user and group, their subordinate ids, ACL entries of a user that no longer
# exists (or of the run's) on the directories up.sh lets the user cross.
for id in "$CI_USER" "$CI_GROUP"; do
    getent passwd "$id" >/dev/null && say "user $id (the run's unprivileged user)"
    getent group "$id" >/dev/null && say "group $id"
done
for file in /etc/subuid /etc/subgid; do
    grep -s "^$CI_USER:" "$file" | while read -r line; do say "$file: $line"; done
done | grep . && found=1
run_uid=$(id -u "$CI_USER" 2>/dev/null)
checkout=$(cd "$(dirname "$0")/../.." && pwd)
for path in "$checkout" "$checkout"/.venv*/bin/python "$checkout"/.venv-frameworks/*/bin/python; do
    [[ -e "$path" ]] || continue
    dir=$(realpath "$path")
    while [[ "$dir" != / ]]; do
        dir=$(dirname "$dir")
        echo "$dir"
    done
done | sort -u | while read -r dir; do
    getfacl -pn "$dir" 2>/dev/null | while IFS=: read -r tag who _; do
        # (4294967295: a uid not mapped into this user namespace, which cannot be told)
        [[ "$tag" == user && -n "$who" && "$who" != 4294967295 ]] || continue
        if [[ "$who" == "${run_uid:-}" ]] || ! getent passwd "$who" >/dev/null; then
            echo "left over: ACL entry user:$who on $dir"
        fi
    done
done | grep . && found=1
# podman's CNI results of the run's network (libcni keeps them under its fixed cache dir).
for file in /var/lib/cni/results/"$CI_NAME"-*; do
    [[ "${file##*/}" =~ ^$CI_NAME-[0-9a-f]{64}- ]] &&
        say "$file (a CNI result of the run's podman network)"
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

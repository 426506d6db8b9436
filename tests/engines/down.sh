#!/usr/bin/env bash
# Take down what tests/engines/up.sh started and remove every trace of the run: containers,
# the daemons (by the PIDs up.sh recorded), their shims, the run's user's processes, mounts,
# the bridges, user, group, subordinate ids and ACL entries up.sh recorded, the run and data
# directories (images, containers, networks, configuration). Nothing up.sh did not record is
# removed: the machine's own engines, bridges (docker0) and users stay as they are. Safe to
# run again, and after a run that died half way (docs/netcut.md#engines-in-ci).
set -uo pipefail
# shellcheck source=tests/engines/instance.sh
source "$(dirname "$0")/instance.sh"
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
# The user's rootless containers, then every process of the run's user (rootless podman's
# pause process and slirp4netns among them): the user exists for the run only.
read -r user_uid user_gid 2>/dev/null <"$RUN_DIR/user.ids"
if [[ -n "${user_uid:-}" && -f "$RUN_DIR/user/env" ]]; then
    mapfile -t user_env <"$RUN_DIR/user/env"
    (cd / && timeout 60 setpriv --reuid="$user_uid" --regid="$user_gid" --clear-groups \
        --inh-caps=-all env -i "${user_env[@]}" podman rm -a -f -t 0 >/dev/null 2>&1)
fi
if [[ -n "${user_uid:-}" ]]; then
    for pid in $(pgrep -U "$user_uid" 2>/dev/null); do
        stop "$pid" "$(ps -o comm= -p "$pid" 2>/dev/null) of uid $user_uid"
    done
fi
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
# The bridges up.sh recorded (it made them, or dockerd did for nc-ci and leaves it when it
# stops); never another: the machine's docker0 is the machine's.
while read -r link; do
    ip link show "$link" >/dev/null 2>&1 && ip link del "$link"
done < <(cat "$RUN_DIR/bridges" 2>/dev/null)
# The traverse ACL entries, the subordinate id ranges, then the user and group up.sh added.
# (a directory that had no ACL beyond its mode bits gets none again once no other named
# entry is left, another run's say: removing the entry alone would leave the mask entry)
while read -r kind dir; do
    [[ -n "${user_uid:-}" && -e "$dir" ]] || continue
    setfacl -x "u:$user_uid" "$dir" 2>/dev/null
    if [[ "$kind" == minimal ]] && ! getfacl -cp "$dir" 2>/dev/null | grep -qE '^(user|group):[^:]+:'; then
        setfacl -b "$dir"
    fi
done < <(cat "$RUN_DIR/acl" 2>/dev/null)
for file in subuid subgid; do
    while IFS=: read -r name start count; do
        [[ -n "$count" ]] && usermod "--del-sub${file#sub}s" "$start-$((start + count - 1))" "$name"
    done < <(cat "$RUN_DIR/user.$file" 2>/dev/null)
done
while read -r kind name; do
    case "$kind" in
        user) userdel "$name" 2>/dev/null ;;
    esac
done < <(cat "$RUN_DIR/accounts" 2>/dev/null)
while read -r kind name; do
    case "$kind" in
        group) getent group "$name" >/dev/null && groupdel "$name" ;;
    esac
done < <(cat "$RUN_DIR/accounts" 2>/dev/null)
while read -r file; do
    [[ -s "$file" ]] || rm -f "$file"
done < <(cat "$RUN_DIR/created-files" 2>/dev/null)
# podman's CNI backend keeps each container's network result under libcni's fixed
# /var/lib/cni/results, named NETWORK-CONTAINERID-IFNAME, until the container's network is
# torn down; one a killed run left is ours by its network's name.
for file in /var/lib/cni/results/"$CI_NAME"-*; do
    [[ "${file##*/}" =~ ^$CI_NAME-[0-9a-f]{64}- ]] && rm -f "$file"
done
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

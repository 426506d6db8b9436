#!/usr/bin/env bash
# Stop the daemons tests/engines/up.sh started, by the PIDs it recorded (containers first).
set -uo pipefail
RUN_DIR="${NETCUT_CI_RUN:-/run/netcut-ci}"
[[ -f "$RUN_DIR/env" ]] && source "$RUN_DIR/env"

stop() {  # stop NAME: SIGTERM the recorded PID, wait up to 20 s, then SIGKILL
    local file="$RUN_DIR/$1.pid" pid
    [[ -f "$file" ]] || return 0
    pid=$(cat "$file")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$file"
    echo "engines: stopped $1 (pid $pid)" >&2
}

# Another caller of up.sh (a concurrent .ci/run) still alive keeps the daemons running.
exec 9>"$RUN_DIR/users.lock"
flock 9
others=()
if [[ -f "$RUN_DIR/users" ]]; then
    while read -r user; do
        [[ "$user" != "$PPID" ]] && kill -0 "$user" 2>/dev/null && others+=("$user")
    done <"$RUN_DIR/users"
fi
printf '%s\n' "${others[@]}" | grep . >"$RUN_DIR/users"
if ((${#others[@]})); then
    echo "engines: left running for ${#others[@]} other caller(s): ${others[*]}" >&2
    exit 0
fi

# Test containers are named nc-*; remove any a failed run left behind.
if [[ -S "$RUN_DIR/docker.sock" ]]; then
    docker ps -aq --filter name=nc- | xargs -r docker rm -f >/dev/null 2>&1
fi
podman ps -aq --filter name=nc- | xargs -r podman rm -f >/dev/null 2>&1
if [[ -S "$RUN_DIR/containerd.sock" ]]; then
    for t in $(ctr -n default tasks ls -q 2>/dev/null | grep '^nc-'); do
        ctr -n default tasks kill -s KILL "$t" >/dev/null 2>&1
        ctr -n default tasks delete -f "$t" >/dev/null 2>&1
    done
    ctr -n default containers ls -q 2>/dev/null | grep '^nc-' | xargs -r ctr -n default containers delete >/dev/null 2>&1
fi
stop dockerd
stop containerd
# The bridges the engines made (dockerd leaves its bridges behind when it stops).
for link in ncpod0 docker0 $(cat "$RUN_DIR/bridges" 2>/dev/null); do
    ip link show "$link" >/dev/null 2>&1 && ip link del "$link"
done
exit 0

#!/usr/bin/env bash
# Stops exactly the daemons scripts/slurm/start.sh started (by their recorded PIDs, each checked
# to still be that daemon), waits for them to exit (SIGKILL after 10 s), and removes the
# /etc/slurm/slurm.conf link start.sh made. Safe to run twice; leaves every other process alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
state=$(realpath -m "${CFM_SLURM_DIR:-.slurm}")

pids=()
for name in slurmd slurmctld munged; do
    pidfile=$state/$name.pid
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "^$name "; then
        kill -TERM "$pid"
        pids+=("$pid")
        echo "stop.sh: stopping $name ($pid)"
    fi
    rm -f "$pidfile"
done
for pid in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fi
done

# the default-path link start.sh made, if it still points into this state dir
sysconf=/etc/slurm/slurm.conf
if [ "$(readlink "$sysconf" 2>/dev/null)" = "$state/slurm.conf" ]; then
    rm -f "$sysconf"
fi

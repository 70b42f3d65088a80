#!/usr/bin/env bash
# Installs Debian's Slurm (slurmctld, slurmd, client tools) and munge for the single-node test
# cluster of scripts/slurm/start.sh. Idempotent: a quick no-op when everything is present.
set -euo pipefail
need=()
command -v slurmctld >/dev/null || need+=(slurmctld)
command -v slurmd >/dev/null || need+=(slurmd)
command -v srun >/dev/null || need+=(slurm-client)
command -v munged >/dev/null || need+=(munge)
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    sudo=sudo
else
    sudo=
fi
echo "install.sh: installing ${need[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null

#!/usr/bin/env bash
# Installs Debian's Slurm (slurmctld, slurmd, client tools) and munge for the single-node test
# cluster of scripts/slurm/start.sh. Idempotent and non-interactive: a no-op when every tool is
# present; `apt-get update` only when the package lists are missing or the install fails without.
# Needs root (or sudo) and apt-get; otherwise it stops with an error saying what is missing.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
have() { command -v "$1" >/dev/null || [ -x "/usr/sbin/$1" ]; }  # sbin: off a user's PATH
need=()
have slurmctld || need+=(slurmctld)
have slurmd || need+=(slurmd)
have srun || need+=(slurm-client)
have munged || need+=(munge)
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
command -v apt-get >/dev/null || {
    echo "install.sh: ${need[*]} missing and no apt-get: install Debian's ${need[*]} by hand" >&2
    exit 1
}
if [ "$(id -u)" -eq 0 ]; then
    sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo=(sudo -n env DEBIAN_FRONTEND=noninteractive)
else
    echo "install.sh: ${need[*]} missing: installing them needs root (or password-less sudo)" >&2
    exit 1
fi
echo "install.sh: installing ${need[*]}"
apt_install() {
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${need[@]}" >/dev/null
}
if compgen -G "/var/lib/apt/lists/*_Packages*" >/dev/null && apt_install; then
    exit 0
fi
"${sudo[@]}" apt-get update -qq
apt_install

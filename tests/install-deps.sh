#!/usr/bin/env bash
# Install what the test suite needs on a fresh Debian machine: system tools for the SSH test cluster
# (sshd in network namespaces, strace, gdb, iptables, tini) and the Python packages. Idempotent and quick
# when everything is already there. Needs root for apt-get (the cluster tests need root anyway).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

need=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
command -v strace >/dev/null 2>&1 || need+=(strace)
command -v gdb >/dev/null 2>&1 || need+=(gdb)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || need+=(iptables)
command -v tini >/dev/null 2>&1 || need+=(tini)
command -v tmux >/dev/null 2>&1 || need+=(tmux)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
command -v ps >/dev/null 2>&1 || need+=(procps)
[ -x /usr/bin/python3 ] || need+=(python3)  # Debian's own python3: "a python without torch or py-spy" in tests
command -v sudo >/dev/null 2>&1 || need+=(sudo)  # `sudo -n` needing a password is a fault-matrix row
{ [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ] && command -v srun >/dev/null 2>&1; } || need+=(slurmctld slurmd slurm-client munge)  # the SLURM test bed
command -v chromium >/dev/null 2>&1 || need+=(chromium fonts-liberation)  # report.html is rendered in tests
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)  # an mpirun launch in test_cluster_launchers.py
if [ ${#need[@]} -gt 0 ]; then
  echo "installing system packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# torch first, pinned: the CPU build; the project itself never pulls torch in.
"$PY" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null \
  || "$PY" -m pip install -q torch==2.13.0
"$PY" -m pip install -q -e '.[test]'

#!/usr/bin/env bash
# scripts/cluster_vm.sh -- a cluster in a box: N hosts, each its own network namespace with its
# own address, Soft-RoCE device and sshd, inside ONE throw-away qemu guest; runs COMMAND in the
# guest (as the operator's machine: it reaches every host over ssh) and exits with its status.
#
#   usage: scripts/cluster_vm.sh [--hosts N] [--] COMMAND [ARGS...]      (N = 4)
#     scripts/cluster_vm.sh -- ssh -F /run/herd-cluster/ssh_config h2 ibv_devices
#     scripts/cluster_vm.sh --hosts 5 -- /usr/bin/python3 scripts/herd_exp.py run \
#         bench/experiments/cluster_rxe.yaml --no-build --out /tmp/cluster
#
# Host i is h<i> at 10.98.0.<i> with device rxe<i> (GID index 1), bridged to the guest's own
# namespace at 10.98.0.254; ssh takes the run's key only (HERD_CLUSTER_DIR=/run/herd-cluster:
# id_ed25519, known_hosts, ssh_config). Every address belongs to the guest; nothing leaves it.
# After COMMAND, anything still running on a host (besides its sshd) is named, and a command that
# passed exits 3. The guest kernel is trixie-backports' (rxe in network namespaces needs one newer
# than Debian 12's); binaries built here run unchanged (see scripts/rxe_vm.sh for the guest and its
# HERD_VM_* settings, e.g. HERD_VM_RW for a results folder).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
hosts=4
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=${2:?--hosts needs a number}; shift 2 ;;
    --) shift; break ;;
    -*) echo "cluster_vm.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -eq 0 ]; then
  sed -n '2,17p' "$0" >&2
  exit 2
fi
[[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] ||
  { echo "cluster_vm.sh: --hosts must be a positive number" >&2; exit 2; }
HERD_VM_KERNEL=netns exec "$here/rxe_vm.sh" "$here/lib/cluster_guest.sh" "$hosts" "$@"

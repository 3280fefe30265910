#!/usr/bin/env bash
# scripts/setup.sh -- install what herd needs from Debian's packages, and nothing that is already
# there. Safe to run any number of times; every other script calls it first.
#
#   usage: scripts/setup.sh [--quiet]
#
# Needs root (or passwordless sudo) only when something is missing.
set -euo pipefail

quiet=0
[ "${1:-}" = "--quiet" ] && quiet=1
say() { [ "$quiet" = 1 ] || echo "[setup] $*" >&2; }

# Build and test: Bazel (Debian's bootstrap build, WORKSPACE mode), a compiler, pkg-config and the
# -dev packages that third_party/system_libs.bzl asks pkg-config about.
PACKAGES=(
  bazel-bootstrap g++ pkg-config clang-format python3
  libabsl-dev libgflags-dev libgoogle-glog-dev libgtest-dev libgmock-dev
  libhwloc-dev libibverbs-dev librdmacm-dev ibverbs-providers rdma-core
  # scripts/: the experiment runner and its plots, and the memcached baseline.
  python3-yaml python3-matplotlib memcached openssh-server openssh-client
  # compare.py --profile (scripts/cost_breakdown.py): perf record of both sides.
  linux-perf
  # scripts/rxe_vm.sh: a qemu guest with Soft-RoCE (the kernel .deb is fetched, not installed),
  # and perftest for the same-VM baseline.
  qemu-system-x86 busybox-static cpio kmod iproute2 ibverbs-utils perftest rdmacm-utils
  # scripts/cluster_vm.sh: the guest kernel of trixie-backports (fetched with curl, unpacked).
  curl xz-utils gpgv debian-archive-keyring
  # scripts/original_herd_rxe.sh: building the original HERD (rdma_bench's libhrd links
  # libmemcached for its QP registry, and libnuma) and its registry at run time (memcached).
  libmemcached-dev libnuma-dev
  # herd/replication's coordinator: Debian's ZooKeeper server (started privately on loopback by
  # scripts/zk.sh for tests and scripts, never as the system service) and its C client.
  zookeeper libzookeeper-mt-dev default-jre-headless
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  say "all ${#PACKAGES[@]} packages present"
  exit 0
fi

say "installing: ${missing[*]}"
SUDO=()
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
  else
    echo "[setup] error: missing packages (${missing[*]}) and not root." >&2
    echo "[setup] run as root: apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
# A fresh machine's package lists may be empty or stale; refresh once per install.
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
say "done"

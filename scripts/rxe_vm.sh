#!/usr/bin/env bash
# scripts/rxe_vm.sh -- run one command on a real verbs device: Soft-RoCE (rdma_rxe) inside a
# throw-away qemu guest. Streams the command's output; exits with its exit status.
#
#   usage: scripts/rxe_vm.sh [--] COMMAND [ARGS...]
#     scripts/rxe_vm.sh ibv_devinfo -v
#     scripts/rxe_vm.sh bazel-bin/tests/transport/conformance_test --gtest_filter='*/verbs'
#
# Why a VM: this kind of machine's kernel has no RDMA support, so rdma_rxe cannot load here.
# The guest boots Debian's stock kernel (taken out of its .deb into a cache, never installed)
# under TCG, with a busybox initramfs. Its root is the host's "/" read-only over virtio-9p with
# a tmpfs overlay on top, so freshly built binaries and the host's rdma-core run unchanged, in
# the same working directory. The guest has no NIC: a dummy interface at 10.99.0.1 carries rxe0
# (RoCE v2, GID index 1 = ::ffff:10.99.0.1); servers and clients in the guest all use rxe0 and
# reach each other there. Binaries run here must not be built with -march=native (no AVX-512).
#
# Environment:
#   HERD_VM_CACHE    kernel + initramfs cache       (${XDG_CACHE_HOME:-~/.cache}/herd/rxe-vm)
#   HERD_VM_TIMEOUT  seconds before the guest is killed, all boots together (600)
#   HERD_VM_MEM      guest memory (2G)             HERD_VM_CPUS  guest vCPUs (host's count)
#   HERD_VM_MTU      MTU of the dummy netdev (1500: rxe's active MTU is then 1024)
#   HERD_VM_RW       colon-separated host dirs the guest may write (same paths), e.g. results
#   HERD_VM_ENV      names of environment variables to pass to the command
#   HERD_VM_CONSOLE=1  print the guest's kernel console after the run (after each boot)
#   HERD_VM_BOOTS    boots to try when the guest stops before it runs the command (2: a kernel
#                    that panics while booting under TCG, rarely, costs one more boot)
#   HERD_VM_APPEND   more kernel command-line arguments (debugging)
#   HERD_VM_KERNEL   stock: Debian 12's kernel (6.1: rxe sends and receives only in the initial
#                    network namespace); netns: the newest kernel of trixie-backports, whose rxe
#                    has a RoCE socket per network namespace (scripts/cluster_vm.sh needs it)
set -euo pipefail
cd_back=$PWD
here=$(cd "$(dirname "$0")" && pwd)

cache=${HERD_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/herd/rxe-vm}
timeout_s=${HERD_VM_TIMEOUT:-600}
mem=${HERD_VM_MEM:-2G}
cpus=${HERD_VM_CPUS:-$(nproc)}
mtu=${HERD_VM_MTU:-1500}
rw_dirs=${HERD_VM_RW:-}
flavor=${HERD_VM_KERNEL:-stock}
[[ "$timeout_s" =~ ^[1-9][0-9]*$ ]] ||
  { echo "rxe_vm.sh: HERD_VM_TIMEOUT=$timeout_s: want whole seconds" >&2; exit 2; }
boot_tries=${HERD_VM_BOOTS:-2}
[[ "$boot_tries" =~ ^[1-9][0-9]*$ ]] ||
  { echo "rxe_vm.sh: HERD_VM_BOOTS=$boot_tries: want a count of boots" >&2; exit 2; }

[ "${1:-}" = "--" ] && shift
if [ $# -eq 0 ]; then
  sed -n '2,30p' "$0" >&2
  exit 2
fi
log() { echo "[rxe_vm] $*" >&2; }

"$here/setup.sh" --quiet

# Kernel modules the guest loads, in order (their dependencies are copied in too). rxe asks the
# crypto API for "crc32" at run time, which no module dependency names: crc32_generic provides it
# (on kernels that still have it). veth and bridge carry scripts/cluster_vm.sh's hosts.
modules="virtio_pci 9pnet_virtio 9p overlay dummy veth bridge crc32_generic ib_core ib_uverbs"
modules="$modules rdma_rxe rdma_ucm"

# ---------------------------------------------------------------- the guest kernel, cached
# stock: Debian 12's linux-image-amd64, through apt. netns: trixie-backports' newest, through its
# package index (this machine's apt has no such source; nothing is installed or configured),
# checked as apt would: the release file's signature against Debian's archive keyring, the index
# against the release file's SHA256, each package against the index's.
BACKPORTS=https://deb.debian.org/debian
BACKPORTS_RELEASE=$BACKPORTS/dists/trixie-backports/InRelease
BACKPORTS_INDEX=$BACKPORTS/dists/trixie-backports/main/binary-amd64/Packages.xz
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
case "$flavor" in
  stock | netns) ;;
  *) log "HERD_VM_KERNEL=$flavor: expected stock or netns"; exit 2 ;;
esac
kcache="$cache/$flavor"
mkdir -p "$kcache"
exec 8>"$cache/lock"
flock 8  # one builder at a time; concurrent runs share the result
if [ ! -f "$kcache/kernel.done" ]; then
  rm -rf "$kcache/kernel" "$kcache/deb"
  mkdir -p "$kcache/kernel" "$kcache/deb"
  if [ "$flavor" = stock ]; then
    kernel_package() {
      apt-cache depends linux-image-amd64 2>/dev/null |
        awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
    }
    package=$(kernel_package)
    if [ -z "$package" ]; then  # empty package lists on a fresh machine
      apt-get update -qq >&2 || true
      package=$(kernel_package)
    fi
    [ -n "$package" ] || { log "cannot find Debian's linux-image-amd64 (apt sources?)"; exit 1; }
    log "fetching $package into $kcache (unpacked, not installed)"
    (cd "$kcache/deb" && apt-get download "$package" >&2)
  else
    check_sha256() {  # check_sha256 FILE WANT: dies unless FILE's sha256 is WANT
      [ -n "$2" ] && [ "$(sha256sum <"$1" | cut -d' ' -f1)" = "$2" ] ||
        { log "$(basename "$1"): sha256 does not match the signed index: not used"; exit 1; }
    }
    curl -fsS -o "$kcache/deb/InRelease" "$BACKPORTS_RELEASE" ||
      { log "cannot fetch $BACKPORTS_RELEASE"; exit 1; }
    gpgv --keyring "$KEYRING" --output "$kcache/deb/Release" "$kcache/deb/InRelease" \
      2>/dev/null || { log "$BACKPORTS_RELEASE: no valid Debian archive signature"; exit 1; }
    index_sha256=$(awk '/^SHA256:/ {on = 1; next} /^[^ ]/ {on = 0}
      on && $3 == "main/binary-amd64/Packages.xz" {print $1}' "$kcache/deb/Release")
    curl -fsS -o "$kcache/deb/Packages.xz" "$BACKPORTS_INDEX" ||
      { log "cannot fetch $BACKPORTS_INDEX"; exit 1; }
    check_sha256 "$kcache/deb/Packages.xz" "$index_sha256"
    xz -dc "$kcache/deb/Packages.xz" >"$kcache/deb/Packages"
    field() {  # field PACKAGE NAME: the index's NAME: line of PACKAGE's stanza
      awk -v p="Package: $1" -v f="$2:" '$0 == p {on = 1} on && $1 == f {print; exit}' \
        "$kcache/deb/Packages"
    }
    # linux-image-amd64 depends on linux-image-VERSION-amd64, which is linux-binary-VERSION
    # (vmlinuz) and linux-modules-VERSION.
    version=$(field linux-image-amd64 Depends | grep -o 'linux-image-[0-9][^ ,]*-amd64' |
      head -n 1 | sed 's/^linux-image-//')
    [ -n "$version" ] || { log "no linux-image-amd64 in $BACKPORTS_INDEX"; exit 1; }
    for package in "linux-binary-$version" "linux-modules-$version"; do
      file=$(field "$package" Filename | awk '{print $2}')
      [ -n "$file" ] || { log "$package is not in $BACKPORTS_INDEX"; exit 1; }
      log "fetching $package into $kcache (unpacked, not installed)"
      curl -fsS -o "$kcache/deb/$(basename "$file")" "$BACKPORTS/$file" ||
        { log "cannot fetch $BACKPORTS/$file"; exit 1; }
      check_sha256 "$kcache/deb/$(basename "$file")" "$(field "$package" SHA256 | awk '{print $2}')"
    done
    rm "$kcache/deb/Packages" "$kcache/deb/Packages.xz" "$kcache/deb/InRelease" \
      "$kcache/deb/Release"
  fi
  for deb in "$kcache"/deb/*.deb; do dpkg-deb -x "$deb" "$kcache/kernel"; done
  rm -rf "$kcache/deb"
  touch "$kcache/kernel.done"
fi
# Debian 12 keeps modules under lib/, later releases under usr/lib/ (and vmlinuz beside them).
kroot="$kcache/kernel"
[ -d "$kroot/lib/modules" ] || kroot="$kcache/kernel/usr"
kver=$(ls "$kroot/lib/modules" | head -n 1)
vmlinuz=
for candidate in "$kcache/kernel/boot/vmlinuz-$kver" "$kroot/lib/modules/$kver/vmlinuz"; do
  [ -f "$candidate" ] && vmlinuz=$candidate && break
done
[ -n "$kver" ] && [ -n "$vmlinuz" ] || { log "no kernel unpacked in $kcache (remove it)"; exit 1; }
[ -f "$kroot/lib/modules/$kver/modules.dep" ] || depmod -b "$kroot" "$kver" 2>/dev/null

# ---------------------------------------------------------------- the initramfs, cached
# It holds busybox, the modules and /init (the block at the end of this file). Its checksum covers
# this script, so editing the guest side rebuilds it.
initrd="$kcache/initrd-$kver.gz"
stamp=$(cat "$0" | md5sum | cut -c1-16)
if [ ! -f "$initrd" ] || [ "$(cat "$kcache/initrd.stamp" 2>/dev/null)" != "$stamp" ]; then
  log "building the initramfs for $kver"
  tree=$(mktemp -d "$kcache/initramfs.XXXXXX")
  mkdir -p "$tree"/{bin,proc,sys,dev,xfer,host,upper,root}
  cp /bin/busybox "$tree/bin/busybox"
  for m in $modules; do
    # (A module built into this kernel, or one it no longer has, has nothing to copy.)
    { modprobe --dirname "$kroot" --set-version "$kver" --show-depends "$m" 2>/dev/null ||
      true; } | awk '$1 == "insmod" {print $2}'
  done | sort -u | while read -r ko; do
    dest="$tree/lib/modules/$kver/${ko#"$kroot/lib/modules/$kver/"}"
    mkdir -p "$(dirname "$dest")"
    cp "$ko" "$dest"
    # busybox's modprobe may not read compressed modules: store them plain.
    case "$dest" in *.xz) xz -d "$dest" ;; *.zst) zstd -q -d --rm "$dest" ;; esac
  done
  for list in modules.order modules.builtin modules.builtin.modinfo; do  # not in every package
    [ ! -f "$kroot/lib/modules/$kver/$list" ] || cp "$kroot/lib/modules/$kver/$list" \
      "$tree/lib/modules/$kver/"
  done
  depmod -b "$tree" "$kver" 2>/dev/null
  sed -n '/^#>>> guest init$/,/^#<<< guest init$/p' "$0" | sed '1d;$d' >"$tree/init.body"
  { echo '#!/bin/busybox sh'; echo "MODULES='$modules'"; cat "$tree/init.body"; } >"$tree/init"
  rm "$tree/init.body"
  chmod 755 "$tree/init"
  (cd "$tree" && find . | cpio -o -H newc --quiet | gzip -1) >"$initrd.tmp"
  mv "$initrd.tmp" "$initrd"
  echo "$stamp" >"$kcache/initrd.stamp"
  rm -rf "$tree"
fi
flock -u 8
exec 8>&-

# ---------------------------------------------------------------- one run
run=$(mktemp -d /tmp/herd-rxe-vm.XXXXXX)
qemu_pid=
cleanup() {
  if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
    kill "$qemu_pid" 2>/dev/null || true
    wait "$qemu_pid" 2>/dev/null || true
  fi
  rm -rf "$run"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
mkdir -p "$run/xfer"
{
  echo "mtu=$mtu"
  echo "rw_dirs='$rw_dirs'"
} >"$run/xfer/settings"
{
  echo 'export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
  echo 'export HOME=/root LANG=C.UTF-8'
  for name in ${HERD_VM_ENV:-}; do
    [ -n "${!name+set}" ] && printf 'export %s=%q\n' "$name" "${!name}"
  done
  echo 'ulimit -l unlimited'  # registered memory is pinned
  printf 'cd %q || exit 125\n' "$cd_back"
  printf 'exec'
  printf ' %q' "$@"
  echo
} >"$run/xfer/command"

qemu=(qemu-system-x86_64 -nodefaults -no-user-config -display none -no-reboot -nic none
  -accel tcg,thread=multi -cpu max -m "$mem" -smp "$cpus"
  -kernel "$vmlinuz" -initrd "$initrd"
  -append "console=ttyS0 quiet loglevel=3 panic=-1${HERD_VM_APPEND:+ $HERD_VM_APPEND}"
  -serial "file:$run/console"
  -chardev stdio,id=output,signal=off -serial chardev:output
  -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap
  -virtfs "local,path=$run/xfer,mount_tag=xfer,security_model=none")
index=0
IFS=: read -ra dirs <<<"$rw_dirs"
for dir in "${dirs[@]}"; do
  [ -n "$dir" ] || continue
  mkdir -p "$dir"
  qemu+=(-virtfs "local,path=$dir,mount_tag=rw$index,security_model=none")
  index=$((index + 1))
done

# One boot, and a second one only when the first never reached the command: the guest's kernel
# (under TCG, bringing CPUs up) has panicked during boot, rarely (once in CI's history: an
# "Oops: int3" in the scheduler, before /init ran), and that is no verdict on the command. A
# guest that ran the command is never booted again, whatever it did; nor is one the timeout
# killed (a boot that hangs would only hang again), nor with too little of the time left for a
# boot to run anything.
min_boot_s=30
started=$(date +%s)
boots=0
while :; do
  boots=$((boots + 1))
  rm -f "$run/xfer/started" "$run/xfer/rc"
  : >"$run/console"
  left=$((timeout_s - ($(date +%s) - started)))
  set +e
  timeout -k 5 "$left" "${qemu[@]}" </dev/null &
  qemu_pid=$!
  wait "$qemu_pid"
  qemu_rc=$?
  qemu_pid=
  set -e
  [ "${HERD_VM_CONSOLE:-0}" = 1 ] && cat "$run/console" >&2
  if [ -s "$run/xfer/rc" ]; then
    rc=$(cat "$run/xfer/rc")
    log "exit status $rc after $(($(date +%s) - started)) s"
    exit "$rc"
  fi
  # 124: the timeout stopped qemu; 137: it had to kill it.
  if [ -e "$run/xfer/started" ] || [ "$qemu_rc" = 124 ] || [ "$qemu_rc" = 137 ] ||
    [ "$boots" -ge "$boot_tries" ] ||
    [ $((timeout_s - ($(date +%s) - started))) -lt "$min_boot_s" ]; then
    break
  fi
  log "the guest stopped before it ran the command (qemu exit $qemu_rc), booting it again;" \
    "its console ends:"
  [ "${HERD_VM_CONSOLE:-0}" = 1 ] || tail -n 30 "$run/console" >&2 || true
done
[ "$qemu_rc" = 124 ] || [ "$qemu_rc" = 137 ] && log "killed after ${timeout_s} s (HERD_VM_TIMEOUT)"
if [ -e "$run/xfer/started" ]; then
  log "the command gave no exit status (qemu exit $qemu_rc); the guest's console ends:"
else
  log "the guest stopped before it ran the command, in $boots boots (qemu exit $qemu_rc);" \
    "its console ends:"
fi
[ "${HERD_VM_CONSOLE:-0}" = 1 ] || tail -n 30 "$run/console" >&2 || true
exit 125

# ---------------------------------------------------------------- the guest's /init
# The lines between the two markers are copied verbatim into the initramfs (busybox sh).
#>>> guest init
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
note() { echo "[guest] $*" >/dev/ttyS0; }
die() {
  note "$*"
  echo "rxe_vm guest: $*" >/dev/ttyS1
  echo 125 >/xfer/rc
  sync
  poweroff -f
}
for m in $MODULES; do
  options=
  [ "$m" = dummy ] && options=numdummies=0  # we create dummy0 ourselves
  modprobe "$m" $options || note "modprobe $m failed"
done
ninep="trans=virtio,version=9p2000.L,msize=512000"
mount -t 9p -o "$ninep" xfer /xfer || poweroff -f
. /xfer/settings
mount -t 9p -o "$ninep,ro,cache=loose" host /host || die "cannot mount the host's root"
mount -t tmpfs -o mode=755 tmpfs /upper && mkdir -p /upper/data /upper/work
mount -t overlay -o lowerdir=/host,upperdir=/upper/data,workdir=/upper/work overlay /root ||
  die "cannot build the overlay root"
r=/root
mount -t proc proc $r/proc
mount -t sysfs sysfs $r/sys
mount -t devtmpfs devtmpfs $r/dev
mkdir -p $r/dev/pts $r/dev/shm $r/run/herd
mount -t devpts devpts $r/dev/pts
mount -t tmpfs tmpfs $r/dev/shm
# /tmp stays the host's (under the overlay): a checkout or build there must be visible.
mount --bind /xfer $r/run/herd
i=0
for d in $(echo "$rw_dirs" | tr ':' ' '); do
  mkdir -p "$r$d" && mount -t 9p -o "$ninep" "rw$i" "$r$d" || die "cannot mount $d"
  i=$((i + 1))
done
hostname rxe-vm
# Host tools by full path: a bare name would run busybox's applet of the same name.
chroot $r /usr/sbin/ip link set lo up
chroot $r /usr/sbin/ip link add dummy0 type dummy || die "no dummy interface"
chroot $r /usr/sbin/ip link set dummy0 mtu "$mtu" up
chroot $r /usr/sbin/ip addr add 10.99.0.1/24 dev dummy0
chroot $r /usr/bin/rdma link add rxe0 type rxe netdev dummy0 || die "cannot create rxe0"
# rxe0 is usable once its port is ACTIVE and the IPv4 GID is in the table (index 1).
tries=0
until grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null &&
  grep -q ffff /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null; do
  tries=$((tries + 1))
  [ $tries -gt 100 ] && die "rxe0 did not become ACTIVE with an IPv4 GID"
  sleep 0.1
done
stty -F /dev/ttyS1 raw -echo 2>/dev/null
: >/xfer/started  # from here on a failure is the command's: the host does not boot again
chroot $r /bin/bash /run/herd/command </dev/null >/dev/ttyS1 2>&1
echo $? >/xfer/rc
sync
poweroff -f
#<<< guest init

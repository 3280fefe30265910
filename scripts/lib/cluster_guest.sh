#!/usr/bin/env bash
# scripts/lib/cluster_guest.sh -- the guest side of scripts/cluster_vm.sh; runs as root inside the
# qemu guest of scripts/rxe_vm.sh (HERD_VM_KERNEL=netns). Makes N hosts, runs COMMAND in the
# guest's own network namespace (the operator's machine), then checks that nothing the command
# started is still running on any host. Exits with COMMAND's status, or 3 if it passed but left
# processes behind.
#
#   usage: cluster_guest.sh N COMMAND [ARGS...]
#
# Host i (1..N) is the network namespace h<i>: interface eth0 at 10.98.0.<i>/24 (a veth whose
# other end is on the bridge br0, 10.98.0.254 in the guest's namespace), its own Soft-RoCE device
# rxe<i> on eth0 and moved into the namespace (RDMA namespaces are exclusive: a host sees only its
# own device; GID index 1 is ::ffff:10.98.0.<i>), and an sshd on 10.98.0.<i>:22 that takes the
# run's key only. Files in HERD_CLUSTER_DIR (/run/herd-cluster): id_ed25519 (the client key),
# known_hosts (every host's key under its name and address), ssh_config (Host h<i> entries),
# sshd-h<i>.log. The command sees HERD_CLUSTER_DIR and HERD_CLUSTER_HOSTS="h1=10.98.0.1 ...".
set -euo pipefail

SUBNET=10.98.0
BRIDGE_ADDRESS=$SUBNET.254
MAX_HOSTS=250
# Bounded waits for a device or a daemon to come up (polls of 0.1 s; TCG guests are slow).
READY_POLLS=300
# How long what a command left may take to go after it ended (polls of 0.1 s).
LEFTOVER_POLLS=100
DIR=/run/herd-cluster

die() { echo "cluster_guest: $*" >&2; exit 125; }

[ $# -ge 2 ] || die "usage: cluster_guest.sh N COMMAND [ARGS...]"
hosts=$1
shift
[[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le $MAX_HOSTS ] ||
  die "N must be 1..$MAX_HOSTS, not '$hosts'"

await() {  # await WHAT COMMAND...: polls COMMAND until it succeeds, or dies naming WHAT
  local what=$1 tries=0
  shift
  until "$@" 2>/dev/null; do
    tries=$((tries + 1))
    [ $tries -le $READY_POLLS ] || die "$what"
    sleep 0.1
  done
}

# Exclusive RDMA namespaces: set before any namespace other than the guest's exists.
rdma system set netns exclusive || die "this kernel cannot make RDMA namespaces exclusive"

mkdir -p "$DIR" /run/sshd
chmod 700 "$DIR"
ssh-keygen -q -t ed25519 -N '' -C herd-cluster -f "$DIR/id_ed25519"
ssh-keygen -q -t ed25519 -N '' -C herd-cluster-host -f "$DIR/host_ed25519"
cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys"
: >"$DIR/known_hosts"
echo "# a host of scripts/cluster_vm.sh" >"$DIR/bashrc"
: >"$DIR/ssh_config"

ip link add br0 type bridge
ip addr add "$BRIDGE_ADDRESS/24" dev br0
ip link set br0 up
listing=
for i in $(seq 1 "$hosts"); do
  ns=h$i address=$SUBNET.$i
  ip netns add "$ns"
  ip link add "veth-$ns" type veth peer name eth0 netns "$ns"
  ip link set "veth-$ns" master br0 up
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" ip addr add "$address/24" dev eth0
  ip netns exec "$ns" ip link set eth0 up
  ip netns exec "$ns" rdma link add "rxe$i" type rxe netdev eth0
  rdma dev set "rxe$i" netns "$ns"
  echo "$address $ns" >>/etc/hosts
  echo "$ns,$address $(cut -d' ' -f1,2 "$DIR/host_ed25519.pub")" >>"$DIR/known_hosts"
  printf 'Host %s\n  HostName %s\n' "$ns" "$address" >>"$DIR/ssh_config"
  cat >"$DIR/sshd-$ns.config" <<EOF
ListenAddress $address:22
HostKey $DIR/host_ed25519
AuthorizedKeysFile $DIR/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile $DIR/sshd-$ns.pid
EOF
  listing="$listing${listing:+ }$ns=$address"
done
cat >>"$DIR/ssh_config" <<EOF
Host *
  User root
  IdentityFile $DIR/id_ed25519
  UserKnownHostsFile $DIR/known_hosts
  BatchMode yes
EOF

port_active() { grep -q ACTIVE "/sys/class/infiniband/$1/ports/1/state"; }
ipv4_gid() { grep -q ffff "/sys/class/infiniband/$1/ports/1/gids/1"; }
answers() { timeout 1 bash -c "exec 3<>/dev/tcp/$1/22"; }
for i in $(seq 1 "$hosts"); do
  ns=h$i
  # /sys in `ip netns exec` shows the namespace's own RDMA devices.
  await "rxe$i did not become ACTIVE in $ns" ip netns exec "$ns" bash -c \
    "$(declare -f port_active); port_active rxe$i"
  await "rxe$i has no IPv4 GID at index 1 in $ns" ip netns exec "$ns" bash -c \
    "$(declare -f ipv4_gid); ipv4_gid rxe$i"
  # A fresh machine's root has no ~/.bashrc of this one's (Debian's bash reads it for every ssh
  # command; a pyenv init there costs seconds of process starts under TCG). `ip netns exec` runs
  # in a mount namespace of its own, so the empty one covers it for this host only.
  ip netns exec "$ns" bash -c "{ [ ! -e /root/.bashrc ] || mount --bind $DIR/bashrc /root/.bashrc; } &&
    exec /usr/sbin/sshd -f $DIR/sshd-$ns.config -E $DIR/sshd-$ns.log" ||
    die "sshd did not start in $ns (see $DIR/sshd-$ns.log)"
done
for i in $(seq 1 "$hosts"); do
  await "sshd of h$i does not answer on $SUBNET.$i:22" answers "$SUBNET.$i"
done
echo "cluster_guest: $hosts hosts up: $listing" >&2

set +e
HERD_CLUSTER_DIR=$DIR HERD_CLUSTER_HOSTS=$listing "$@"
rc=$?
set -e

# Whatever still runs in a host's namespace, apart from its sshd listener, is a leftover; an ssh
# session's sshd may take a moment to go once its client has, so it is asked again for a while.
still_running() {  # prints "host: command line" of each process left on any host
  local i ns sshd_pid pid cmdline
  for i in $(seq 1 "$hosts"); do
    ns=h$i
    sshd_pid=$(cat "$DIR/sshd-$ns.pid" 2>/dev/null || echo none)
    for pid in $(ip netns pids "$ns"); do
      [ "$pid" = "$sshd_pid" ] && continue
      cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || continue  # gone meanwhile
      echo "$ns: $cmdline"
    done
  done
}
polls=0
while [ -n "$(still_running)" ] && [ $polls -lt $LEFTOVER_POLLS ]; do
  polls=$((polls + 1))
  sleep 0.1
done
# (No process substitution: the guest's /dev has no /dev/fd.)
leftover=$(still_running)
left=0
if [ -n "$leftover" ]; then
  while IFS= read -r line; do
    echo "cluster_guest: left running on $line" >&2
  done <<<"$leftover"
  left=1
fi
for i in $(seq 1 "$hosts"); do
  kill "$(cat "$DIR/sshd-h$i.pid" 2>/dev/null)" 2>/dev/null || true
done
if [ $rc -eq 0 ] && [ $left -ne 0 ]; then
  rc=3
fi
exit $rc

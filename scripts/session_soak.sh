#!/usr/bin/env bash
# Session soak (issue 36): SESSIONS sessions of join, one GET, leave against a herd_server with 0
# and with 2 backups, keys on one worker (the other idle) and on all, sampling every server's
# descriptors, mappings, RSS, shared memory, threads, departed sessions not yet reclaimed, and
# the join rate (bench/session_soak.cc). A server that keeps anything per departed session
# grows here; "flat" means every level within 5% (RSS and shared memory: or 512 KiB) from a
# tenth of the run to its end.
#
# usage: scripts/session_soak.sh [SESSIONS]   (default 1,000,000; CI runs 20,000)
#   HERD_SOAK_CASES="0:one 2:all" picks cases (backups:keys); default all four.
#   HERD_SOAK_CONCURRENCY=N runs N sessions at once (default 1).
# Prints each case's summary JSON line (and its samples to the log it names); exits non-zero if
# any case is not flat or fails.
set -euo pipefail
cd "$(dirname "$0")/.."
sessions=${1:-1000000}
[[ "$sessions" =~ ^[0-9]+$ && "$sessions" -ge 20 ]] || {
  echo "usage: $0 [SESSIONS >= 20]" >&2
  exit 2
}
cases=${HERD_SOAK_CASES:-"0:one 0:all 2:one 2:all"}
concurrency=${HERD_SOAK_CONCURRENCY:-1}
[[ "$concurrency" =~ ^[1-9][0-9]*$ ]] || {
  echo "session_soak: HERD_SOAK_CONCURRENCY=$concurrency: want a count of sessions at once" >&2
  exit 2
}
./scripts/setup.sh --quiet
bazel build --config=opt //herd:herd_server //bench:session_soak >&2
bin=$(bazel info --config=opt bazel-bin 2>/dev/null)
log=$(mktemp /tmp/herd-soak-XXXXXX.log)
fabric="soak-$$"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

# start_server OUT_VAR ARGS...: starts herd_server, waits for its ready line, sets OUT_VAR to
# "pid port replication_port".
start_server() {
  local out=$1 ready="" i
  shift
  local stdout
  stdout=$(mktemp /tmp/herd-soak-ready-XXXXXX)
  "$bin/herd/herd_server" --shm_fabric_name="$fabric" --listen_address=127.0.0.1 --port=0 \
    --workers=2 --pin_workers=false --max_clients=64 "$@" >"$stdout" 2>>"$log" &
  local pid=$!
  pids+=("$pid")
  for ((i = 0; i < 600; i++)); do
    ready=$(grep -m1 '^herd_server ready ' "$stdout" || true)
    [ -n "$ready" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  rm -f "$stdout"
  if [ -z "$ready" ]; then
    echo "session_soak: herd_server $* did not start (see $log)" >&2
    return 1
  fi
  local port rport
  port=$(sed -n 's/.* port=\([0-9]*\) .*/\1/p' <<<"$ready")
  rport=$(sed -n 's/.*replication_port=\([0-9]*\).*/\1/p' <<<"$ready")
  printf -v "$out" '%s %s %s' "$pid" "$port" "${rport:-0}"
}

rc=0
for c in $cases; do
  backups=${c%%:*}
  keys=${c##*:}
  [[ "$backups" =~ ^[0-2]$ && ( "$keys" == one || "$keys" == all ) ]] || {
    echo "session_soak: bad case \"$c\" (want BACKUPS:one|all, BACKUPS 0-2)" >&2
    exit 2
  }
  members=()
  addresses=()
  soak_pids=()
  for ((b = 0; b < backups; b++)); do
    start_server backup --role=backup --replication_port=0
    read -r bpid bport brport <<<"$backup"
    members+=("127.0.0.1:$brport")
    soak_pids+=("$bpid")
    addresses+=("127.0.0.1:$bport")
  done
  role=()
  if [ "$backups" -gt 0 ]; then
    role=(--role=primary "--backups=$(IFS=,; echo "${members[*]}")")
  fi
  start_server primary "${role[@]}"
  read -r ppid pport _ <<<"$primary"
  soak_pids=("$ppid" "${soak_pids[@]}")
  addresses=("127.0.0.1:$pport" "${addresses[@]}")
  echo "==== session soak: $sessions sessions, $backups backups, keys on $keys" >>"$log"
  line=$("$bin/bench/session_soak" --shm_fabric_name="$fabric" --server="127.0.0.1:$pport" \
    --pids="$(IFS=,; echo "${soak_pids[*]}")" --stats_servers="$(IFS=,; echo "${addresses[*]}")" \
    --sessions="$sessions" --keys="$keys" --concurrency="$concurrency" 2>>"$log" | tee -a "$log" | tail -n 1) || rc=1
  if [ -z "$line" ]; then
    line="{\"case\":\"session_soak\",\"keys\":\"$keys\",\"failed\":true}"
  fi
  sed "s/^{\"case\":\"session_soak\",/{\"case\":\"session_soak\",\"backups\":$backups,/" <<<"$line"
  cleanup
done
echo "session_soak: samples in $log" >&2
exit $rc

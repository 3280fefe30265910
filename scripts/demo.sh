#!/usr/bin/env bash
# scripts/demo.sh -- the main job on this machine, from a fresh clone: a herd server and clients
# on the shared-memory fabric, a sweep of the logical client count, a table and a PNG plot
# (throughput vs clients, the HERD paper's figure shape).
#
#   usage: scripts/demo.sh [CLIENT_COUNTS]     e.g. scripts/demo.sh "1 2 4 8 16 32"
#
# Each point: a fresh server (1 pinned worker; UC WRITE requests, UD SEND responses), one client
# process with one thread hosting N logical clients, 1 s warm-up, 3 s measured, read-only YCSB C
# on 100k keys (16-byte keys, 32-byte values). On a 2-core machine the worker and the client
# thread each take one core. Results: results/demo/clients_<N>.json, sweep.csv, sweep.png.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --quiet

counts=${1:-"1 2 4 8 16 32"}
out=results/demo
mkdir -p "$out"
echo "[demo] building //herd:herd_server //herd:herd_client (-c opt)" >&2
bazel build -c opt //herd:herd_server //herd:herd_client 2>&1 | tail -n 1 >&2
bin=bazel-out/k8-opt/bin/herd

server_pid=""
cleanup() { [[ -n "$server_pid" ]] && kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" || true; }
trap cleanup EXIT INT TERM

for n in $counts; do
  # The server prints "herd_server ready port=N" once it accepts clients: wait for that line.
  fifo=$(mktemp -u) && mkfifo "$fifo"
  "$bin/herd_server" --port=0 --workers=1 --max_clients=64 --mica_items=200000 \
    --mica_log_bytes=67108864 --shm_fabric_name="demo-$$" >"$fifo" 2>"$out/server_$n.log" &
  server_pid=$!
  exec 3<"$fifo"
  read -r ready <&3 || { echo "[demo] server failed: see $out/server_$n.log" >&2; exit 1; }
  rm -f "$fifo"
  port=${ready#*port=}; port=${port%% *}
  echo "[demo] clients=$n (server port $port)" >&2
  "$bin/herd_client" --server="127.0.0.1:$port" --threads=1 --clients_per_thread="$n" \
    --duration_s=3 --warmup_s=1 --keys=100000 --workload=C --shm_fabric_name="demo-$$" \
    2>"$out/client_$n.log" | tail -n 1 >"$out/clients_$n.json"
  kill -TERM "$server_pid"; cat <&3 >"$out/server_$n.json" || true; wait "$server_pid" || true
  exec 3<&-
  server_pid=""
done
# Debian's interpreter: its python3-matplotlib, whatever python3 comes first on PATH.
/usr/bin/python3 scripts/sweep_report.py "$out" "clients" "herd on the shm fabric: 1 worker, UC WRITE requests, UD SEND responses, YCSB C"

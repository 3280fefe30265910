#!/usr/bin/env bash
# Runs both examples against a herd_server of their own (shm fabric, a port the kernel picks)
# and checks what they print: the programs a user builds first must work as their comments say.
#   usage: examples_test.sh HERD_SERVER KV_CLIENT BATCH_CLIENT
set -euo pipefail
server_bin=$1 kv_client=$2 batch_client=$3
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/examples.XXXXXX")
fabric="examples-$$"
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

"$server_bin" --port=0 --workers=2 --shm_fabric_name="$fabric" --pin_workers=false \
  >"$work/server.out" 2>"$work/server.err" &
server_pid=$!
# The ready line says the port; wait for it (the server may take a while on a loaded machine).
readonly ready_deadline_s=60
port=""
for ((i = 0; i < ready_deadline_s * 10; ++i)); do
  port=$(sed -n 's/^herd_server ready port=\([0-9]*\).*/\1/p' "$work/server.out")
  [ -n "$port" ] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.err" >&2; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "no ready line in ${ready_deadline_s} s" >&2; cat "$work/server.err" >&2; exit 1; }
client_flags=(--server="127.0.0.1:$port" --shm_fabric_name="$fabric")

kv_out=$("$kv_client" "${client_flags[@]}")
echo "$kv_out"
grep -q '^GET greeting = "hello, herd" (version [0-9]*)$' <<<"$kv_out"
grep -q '^CAS with the old version: FAILED_PRECONDITION: CAS_FAILED' <<<"$kv_out"
grep -q '^after DELETE: NOT_FOUND' <<<"$kv_out"

batch_out=$("$batch_client" "${client_flags[@]}" --keys=5000)
echo "$batch_out"
grep -q '^5000 PUTs and 5000 GETs, 0 wrong values' <<<"$batch_out"
echo "examples_test: both examples ran as documented"

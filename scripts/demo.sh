#!/usr/bin/env bash
# scripts/demo.sh -- the main job on this machine, from a fresh clone.
#
#   usage: scripts/demo.sh
#
# Today it runs what exists: the MICA store benchmark (one core, batched GET/PUT, MICA against
# absl::flat_hash_map in the same run) and prints a table. The HERD engine's server + clients
# sweep on the shared-memory fabric replaces this once //herd lands (issues 5 and 6).
# Raw JSON lines go to results/demo/mica_bench.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --quiet

out=results/demo
mkdir -p "$out"
echo "[demo] building //bench:mica_bench (-c opt)" >&2
bazel build -c opt //bench:mica_bench 2>&1 | tail -n 1 >&2
echo "[demo] running: 1M and 4M items, uniform and Zipf 0.99, 16-byte keys, 32-byte values" >&2
bazel-bin/bench/mica_bench --items=1048576,4194304 --ops=4000000 2>"$out/mica_bench.log" \
  | tee "$out/mica_bench.jsonl" >/dev/null
python3 scripts/bench_table.py "$out/mica_bench.jsonl"
echo "[demo] raw results: $out/mica_bench.jsonl" >&2

#!/usr/bin/env bash
# scripts/demo.sh -- the main job on this machine, from a fresh clone: a herd server and clients
# on the shared-memory fabric, a sweep of the logical client count, a table and PNG plots
# (throughput vs clients, the HERD paper's figure shape; latency vs throughput).
#
#   usage: scripts/demo.sh [CLIENT_COUNTS]     e.g. scripts/demo.sh "1 4 16" (default 1 .. 1024)
#
# It runs bench/experiments/clients_sweep.yaml through the experiment runner (scripts/herd_exp.py):
# each point a fresh server (1 worker pinned to core 0; UC WRITE requests, UD SEND responses) and
# one client process with one thread hosting N logical clients, 1 s warm-up, 3 s measured,
# read-only YCSB C on 100k keys (16-byte keys, 32-byte values). Results: results/demo/ (one JSON
# per point, results.csv, throughput.png, latency.png).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --quiet
# The server's MICA partition (98 MiB) and the client's landing buffers on 2 MiB pages, as MICA
# is meant to run (scripts/lib/hugepages.sh: lent for the run as root, given back after).
. scripts/lib/hugepages.sh
lend_hugepages 64 "scripts/demo.sh"
trap give_back_hugepages EXIT

sweep=()
if [ -n "${1:-}" ]; then
  counts=$(echo "$1" | tr -s ' ' ',')
  sweep=(--sweep "clients=${counts}")
fi
# Debian's interpreter (its python3-yaml and python3-matplotlib), whatever python3 is on PATH.
/usr/bin/python3 scripts/herd_exp.py run bench/experiments/clients_sweep.yaml --fresh \
  --out results/demo "${sweep[@]}"
/usr/bin/python3 scripts/herd_exp.py plot results/demo

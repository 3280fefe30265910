#!/usr/bin/env bash
# scripts/compare_memcached.sh -- herd on the shared-memory fabric against memcached (Debian's,
# one thread, loopback TCP, started and stopped here) driven by bench/memcached_bench with the
# same workload: keys, sizes, mix, distribution, preload; herd's logical clients are memcached's
# connections, each with the same window of pipelined requests; servers on core 0, clients on
# core 1. Runs are interleaved and the medians compared.
# Last line: {"herd_mops":..,"memcached_mops":..,"ratio":..}. Runs: results/compare_memcached/.
#
#   usage: scripts/compare_memcached.sh [compare.py options]   e.g. --workload A --clients 16
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --quiet
exec /usr/bin/python3 scripts/compare.py memcached "$@"

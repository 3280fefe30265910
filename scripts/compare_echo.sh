#!/usr/bin/env bash
# scripts/compare_echo.sh -- herd against its ceiling: the raw fabric echo (clients WRITE
# requests into slots, one pinned thread answers each with a UD SEND; no store, no protocol),
# same cores, same message sizes (a herd GET's), same logical clients and window, on the
# shared-memory fabric. Runs are interleaved (herd, echo, herd, echo, ...) and the medians
# compared. Last line: {"herd_mops":..,"echo_mops":..,"ratio":..}. Runs: results/compare_echo/.
#
#   usage: scripts/compare_echo.sh [compare.py options]   e.g. --clients 16 --repetitions 5
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --quiet
exec /usr/bin/python3 scripts/compare.py echo "$@"

#!/usr/bin/env bash
# The chaos checker of coordinated replication (issue 35), long form: ROUNDS rounds of mixed
# faults on ONE cluster of three herd_server processes and a private ZooKeeper (kill -9 of the
# primary or a backup, SIGSTOP past the session or the read lease, promotions racing the
# automatic one, the coordinator killed and restarted, a backup or the primary partitioned), one
# history checked at the end (tests/herd/coordinated_chaos_test.cc). CI runs its short form
# through `bazel test`.
#
# usage: scripts/chaos_check.sh [ROUNDS [SEED]]   (default 50 rounds, seed 1)
#   HERD_CHAOS_FAULT=NAME runs that fault every round (kill-primary, kill-backup, pause-primary,
#   pause-backup, race-promotions, restart-coordinator, partition-backup, partition-primary).
# Prints the run's CHAOS_RUN JSON line (rounds, operations, acknowledged, violations, lost, stale,
# double_applied, faults by kind) and exits non-zero on any violation; the servers' logs stay in
# the folder it names.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-50}
seed=${2:-1}
[[ "$rounds" =~ ^[0-9]+$ && "$rounds" -ge 1 ]] || { echo "usage: $0 [ROUNDS [SEED]]" >&2; exit 2; }
[[ "$seed" =~ ^[0-9]+$ && "$seed" -ge 1 ]] || { echo "SEED must be a positive integer" >&2; exit 2; }
./scripts/setup.sh --quiet
bazel build //tests/herd:coordinated_chaos_test >&2
runfiles="$(bazel info bazel-bin 2>/dev/null)/tests/herd/coordinated_chaos_test.runfiles/herd"
out=$(mktemp -d /tmp/herd-chaos-XXXXXX)
rc=0
(cd "$runfiles" && TEST_TMPDIR="$out" HERD_CHAOS_ROUNDS=$rounds HERD_CHAOS_SEED=$seed \
  ../../coordinated_chaos_test >"$out/test.log" 2>&1) || rc=$?
line=$(grep -h '^CHAOS_RUN ' "$out/test.log" || true)
if [ -z "$line" ]; then
  echo "chaos_check: no CHAOS_RUN line (the run failed before its check): $out/test.log" >&2
  grep -E 'Failure|last:' -A3 "$out/test.log" | head -20 >&2 || true
  exit 1
fi
echo "${line#CHAOS_RUN }"
echo "chaos_check: logs in $out" >&2
exit "$rc"

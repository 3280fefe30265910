#!/usr/bin/env bash
# Kill-and-promote check of herd's primary-backup replication (issue 16), N times, two ways:
#  1. history: each run starts two backups and a primary (processes of their own, shm fabric),
#     loads the primary with PUTs and DELETEs from two writers, SIGKILLs it right after a random
#     acknowledged write (20..400), promotes one backup (the request `herd_admin promote` sends)
#     and checks one history of everything with tests/herd/history.h: every write acknowledged
#     before the kill is visible at the new primary (lost), no read is torn or older than an
#     acknowledged write (stale_reads), and the new primary takes writes with newer versions.
#  2. follow: clients with the member list follow the promotion (Client::Follow) with their
#     requests outstanding; every logical client cycles INSERT, CAS, DELETE over keys of its own,
#     so a retried mutation applied twice (or an acknowledged one lost) shows as EXISTS,
#     CAS_FAILED or NOT_FOUND, or in the final state (double_applied counts failing runs).
# Half the runs use the asynchronous fabric; every run's links are slower than its clients'
# fabric, so an early acknowledgement would be caught.
#
# usage: scripts/failover_check.sh [--runs N | N] [--first F]   (default 20 runs from 0)
# Prints one JSON line:
#   {"runs":N,"acked_writes":..,"lost":..,"stale_reads":..,"violations":..,
#    "promotion_ms_p50":..,"promotion_ms_max":..,"follow_runs":N,"resumed_outcomes":..,
#    "double_applied":..,"passed":true|false,"seconds":S,"failures":[...],"log":"..."}
# and exits non-zero if any run failed (the log names the violations).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=20
first=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=${2:?--runs needs a number}; shift 2 ;;
    --first) first=${2:?--first needs a number}; shift 2 ;;
    [0-9]*) runs=$1; shift ;;
    *) echo "usage: $0 [--runs N] [--first F]" >&2; exit 2 ;;
  esac
done
[[ "$runs" =~ ^[0-9]+$ && "$runs" -ge 1 ]] || { echo "--runs must be a positive integer" >&2; exit 2; }
[[ "$first" =~ ^[0-9]+$ ]] || { echo "--first must be a non-negative integer" >&2; exit 2; }
bazel build --config=opt //tests/herd:replication_e2e_test //tests/herd:failover_follow_test >&2
bin="$(bazel info --config=opt bazel-bin 2>/dev/null)/tests/herd"
log=$(mktemp /tmp/herd-failover-XXXXXX.log)
report="$log.runs"  # the tests' one line per run, appended whole (the log interleaves servers')
: >"$report"
start=$(date +%s.%N)
rc=0
export HERD_FAILOVER_RUNS=$runs HERD_FAILOVER_FIRST_RUN=$first HERD_FAILOVER_REPORT=$report
"$bin/replication_e2e_test" \
  --gtest_filter='Replication.KillThePrimaryPromoteABackupLoseNoAcknowledgedWrite' \
  >"$log" 2>&1 || rc=$?
"$bin/failover_follow_test" --gtest_filter='FailoverFollow.UnderLoad*' >>"$log" 2>&1 || rc=$?
seconds=$(echo "$(date +%s.%N) - $start" | bc)
# A filter that matched nothing (a renamed test) runs nothing and exits 0: that is a failure.
if [ "$(grep -c '^\[  PASSED  \] 1 test\.' "$log")" -ne 2 ]; then
  echo "failover_check: a test did not run or failed (see $log)" >&2
  rc=1
fi
/usr/bin/python3 - "$log" "$runs" "$first" "$rc" "$seconds" "$report" <<'PY'
import json, re, statistics, sys
log, runs, first, rc, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
text = open(log, errors="replace").read()
lines = open(sys.argv[6], errors="replace").read()
kills = [json.loads(m) for m in re.findall(r"^FAILOVER_RUN (\{.*\})$", lines, re.M)]
follows = [json.loads(m) for m in re.findall(r"^FOLLOW_RUN (\{.*\})$", lines, re.M)]
ms = sorted(k["promotion_ms"] for k in kills)
failures = sorted(set(re.findall(r"run \d+ (?:cache|store)", text)))
double = len(re.findall(r"answered (?:EXISTS|CAS_FAILED|NOT_FOUND) \(model", text))
complete = len(kills) == runs and len(follows) == runs
print(json.dumps({
    "runs": len(kills), "first_run": first,
    "acked_writes": sum(k["acked_writes"] for k in kills),
    "lost": sum(k["lost"] for k in kills),
    "stale_reads": sum(k["stale_reads"] for k in kills),
    "violations": sum(k["violations"] for k in kills),
    "promotion_ms_p50": round(statistics.median(ms), 3) if ms else None,
    "promotion_ms_max": round(ms[-1], 3) if ms else None,
    "follow_runs": len(follows),
    "resumed_outcomes": sum(f["resumed_outcomes"] for f in follows),
    "double_applied": double,
    "passed": rc == 0 and complete,
    "seconds": round(seconds, 1), "failures": failures, "log": log,
}, separators=(",", ":")))
sys.exit(0 if rc == 0 and complete else 1)
PY

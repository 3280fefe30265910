#!/usr/bin/env bash
# scripts/rxe_side_by_side.sh -- one qemu guest, the same knobs: herd over the shm fabric, herd
# over Soft-RoCE (rxe0), and perftest's ib_write_bw (UC, 64 B) and ib_send_lat (UD, 64 B) as the
# raw-verbs reference. Emulation figures: they show correctness and verb economy (doorbells,
# signalled fraction), not NIC speed.
#
#   usage: scripts/rxe_side_by_side.sh
#
# Before and after a change, in one guest boot: HERD_BASELINE_BIN=DIR names another build's
# binaries (DIR/herd/herd_server and DIR/bench/herd_client, e.g. a --config=portable_opt build
# of the commit before); herd over rxe0 then runs with those and with this build's, interleaved
# HERD_REPETITIONS times (default 1), and the summary gives each run's wire bytes per request
# and per response (the fabric's counters) beside its rate.
#
# Results (JSON per herd run, perftest's text) in results/rxe_side_by_side/; a summary at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${2:-$PWD/results/rxe_side_by_side}
bin=bazel-out/k8-optportable/bin/herd  # --config=portable_opt (.bazelrc)

if [ "${1:-}" != "--inside" ]; then
  ./scripts/setup.sh --quiet
  # portable_opt: -O3 without -march=native (the guest CPU has no AVX-512).
  bazel build --config=portable_opt //herd:herd_server //bench:herd_client 2>&1 | tail -n 1
  mkdir -p "$out"
  HERD_VM_RW="$out" HERD_VM_ENV="HERD_BASELINE_BIN HERD_REPETITIONS" \
    exec ./scripts/rxe_vm.sh bash scripts/rxe_side_by_side.sh --inside "$out"
fi

# Same knobs for both fabrics: 1 worker, UC WRITE requests, UD SEND responses, 4 logical clients
# on one client thread, YCSB C on 10k keys (16 B keys, 32 B values), 1 s warm-up, 3 s measured.
server_knobs=(--workers=1 --pin_workers=false --max_clients=8 --mica_items=20000
  --mica_log_bytes=16777216 --request_verb=uc_write --response_verb=ud_send)
client_knobs=(--threads=1 --clients_per_thread=4 --workload=C --keys=10000 --key_bytes=16
  --value_bytes=32 --warmup_s=1 --duration_s=3 --retry_timeout_us=200000)

source scripts/lib/run_herd.sh
run_herd() {  # run_herd NAME BIN_ROOT FABRIC_FLAGS...
  local name=$1 root=$2
  shift 2
  local with_server=("${server_knobs[@]}" "$@") with_client=("${client_knobs[@]}" "$@")
  run_herd_once "$name" "$out" "$root" with_server with_client
}

root=${bin%/herd}
runs=(herd_shm)
run_herd herd_shm "$root" --fabric=shm --shm_fabric_name=side-by-side
for ((rep = 1; rep <= ${HERD_REPETITIONS:-1}; rep++)); do
  if [ -n "${HERD_BASELINE_BIN:-}" ]; then
    run_herd "herd_rxe_baseline_$rep" "$HERD_BASELINE_BIN" --fabric=verbs --device=rxe0
    runs+=("herd_rxe_baseline_$rep")
  fi
  run_herd "herd_rxe_$rep" "$root" --fabric=verbs --device=rxe0
  runs+=("herd_rxe_$rep")
done
ib_write_bw -d rxe0 -x 1 -c UC -s 64 -D 3 >"$out/ib_write_bw.server.txt" 2>&1 &
sleep 1
ib_write_bw -d rxe0 -x 1 -c UC -s 64 -D 3 10.99.0.1 >"$out/ib_write_bw.txt" 2>&1
wait
ib_send_lat -d rxe0 -x 1 -c UD -s 64 -n 5000 >"$out/ib_send_lat.server.txt" 2>&1 &
sleep 1
ib_send_lat -d rxe0 -x 1 -c UD -s 64 -n 5000 10.99.0.1 >"$out/ib_send_lat.txt" 2>&1
wait

/usr/bin/python3 - "$out" "${runs[@]}" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for name in sys.argv[2:]:
    c = json.loads((out / f"{name}.json").read_text())
    s = json.loads((out / f"{name}.server.json").read_text())["server"]
    f = s["fabric"]
    print(json.dumps({"run": name, "mops": c["mops"], "p50_us": c["p50_us"], "p99_us": c["p99_us"],
                      "retransmissions": c["retransmissions"],
                      "request_bytes": c["bytes_per_wr"],
                      "response_bytes": round(f["bytes"] / max(f["wrs"], 1), 1),
                      "server_responses_per_doorbell": round(f["wrs"] / max(f["doorbells"], 1), 2),
                      "server_signaled_fraction": round(f["signaled_wrs"] / max(f["wrs"], 1), 4),
                      "client_doorbells_per_wr": c["doorbells_per_wr"],
                      "inline_fraction": c["inline_fraction"], "batch": s["batch"]}))
def table_row(path):
    lines = [l.split() for l in path.read_text().splitlines()]
    rows = [l for l in lines if l and l[0].isdigit()]
    return rows[-1] if rows else None
bw = table_row(out / "ib_write_bw.txt")  # bytes iterations BW-peak BW-average MsgRate
lat = table_row(out / "ib_send_lat.txt")  # bytes iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
print(json.dumps({"run": "ib_write_bw UC 64B", "mpps": float(bw[4]) if bw else None}))
print(json.dumps({"run": "ib_send_lat UD 64B", "typical_us": float(lat[4]) if lat else None,
                  "p99_us": float(lat[7]) if lat else None}))
PY

#!/usr/bin/env bash
# scripts/original_herd_rxe.sh -- the original HERD (efficient/rdma_bench's herd/ + libhrd/ +
# mica/, C) against this repo's herd, on the same Soft-RoCE device (rxe0) in one qemu guest boot,
# with the same knobs: 1 server worker, UC WRITE requests, UD SEND responses, 16 B keys, 32 B
# values, GETs only, 10k keys, and the same number of client threads and window on both sides.
# Emulation figures (TCG, rxe): they compare two programs on one emulated device, not NICs.
#
#   usage: scripts/original_herd_rxe.sh [RDMA_BENCH]
#
# RDMA_BENCH (or $HERD_RDMA_BENCH) is a clone of https://github.com/efficient/rdma_bench, a
# checkout or a bare git dir; it must hold the pinned commit below. Nothing of it is copied into
# this repo: its three directories are extracted at that commit into the build dir, patched (the
# patcher below lists every change and why: RoCE GID addressing, sizes that fit the guest, and
# the comparison's knobs; the request and response paths and their verbs are untouched), and
# compiled there with gcc, once per client configuration (HERD's knobs are #defines).
#
# In the guest, for each repetition and each configuration THREADSxWINDOW, the original runs as
# its scripts start it (a memcached QP registry, a master process owning the UC request region,
# a worker process, a client process), then this repo's herd with --threads=THREADS
# --clients_per_thread=1 --window=WINDOW. The original's rate is its worker's own report (it
# prints IOPS every HERD_REPORT_OPS requests): the first reports (connection set-up, warm-up) are
# dropped, the next ones averaged over their total time. herd's is its client's JSON (1 s warm-up,
# 3 s measured). A summary table ends the run: per run both rates and herd/original, then per
# configuration the median of each column (that of herd/original is the median of the ratios).
# The script fails (exit 1) if any run produced no rate, on either side.
#
# Environment:
#   HERD_RDMA_BENCH         the rdma_bench clone when no argument is given
#   HERD_REPETITIONS        interleaved repetitions (3)
#   HERD_ORIGINAL_CONFIGS   client configurations, THREADSxWINDOW, space separated ("1x8 2x4":
#                           the issue's "1 client thread, window 8" and "2 threads, window 4")
#   HERD_ORIGINAL_BUILD     where the original is extracted and built
#                           (${XDG_CACHE_HOME:-~/.cache}/herd/original_herd)
#   HERD_NO_BUILD=1         use the herd binaries already built (no bazel build)
#   HERD_BUILD_ONLY=1       patch and build the original, then stop (no herd build, no guest)
#   HERD_VM_TIMEOUT, HERD_VM_MEM  as for scripts/rxe_vm.sh (this script defaults the timeout to 1500)
#
# Results (logs of the original's processes, herd's JSON) in results/original_herd_rxe/; the
# summary is printed and kept there as summary.txt and summary.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."

# rdma_bench's last commit ("Sync minor improvements from pmem-bench", 2019-12-27).
RDMA_BENCH_COMMIT=a038ec5e2b9f1ac9d4da2fc0044786c82c9ee575
# The comparison's store: as many keys as herd's side (--keys), 16 B keys, 32 B values.
KEYS=10000
# Fits the guest: 32768 buckets of 8 slots, a 2 MiB index (one hugepage: libhrd mbind()s the
# whole segment, so it must fill its pages), leave 10k keys no evictions (upstream: 2M buckets,
# 128 MiB); a 16 MiB log, as herd's --mica_log_bytes (upstream: 1 GiB).
BUCKETS=32768
LOG_BYTES=16777216
# The original's worker prints its rate every this many requests (upstream: 4M, minutes under
# TCG); 2-4 s at the emulated rates (8-15 K requests/s).
REPORT_OPS=32768
# Worker reports dropped (the first spans connection set-up, the second is the warm-up), then
# the number averaged (6-12 s; herd measures 3 s).
SKIP_REPORTS=2
MEASURED_REPORTS=3
# Seconds to wait for the original to produce them before calling the run failed (its client
# never notices a lost response or request: it then waits for ever, and so does this script
# until then; a busy host can also slow the emulation to 1-2 K requests/s).
ORIGINAL_TIMEOUT_S=240
# rxe0's RoCE v2 GID for the guest's IPv4 address (scripts/rxe_vm.sh).
GID_INDEX=1
# 2 MiB hugepages the guest reserves: the original allocates with SysV SHM_HUGETLB and has no
# fallback (request region 16 MiB, MICA index 2 MiB and log 16 MiB: 17 pages); herd's server
# takes hugepages too when the pool has them free (the original's are freed before it runs).
HUGEPAGES=128
# The original's own flags (herd/Makefile's CFLAGS) less -Werror, which GCC 12's extra warnings
# trip, plus herd's --config=portable_opt target (-march=x86-64-v3: both sides compiled for the
# same CPU; never -march=native, the guest has no AVX-512). -U__SSE4_2__ keeps mica/city.c out of
# its CRC section, which needs citycrc.h (not shipped by rdma_bench; HERD does not call it).
ORIGINAL_CFLAGS=(-O3 -march=x86-64-v3 -U__SSE4_2__ -Wall -Wno-unused-result)
# SysV SHM keys the original uses (herd/main.h MASTER_SHM_KEY, mica/mica.h MICA_*_SHM_KEY + worker).
SHM_KEYS=(24 3185 4185)

out=${3:-$PWD/results/original_herd_rxe}
bin=bazel-out/k8-optportable/bin  # --config=portable_opt (.bazelrc)
configs=${HERD_ORIGINAL_CONFIGS:-1x8 2x4}
reps=${HERD_REPETITIONS:-3}
log() { echo "[original_herd_rxe] $*" >&2; }
die() { log "error: $*"; exit 1; }

for cfg in $configs; do
  [[ $cfg =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] || die "HERD_ORIGINAL_CONFIGS: '$cfg' is not THREADSxWINDOW"
done

# ---------------------------------------------------------------- host side: fetch, patch, build
patch_original() {  # patch_original SRC_DIR THREADS WINDOW
  /usr/bin/python3 - "$@" "$KEYS" "$BUCKETS" "$LOG_BYTES" "$REPORT_OPS" "$GID_INDEX" <<'PY'
import pathlib, sys
src = pathlib.Path(sys.argv[1])
threads, window, keys, buckets, log_bytes, report_ops, gid_index = sys.argv[2:9]
# (file, old text, new text, how many times it occurs, why)
PATCHES = [
    # --- RoCE GID addressing: rxe's link layer is Ethernet, so there are no LIDs; every UC path
    # and UD address handle needs is_global = 1 with the peer's GID. The registry's record of a
    # QP carries only a LID, so it gains the GID of the publishing port.
    ("libhrd/hrd.h", "#define HRD_MAX_LID 256\n",
     "#define HRD_MAX_LID 256\n"
     "/* RoCE (patched for herd's scripts/original_herd_rxe.sh): GID index, hop limit */\n"
     f"#define HRD_GID_INDEX {gid_index}\n#define HRD_HOP_LIMIT 64\n", 1,
     "RoCE: which GID to address from"),
    ("libhrd/hrd.h", "  int lid;\n  int qpn;\n};",
     "  int lid;\n  int qpn;\n  union ibv_gid gid; /* RoCE: the port's GID at HRD_GID_INDEX */\n};", 1,
     "RoCE: the published QP record carries a GID"),
    ("libhrd/hrd_conn.c", "  qp_attr.qpn = cb->conn_qp[n]->qp_num;\n",
     "  qp_attr.qpn = cb->conn_qp[n]->qp_num;\n"
     "  CPE(ibv_query_gid(cb->ctx, cb->dev_port_id, HRD_GID_INDEX, &qp_attr.gid),\n"
     "      \"HRD: ibv_query_gid failed\", -1);\n", 1,
     "RoCE: publish a connected QP's GID"),
    ("libhrd/hrd_conn.c", "  qp_attr.qpn = cb->dgram_qp[n]->qp_num;\n",
     "  qp_attr.qpn = cb->dgram_qp[n]->qp_num;\n"
     "  CPE(ibv_query_gid(cb->ctx, cb->dev_port_id, HRD_GID_INDEX, &qp_attr.gid),\n"
     "      \"HRD: ibv_query_gid failed\", -1);\n", 1,
     "RoCE: publish a datagram QP's GID"),
    # Twice: the compiled path and the HRD_CONNECT_IB_ATOMICS one (compiled out).
    ("libhrd/hrd_conn.c", "  conn_attr.ah_attr.is_global = 0;\n",
     "  conn_attr.ah_attr.is_global = 1;\n"
     "  conn_attr.ah_attr.grh.dgid = remote_qp_attr->gid;\n"
     "  conn_attr.ah_attr.grh.sgid_index = HRD_GID_INDEX;\n"
     "  conn_attr.ah_attr.grh.hop_limit = HRD_HOP_LIMIT;\n", 2,
     "RoCE: connect UC QPs by GID"),
    ("herd/worker.c", "        .is_global = 0,\n",
     "        .is_global = 1,\n"
     "        .grh = {.dgid = clt_qp[i]->gid, .sgid_index = HRD_GID_INDEX,\n"
     "                .hop_limit = HRD_HOP_LIMIT},\n", 1,
     "RoCE: the worker's UD address handles by GID"),
    # --- Sizes that fit the guest (and match herd's store).
    ("herd/main.h", "#define HERD_NUM_BKTS (2 * 1024 * 1024)\n",
     f"#define HERD_NUM_BKTS {buckets}\n", 1, "size: MICA index"),
    ("herd/main.h", "#define HERD_LOG_CAP (1024 * 1024 * 1024)\n",
     f"#define HERD_LOG_CAP {log_bytes}\n", 1, "size: MICA log"),
    # --- The comparison's knobs.
    ("herd/main.h", "#define HERD_NUM_KEYS (8 * 1024 * 1024)\n",
     f"#define HERD_NUM_KEYS {keys}\n", 1, "knob: keys"),
    ("herd/main.h", "#define NUM_WORKERS 12\n", "#define NUM_WORKERS 1\n", 1, "knob: 1 worker"),
    ("herd/main.h", "#define NUM_CLIENTS 70\n", f"#define NUM_CLIENTS {threads}\n", 1,
     "knob: client threads"),
    ("herd/main.h", "#define WINDOW_SIZE 32 ", f"#define WINDOW_SIZE {window} ", 1,
     "knob: window"),
    # --- Measurement: report every HERD_REPORT_OPS requests instead of every 4M.
    ("herd/main.h", "#define USE_POSTLIST 1\n",
     f"#define USE_POSTLIST 1\n#define HERD_REPORT_OPS {report_ops}\n", 1, "report interval"),
    ("herd/worker.c", "rolling_iter >= M_4", "rolling_iter >= HERD_REPORT_OPS", 1,
     "report interval"),
    ("herd/worker.c", "wrkr_lid, M_4 / seconds", "wrkr_lid, HERD_REPORT_OPS / seconds", 1,
     "report interval"),
]
for path, old, new, count, why in PATCHES:
    f = src / path
    text = f.read_text()
    found = text.count(old)
    if found != count:
        sys.exit(f"patch '{why}': {path} has {found} of {old!r}, expected {count}")
    f.write_text(text.replace(old, new))
print(f"patched {len(PATCHES)} places in {src}", file=sys.stderr)
PY
}

build_original() {  # build_original REPO BUILD_ROOT THREADS WINDOW -> BUILD_ROOT/tTwW/main
  local repo=$1 dir=$2/t$3w$4 f
  rm -rf "$dir" && mkdir -p "$dir/src" "$dir/obj"
  git -C "$repo" archive "$RDMA_BENCH_COMMIT" herd libhrd mica | tar -x -C "$dir/src"
  patch_original "$dir/src" "$3" "$4"
  for f in libhrd/hrd_conn libhrd/hrd_util mica/mica mica/city herd/main herd/client \
    herd/master herd/worker; do
    gcc "${ORIGINAL_CFLAGS[@]}" -I "$dir/src/libhrd" -I "$dir/src/mica" \
      -c "$dir/src/$f.c" -o "$dir/obj/${f//\//_}.o" 2>>"$dir/build.log" ||
      { cat "$dir/build.log" >&2; die "compiling the original's $f.c failed (log: $dir/build.log)"; }
  done
  gcc -O3 -o "$dir/main" "$dir"/obj/*.o -libverbs -lrt -lpthread -lmemcached -lnuma \
    2>>"$dir/build.log" || { cat "$dir/build.log" >&2; die "linking the original failed"; }
  echo "$dir/main"
}

if [ "${1:-}" != "--inside" ]; then
  repo=${1:-${HERD_RDMA_BENCH:-}}
  [ -n "$repo" ] || die "no rdma_bench clone: pass its path or set HERD_RDMA_BENCH
  (git clone https://github.com/efficient/rdma_bench; a bare git dir works too)"
  [ -d "$repo" ] || die "rdma_bench clone not found: $repo"
  git -C "$repo" cat-file -e "$RDMA_BENCH_COMMIT^{commit}" 2>/dev/null ||
    die "$repo does not hold rdma_bench commit $RDMA_BENCH_COMMIT (git fetch there?)"
  ./scripts/setup.sh --quiet
  build=${HERD_ORIGINAL_BUILD:-${XDG_CACHE_HOME:-$HOME/.cache}/herd/original_herd}
  for cfg in $configs; do
    log "building the original for ${cfg%x*} client thread(s), window ${cfg#*x}"
    build_original "$repo" "$build" "${cfg%x*}" "${cfg#*x}" >/dev/null
  done
  if [ -n "${HERD_BUILD_ONLY:-}" ]; then
    log "built the original in $build (HERD_BUILD_ONLY: no guest run)"
    exit 0
  fi
  if [ -z "${HERD_NO_BUILD:-}" ]; then
    # portable_opt: -O3 without -march=native (the guest CPU has no AVX-512).
    bazel build --config=portable_opt //herd:herd_server //bench:herd_client 2>&1 | tail -n 1
  fi
  for f in "$bin/herd/herd_server" "$bin/bench/herd_client"; do
    [ -x "$f" ] || die "$f missing: bazel build --config=portable_opt //herd:herd_server //bench:herd_client"
  done
  mkdir -p "$out"
  rm -f "$out"/original_* "$out"/herd_* "$out"/summary.*  # a previous run's, .failed marks included
  export HERD_VM_TIMEOUT=${HERD_VM_TIMEOUT:-1500}
  HERD_VM_RW="$out" HERD_VM_ENV="HERD_REPETITIONS HERD_ORIGINAL_CONFIGS" \
    exec ./scripts/rxe_vm.sh bash scripts/original_herd_rxe.sh --inside "$build" "$out"
fi

# ---------------------------------------------------------------- guest side
build=$2

# herd's knobs as scripts/rxe_side_by_side.sh's; threads and window per configuration.
server_knobs=(--workers=1 --pin_workers=false --max_clients=8 --mica_items=20000
  --mica_log_bytes=16777216 --request_verb=uc_write --response_verb=ud_send)
client_knobs=(--clients_per_thread=1 --workload=C --keys=$KEYS --key_bytes=16 --value_bytes=32
  --warmup_s=1 --duration_s=3 --retry_timeout_us=200000)
fabric=(--fabric=verbs --device=rxe0)

source scripts/lib/run_herd.sh
run_herd() {  # run_herd NAME THREADS WINDOW
  local with_server=("${server_knobs[@]}" --window="$3" "${fabric[@]}")
  local with_client=("${client_knobs[@]}" --threads="$2" "${fabric[@]}")
  run_herd_once "$1" "$out" "$bin" with_server with_client
}

remove_shm() {
  local key
  for key in "${SHM_KEYS[@]}"; do ipcrm -M "$key" 2>/dev/null || true; done
}

worker_reports() { grep -c 'IOPS' "$1" 2>/dev/null || true; }

run_original() {  # run_original NAME THREADS WINDOW -- upstream's run-servers.sh + run-machine.sh
  local name=$1 threads=$2 main=$build/t$2w$3/main pids=() p started failure=
  remove_shm
  memcached -u root -l 127.0.0.1 -p 11211 &
  pids+=($!)
  export HRD_REGISTRY_IP=127.0.0.1
  until (exec 4<>/dev/tcp/127.0.0.1/11211) 2>/dev/null; do sleep 0.1; done
  # Line-buffered stdout: the worker's reports reach its log as they are printed.
  stdbuf -oL "$main" --master 1 --base-port-index 0 --num-server-ports 1 \
    >"$out/$name.master.log" 2>&1 &
  pids+=($!)
  started=$SECONDS
  until grep -q 'Master published all QPs' "$out/$name.master.log"; do
    kill -0 "${pids[1]}" 2>/dev/null || { failure="the master exited"; break; }
    ((SECONDS - started < ORIGINAL_TIMEOUT_S)) || { failure="the master never published"; break; }
    sleep 0.2
  done
  if [ -z "$failure" ]; then
    # Postlist: the worker takes at most one request per client per pass (upstream asserts
    # postlist <= NUM_CLIENTS), so this is the largest batch it can form.
    stdbuf -oL "$main" --is-client 0 --base-port-index 0 --num-server-ports 1 \
      --postlist "$threads" >"$out/$name.worker.log" 2>&1 &
    pids+=($!)
    stdbuf -oL "$main" --num-threads "$threads" --base-port-index 0 --num-server-ports 1 \
      --num-client-ports 1 --is-client 1 --update-percentage 0 --machine-id 0 \
      >"$out/$name.client.log" 2>&1 &
    pids+=($!)
  fi
  while [ -z "$failure" ] &&
    (($(worker_reports "$out/$name.worker.log") < SKIP_REPORTS + MEASURED_REPORTS)); do
    for p in "${pids[@]}"; do
      kill -0 "$p" 2>/dev/null || failure="a process of the original (pid $p) exited"
    done
    ((SECONDS - started < ORIGINAL_TIMEOUT_S)) ||
      failure="$(worker_reports "$out/$name.worker.log") of $((SKIP_REPORTS + MEASURED_REPORTS)) worker reports in ${ORIGINAL_TIMEOUT_S} s"
    sleep 0.5
  done
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  remove_shm
  if [ -n "$failure" ]; then  # recorded, and the run goes on: the summary shows what is missing
    log "$name: FAILED: $failure; the ends of its logs:"
    tail -n 5 "$out/$name".*.log >&2 || true
    echo "$failure" >"$out/$name.failed"
  fi
}

echo "$HUGEPAGES" >/proc/sys/vm/nr_hugepages
[ "$(cat /proc/sys/vm/nr_hugepages)" -ge "$HUGEPAGES" ] ||
  die "the guest reserved only $(cat /proc/sys/vm/nr_hugepages) of $HUGEPAGES hugepages (HERD_VM_MEM?)"

pairs=()
for ((rep = 1; rep <= reps; rep++)); do
  for cfg in $configs; do
    threads=${cfg%x*} window=${cfg#*x}
    log "repetition $rep, $threads client thread(s), window $window: original"
    run_original "original_${cfg}_$rep" "$threads" "$window"
    log "repetition $rep, $threads client thread(s), window $window: herd"
    run_herd "herd_${cfg}_$rep" "$threads" "$window"
    pairs+=("${cfg}_$rep")
  done
done

/usr/bin/python3 - "$out" "$SKIP_REPORTS" "$MEASURED_REPORTS" "$REPORT_OPS" "${pairs[@]}" <<'PY'
import json, pathlib, re, statistics, sys
out = pathlib.Path(sys.argv[1])
skip, measured, report_ops = map(int, sys.argv[2:5])
REPORT = re.compile(r"Worker \d+: ([0-9.]+) IOPS\. Avg per-port postlist = ([0-9.]+)\. "
                    r"HERD lookup fail rate = ([0-9.na-]+)")
def load(path):  # a run's JSON, or None where the run left none
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
rows = []
for pair in sys.argv[5:]:
    cfg, rep = pair.rsplit("_", 1)
    row = {"config": cfg, "rep": int(rep)}
    # The original: its worker's reports after the dropped ones, over their total time.
    worker_log = out / f"original_{pair}.worker.log"
    text = re.sub(r"\x1b\[[0-9;]*m", "", worker_log.read_text() if worker_log.exists() else "")
    reports = REPORT.findall(text)[skip:skip + measured]
    seconds = sum(report_ops / float(r[0]) for r in reports)
    failed = out / f"original_{pair}.failed"
    row.update({
        "original_kops": round(len(reports) * report_ops / seconds / 1e3, 2) if reports else None,
        "original_failed": failed.read_text().strip() if failed.exists() else None,
        "original_reports_kops": [round(float(r[0]) / 1e3, 2) for r in reports],
        "original_postlist": [float(r[1]) for r in reports],
        "original_lookup_fail_rate": [r[2] for r in reports],
        "original_request_bytes": 17, "original_response_bytes": 32})
    # herd: its client's JSON and its server's fabric counters.
    c, s = load(out / f"herd_{pair}.json"), load(out / f"herd_{pair}.server.json")
    row["herd_kops"] = round(c["mops"] * 1e3, 2) if c else None
    if c:
        row.update({"herd_p50_us": c["p50_us"], "herd_p99_us": c["p99_us"],
                    "herd_retransmissions": c["retransmissions"],
                    "herd_request_bytes": c["bytes_per_wr"]})
    if s:
        f = s["server"]["fabric"]
        row.update({"herd_response_bytes": round(f["bytes"] / max(f["wrs"], 1), 1),
                    "herd_responses_per_doorbell": round(f["wrs"] / max(f["doorbells"], 1), 2),
                    "herd_batch": s["server"].get("batch")})
    row["herd_over_original"] = (round(row["herd_kops"] / row["original_kops"], 3)
                                 if row["herd_kops"] and row["original_kops"] else None)
    rows.append(row)
with open(out / "summary.jsonl", "w") as jf:
    for row in rows:
        jf.write(json.dumps(row) + "\n")
def cell(v, width, digits):
    return f"{'n/a':>{width}}" if v is None else f"{v:>{width}.{digits}f}"
def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
lines = [f"{'run':<12} {'original Kops':>13} {'herd Kops':>10} {'herd/original':>14}"]
for row in rows:
    lines.append(f"{row['config'] + ' #' + str(row['rep']):<12} {cell(row['original_kops'], 13, 2)} "
                 f"{cell(row['herd_kops'], 10, 2)} {cell(row['herd_over_original'], 14, 3)}")
for cfg in dict.fromkeys(r["config"] for r in rows):
    mine = [r for r in rows if r["config"] == cfg]
    lines.append(f"{cfg + ' median':<12} {cell(median(r['original_kops'] for r in mine), 13, 2)} "
                 f"{cell(median(r['herd_kops'] for r in mine), 10, 2)} "
                 f"{cell(median(r['herd_over_original'] for r in mine), 14, 3)}")
lines.append("(config THREADSxWINDOW; original: its worker's rate; herd: its client's)")
lines.append("bytes per request / response: original 17 / 32 (by construction); herd " +
             ", ".join(sorted({f"{r.get('herd_request_bytes')} / {r.get('herd_response_bytes')}"
                               for r in rows})) + " (its fabric counters: the client's over"
             " the measured window, the server's over its whole run, the preload's 32 B PUT"
             " replies included; a GET's reply is 64 B)")
text = "\n".join(lines)
(out / "summary.txt").write_text(text + "\n")
for row in rows:
    print(json.dumps(row))
print(text)
# A run without a rate on either side (the original hung or exited, herd served nothing) fails
# the whole comparison: its medians would stand on fewer runs than asked for.
missing = [f"{r['config']} #{r['rep']}" for r in rows
           if r["original_kops"] is None or not r["herd_kops"]]
if missing:
    sys.exit(f"original_herd_rxe: no rate for {', '.join(missing)} (see {out})")
PY

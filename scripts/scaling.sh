#!/usr/bin/env bash
# scripts/scaling.sh -- how herd's throughput grows with workers on this machine: herd_server with
# 1, 2, 4 ... workers (one core each, from core 0 up) against herd_client threads pinned to the
# other half of the cores, on the shm fabric; Mops, Mops per worker, the speedup over one worker,
# latency and retransmissions per point.
#
#   usage: scripts/scaling.sh [--bin DIR] [--out DIR] [--workers 1,2,4,8] [--client_threads N]
#                             [--clients_per_thread 32] [--duration_s 2] [--warmup_s 1]
#                             [--repetitions 1] [--client_cores LIST] [--profile]
#
# --bin: a directory holding herd/herd_server and bench/herd_client (default: builds
# --config=opt here and uses bazel-bin; ../shared/device packs binaries for another machine).
# Workers take cores 0..W-1, client threads cores C/2..C-1 (C = the cores online), so the
# largest worker count is C/2: on a 2-core machine that is one worker against one client thread,
# and the script says so (a scaling curve needs cores). --client_cores (e.g. 4-15) places the
# client threads elsewhere; the workers must then stay below it. --profile (where perf works) records the
# server of each point and adds its per-request cost breakdown (scripts/cost_breakdown.py).
# Writes OUT/results.jsonl (one line per run), OUT/summary.json (the median of each point) and
# OUT/scaling.svg (Mops against workers, with the line of perfect scaling); prints the summary.
# Default OUT: results/scaling-<host>.
set -uo pipefail
cd "$(dirname "$0")/.."

bin="" out="" workers_list="" client_threads="" client_cores="" clients_per_thread=32 duration_s=2
warmup_s=1
repetitions=1 profile=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --workers) workers_list=$2; shift 2 ;;
    --client_threads) client_threads=$2; shift 2 ;;
    --clients_per_thread) clients_per_thread=$2; shift 2 ;;
    --client_cores) client_cores=$2; shift 2 ;;
    --duration_s) duration_s=$2; shift 2 ;;
    --warmup_s) warmup_s=$2; shift 2 ;;
    --repetitions) repetitions=$2; shift 2 ;;
    --profile) profile=1; shift ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "scaling.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done

cores=$(nproc)
half=$((cores / 2))
[ "$half" -ge 1 ] || half=1
if [ -z "$workers_list" ]; then
  workers_list=""
  for w in 1 2 4 8 16 32 64; do [ "$w" -le "$half" ] && workers_list="${workers_list:+$workers_list,}$w"; done
fi
[ -n "$client_threads" ] || client_threads=$((cores - half))
[ "$client_threads" -ge 1 ] || client_threads=1
if [ "$cores" -lt 4 ]; then
  echo "scaling.sh: only ${cores} core(s) here: one worker against ${client_threads} client thread(s); a scaling curve needs more cores (see ../shared/device)" >&2
fi
for w in ${workers_list//,/ }; do
  [[ "$w" =~ ^[1-9][0-9]*$ ]] || { echo "scaling.sh: --workers: '${w}' is not a count" >&2; exit 2; }
  if [ "$w" -gt "$half" ]; then
    echo "scaling.sh: --workers ${w} does not fit: workers get cores 0..$((half - 1)), clients the rest" >&2
    exit 2
  fi
done
if [ -z "$client_cores" ]; then
  client_cores="${half}-$((cores - 1))"
  [ "$cores" -ge 2 ] || client_cores=0
fi

if [ -z "$bin" ]; then
  bazel build --config=opt //herd:herd_server //bench:herd_client >&2 || exit 1
  bin=$(bazel info --config=opt bazel-bin 2>/dev/null)
fi
for b in herd/herd_server bench/herd_client; do
  [ -x "$bin/$b" ] || { echo "scaling.sh: no $b under $bin" >&2; exit 2; }
done
out=${out:-results/scaling-$(hostname)}
mkdir -p "$out/logs"
results="$out/results.jsonl"
: >"$results"
if [ "$profile" = 1 ] && ! python3 -c 'import sys; sys.path.insert(0, "scripts"); import cost_breakdown; sys.exit(1 if cost_breakdown.perf_unusable() else 0)'; then
  echo "scaling.sh: --profile: perf is not usable here; running without it" >&2
  profile=0
fi

# Every worker's MICA partition (98 MiB: 49 pages) on 2 MiB pages, with room for the client
# processes' landing buffers (lent as root, given back after: scripts/lib/hugepages.sh).
. scripts/lib/hugepages.sh
max_workers=0
for w in ${workers_list//,/ }; do [ "$w" -le "$max_workers" ] || max_workers=$w; done
lend_hugepages $((max_workers * 49 + 32)) "scripts/scaling.sh"
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null
  wait 2>/dev/null
  give_back_hugepages
}
trap cleanup EXIT
trap 'exit 130' INT TERM

point() {  # point WORKERS REPETITION
  local w=$1 r=$2 tag="w${1}_r${2}" fabric="scaling-$$-${1}-${2}" port="" i
  local clients=$((client_threads * clients_per_thread))
  local log="$out/logs/$tag.server.log"
  "$bin/herd/herd_server" --port=0 --listen_address=127.0.0.1 --shm_fabric_name="$fabric" \
    --workers="$w" --worker_cores="0-$((w - 1))" --max_clients="$clients" >"$log" 2>&1 &
  server_pid=$!
  for i in $(seq 1 400); do
    port=$(sed -n 's/^herd_server ready port=\([0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "$port" ] && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.05
  done
  if [ -z "$port" ]; then
    echo "scaling.sh: the server of ${tag} did not start: $(tail -2 "$log")" >&2
    return 1
  fi
  local perf_pid=""
  if [ "$profile" = 1 ]; then
    (sleep "$warmup_s"; exec perf record -q -e cpu-clock -g -F 999 -p "$server_pid" \
      -o "$out/logs/$tag.perf" -- sleep "$duration_s") >"$out/logs/$tag.perf.log" 2>&1 &
    perf_pid=$!
  fi
  local json
  json=$("$bin/bench/herd_client" --server="127.0.0.1:$port" --shm_fabric_name="$fabric" \
    --threads="$client_threads" --clients_per_thread="$clients_per_thread" \
    --client_cores="$client_cores" --duration_s="$duration_s" --warmup_s="$warmup_s" \
    2>"$out/logs/$tag.client.log" | grep '^{' | tail -1)
  [ -n "$perf_pid" ] && wait "$perf_pid"
  kill -TERM "$server_pid" 2>/dev/null
  wait "$server_pid" 2>/dev/null
  server_pid=""
  if [ -z "$json" ]; then
    echo "scaling.sh: the client of ${tag} printed no result: $(tail -2 "$out/logs/$tag.client.log")" >&2
    return 1
  fi
  python3 - "$json" "$w" "$r" "$client_threads" "$clients_per_thread" "$cores" \
    "$([ "$profile" = 1 ] && echo "$out/logs/$tag.perf")" "$duration_s" >>"$results" <<'EOF'
import json, sys
sys.path.insert(0, "scripts")
run = json.loads(sys.argv[1])
point = {"workers": int(sys.argv[2]), "repetition": int(sys.argv[3]),
         "client_threads": int(sys.argv[4]), "clients_per_thread": int(sys.argv[5]),
         "cores": int(sys.argv[6])}
point.update({k: run[k] for k in ("mops", "p50_us", "p99_us", "retransmissions", "timed_out")
              if k in run})
if sys.argv[7]:
    import cost_breakdown
    ops = run["mops"] * 1e6 * float(sys.argv[8])
    point["breakdown"] = cost_breakdown.breakdown(sys.argv[7], "worker", ops)
print(json.dumps(point))
EOF
  echo "scaling.sh: ${tag}: $(tail -1 "$results")" >&2
}

failed=0
for r in $(seq 1 "$repetitions"); do
  for w in ${workers_list//,/ }; do
    point "$w" "$r" || failed=$((failed + 1))
  done
done

python3 - "$results" "$out" "$(hostname)" <<'EOF'
import json, pathlib, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = pathlib.Path(sys.argv[2])
points = []
for w in sorted({r["workers"] for r in runs}):
    mine = [r for r in runs if r["workers"] == w]
    mops = statistics.median(r["mops"] for r in mine)
    points.append({"workers": w, "mops": round(mops, 3), "mops_per_worker": round(mops / w, 3),
                   "p99_us": statistics.median(r["p99_us"] for r in mine),
                   "retransmissions": max(r.get("retransmissions", 0) for r in mine),
                   "runs": len(mine)})
if points:
    one = next((p["mops"] for p in points if p["workers"] == 1), None)
    for p in points:
        p["speedup"] = round(p["mops"] / one, 2) if one else None
summary = {"host": sys.argv[3], "cores": runs[0]["cores"] if runs else None,
           "client_threads": runs[0]["client_threads"] if runs else None,
           "clients_per_thread": runs[0]["clients_per_thread"] if runs else None, "points": points}
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
# A plain SVG (no plotting library needed): Mops against workers, and perfect scaling.
if points:
    w_max = max(p["workers"] for p in points)
    one = points[0]["mops"] / points[0]["workers"]
    y_max = max(max(p["mops"] for p in points), one * w_max) * 1.1
    width, height, left, bottom, top, right = 520, 340, 60, 40, 30, 20
    px = lambda w: left + (width - left - right) * (w / w_max)
    py = lambda y: height - bottom - (height - bottom - top) * (y / y_max)
    line = " ".join(f"{px(p['workers']):.1f},{py(p['mops']):.1f}" for p in points)
    ideal = f"{px(0):.1f},{py(0):.1f} {px(w_max):.1f},{py(one * w_max):.1f}"
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           'font-family="sans-serif" font-size="12">',
           f'<text x="{left}" y="18">herd on {sys.argv[3]}: Mops vs workers '
           f'({summary["client_threads"]} client threads x {summary["clients_per_thread"]})</text>',
           f'<line x1="{left}" y1="{py(0)}" x2="{width - right}" y2="{py(0)}" stroke="black"/>',
           f'<line x1="{left}" y1="{py(0)}" x2="{left}" y2="{top}" stroke="black"/>',
           f'<polyline points="{ideal}" fill="none" stroke="#999" stroke-dasharray="4"/>',
           f'<polyline points="{line}" fill="none" stroke="#1f77b4" stroke-width="2"/>']
    for p in points:
        svg.append(f'<circle cx="{px(p["workers"]):.1f}" cy="{py(p["mops"]):.1f}" r="3" fill="#1f77b4"/>')
        svg.append(f'<text x="{px(p["workers"]) - 4:.1f}" y="{height - bottom + 16}">{p["workers"]}</text>')
        svg.append(f'<text x="{px(p["workers"]) + 5:.1f}" y="{py(p["mops"]) - 5:.1f}">{p["mops"]:.2f}</text>')
    svg.append(f'<text x="{width / 2 - 20}" y="{height - 6}">workers</text>')
    svg.append(f'<text x="6" y="{top + 10}">Mops</text></svg>')
    (out / "scaling.svg").write_text("\n".join(svg) + "\n")
print(json.dumps(summary, separators=(",", ":")))
EOF
[ "$failed" -eq 0 ] || { echo "scaling.sh: ${failed} point(s) failed" >&2; exit 1; }

#!/usr/bin/env bash
# scripts/compare_revisions.sh -- this tree against another revision, side by side in one run, so
# a claim "faster than" names its baseline.
#
#   usage: scripts/compare_revisions.sh REV [compare.py options...]
#   e.g.   scripts/compare_revisions.sh c6be3b7 --repetitions=5 --profile
#
# Builds REV in a throwaway git worktree (--config=opt, or --build=CONFIG among the options) and
# this tree, then:
#   1. engine_bench of each tree, interleaved (where both have bench/engine_bench): ns per GET and
#      PUT of the worker alone, each repetition this tree then REV;
#   2. scripts/compare.py revision: herd_server + herd_client of this tree, then REV's, with the
#      same flags and cores, --repetitions times (medians compared; with --profile each side's
#      per-request breakdown by scripts/cost_breakdown.py).
# Results under results/compare_revisions/<REV>/ (each run's JSON, engine.jsonl); the last line
# is compare.py's {"herd_mops":..,"revision_mops":..,"ratio":..} (this tree / REV).
# Both trees must know the flags passed (herd_client's and herd_server's). The worktree is
# removed on every exit.
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -ge 1 ] || { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
rev=$1
shift
commit=$(git rev-parse --verify --quiet "${rev}^{commit}") ||
  { echo "compare_revisions: '${rev}' is not a revision of this repository" >&2; exit 2; }
build=opt
repetitions=3
for arg in "$@"; do
  case "$arg" in
    --build=*) build=${arg#--build=} ;;
    --repetitions=*) repetitions=${arg#--repetitions=} ;;
  esac
done
config=()
[ "$build" = default ] || config=("--config=${build}")

out="results/compare_revisions/${rev}"
mkdir -p "$out"
worktree=$(mktemp -d /tmp/herd-rev.XXXXXX)
. scripts/lib/hugepages.sh
cleanup() {
  git worktree remove --force "$worktree" >/dev/null 2>&1 || rm -rf "$worktree"
  git worktree prune >/dev/null 2>&1 || true
  give_back_hugepages
}
trap cleanup EXIT
git worktree add --detach -f "$worktree" "$commit" >/dev/null

targets=(//herd:herd_server //bench:herd_client)
echo "[compare_revisions] building this tree and ${rev} (${commit:0:12}) with ${config[*]:-default}" >&2
# engine_bench where both trees have it (a tree older than it, run with these scripts copied in,
# compares end to end only).
has_engine_bench=0
if bazel query //bench:engine_bench >/dev/null 2>&1 &&
  (cd "$worktree" && bazel query //bench:engine_bench >/dev/null 2>&1); then
  has_engine_bench=1
fi
# herd_client lived in herd/ before the layer split (c6be3b7 and older): build it where it is.
rev_client=//bench:herd_client
(cd "$worktree" && bazel query "$rev_client" >/dev/null 2>&1) || rev_client=//herd:herd_client
bazel build "${config[@]}" "${targets[@]}" $([ "$has_engine_bench" = 1 ] && echo //bench:engine_bench)
(cd "$worktree" && bazel build "${config[@]}" //herd:herd_server "$rev_client" \
  $([ "$has_engine_bench" = 1 ] && echo //bench:engine_bench))
this_bin=$(bazel info "${config[@]}" bazel-bin 2>/dev/null)
rev_bin=$(cd "$worktree" && bazel info "${config[@]}" bazel-bin 2>/dev/null)
# The other tree's bazel-bin is a link into its output base, which outlives the worktree only
# until bazel's next clean of it: copy what the runs need.
rev_copy="$out/bin"
rm -rf "$rev_copy" && mkdir -p "$rev_copy/herd" "$rev_copy/bench"
cp "$rev_bin/herd/herd_server" "$rev_copy/herd/"
rev_client_path=${rev_client#//}
cp "$rev_bin/${rev_client_path/://}" "$rev_copy/bench/herd_client"
[ "$has_engine_bench" = 1 ] && cp "$rev_bin/bench/engine_bench" "$rev_copy/bench/"
(cd "$worktree" && bazel shutdown >/dev/null 2>&1 || true)

# Both trees' stores on 2 MiB pages, as MICA is meant to run: engine_bench's two partitions of 98
# MiB, or one herd_server's with its clients' landing buffers (lent as root, given back after).
lend_hugepages 128 "scripts/compare_revisions.sh"
engine="$out/engine.jsonl"
: >"$engine"
if [ "$has_engine_bench" = 1 ]; then
  for r in $(seq 1 "$repetitions"); do
    for side in this rev; do
      bin=$this_bin
      [ "$side" = rev ] && bin=$rev_copy
      "$bin/bench/engine_bench" --core=0 2>>"$out/engine.log" |
        sed "s/^{/{\"tree\":\"${side}\",\"repetition\":${r},/" >>"$engine"
    done
  done
  python3 - "$engine" "$rev" <<'EOF'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
for phase in sorted({r["phase"] for r in runs}):
    ns = {t: statistics.median(r["engine_ns"] for r in runs if r["tree"] == t and r["phase"] == phase)
          for t in ("this", "rev")}
    print(f"[compare_revisions] engine_bench {phase}: this tree {ns['this']:.1f} ns, "
          f"{sys.argv[2]} {ns['rev']:.1f} ns per request (this/{sys.argv[2]} "
          f"{ns['this'] / ns['rev']:.3f})", file=sys.stderr)
EOF
else
  echo "[compare_revisions] a tree without bench/engine_bench: engine-only comparison skipped" >&2
fi

# Not exec: the EXIT trap removes the worktree.
python3 scripts/compare.py revision --no-build --baseline_bin="$rev_copy" --out="$out" "$@"

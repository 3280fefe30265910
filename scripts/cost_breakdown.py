#!/usr/bin/python3
"""Where one request's CPU time goes, from a `perf record -g` profile of one busy process.

usage:
  cost_breakdown.py PERF_DATA --side worker|client --ops N   one profile, as a table + JSON line

Each sample's call stack is walked from the leaf up to the first frame a rule below names (a
libc memcpy called by the parser counts as parsing; a shm delivery called by post_send counts
as the fabric's). ns per request = the CPU time of the category's samples (perf record -e cpu-clock) /
the requests served while perf recorded. compare.py --profile records both sides of every run and calls this.

The "fabric" category is the work a NIC does in hardware (placing bytes, writing completions,
taking receives), which the shm fabric does on the poster's CPU: the echo baseline pays it too.

Limitation: stacks come from frame pointers (perf record -g). An assembly leaf that builds no
frame (glibc's memcpy, memset) is reported under its caller's CALLER: the worker's header and
key copies in ParseRequest count as admit+dedupe, not parse+check (a few ns per request).
"""
import argparse
import collections
import json
import re
import subprocess
import sys

# (category, regex on the symbol), tried in order on each frame, leaf first.
WORKER_RULES = [
    ("fabric", r"^transport::shm::(ShmQp::(Deliver|Run|Execute|RdmaWrite|Complete|Finish|"
               r"InjectLoss|ConnectedToUs|PlaceSend|FindRings|ArrivalOf)|PushCompletion|"
               r"ReserveCompletion|PublishCompletion|PopReceive|Peer::|ShmDevice::port)"),
    ("hash", r"^mica::KeyHash"),
    ("store", r"^mica::"),
    ("parse+check", r"^herd::(ParseRequest|WireChecksum)|^util::WordChecksum"),
    ("admit+dedupe", r"^herd::Worker::(Admit|StartSession|RecordOutcome)"),
    ("encode response", r"^herd::(Worker::(EncodeResponse|AssignResponse|WireStatus|"
                        r"AnswerReleased)|EncodeResponseHeader)"),
    ("post", r"^herd::(SendChains|Worker::PostResponses)|^transport::(shm::ShmQp::PostSend|"
             r"QueuePair::ValidateSend)"),
    ("reap", r"^herd::Worker::Reap|^transport::shm::ShmCq::"),
    ("execute (rest)", r"^herd::Worker::ExecuteAndRespond"),
    ("scan", r"^herd::(Worker::(Gather|Run)|SlotScanner)"),
    ("echo loop", r"bench::echo::"),
]
CLIENT_RULES = [
    ("fabric", WORKER_RULES[0][1]),
    ("clock", r"clock_gettime|steady_clock|GetCurrentTimeNanos|ToInt64Nanoseconds|"
              r"ToChronoNanoseconds|absl::.*Now"),
    ("workload", r"^bench::(Workload|Zipf|Keys)|mersenne_twister|uniform_.*distribution"),
    ("hash", r"^mica::KeyHash"),
    ("encode request", r"^herd::(EncodeRequest|WireChecksum|SetRequest)|^util::WordChecksum"),
    ("check response", r"^herd::(ParseResponse|Client::(Accept|Deliver|PollUdResponses|"
                       r"PollWriteResponses))"),
    ("post", r"^herd::(SendChains|Client::(Send|Stage|Flush|RepostReceives))|"
             r"^transport::(shm::ShmQp::(PostSend|PostRecv)|QueuePair::ValidateSend)"),
    ("reap", r"^herd::Client::Reap|^transport::shm::ShmCq::"),
    ("submit+windows", r"^herd::Client::"),
    ("bench loop", r"RunThread|^main$"),
]
KERNEL = "kernel"
OTHER = "other"


def perf_unusable():
    """None when `perf record -e cpu-clock` works here, else why not."""
    try:
        probe = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-o", "/dev/null",
                                "--", "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"perf is not runnable ({error}); scripts/setup.sh installs linux-perf"
    if probe.returncode != 0:
        return ("perf record failed (kernel.perf_event_paranoid too high?): " +
                probe.stderr.strip()[-300:])
    return None


def categorize(samples, rules):
    """{category: ns of CPU time} over `samples` ((ns, stack of symbols, leaf first))."""
    compiled = [(name, re.compile(pattern)) for name, pattern in rules]
    totals = collections.Counter()
    for ns, stack in samples:
        category = None
        for symbol in stack:
            for name, pattern in compiled:
                if pattern.search(symbol):
                    category = name
                    break
            if category:
                break
        if category is None:
            category = KERNEL if stack and stack[0].startswith("[k]") else OTHER
        totals[category] += ns
    return totals


def read_samples(perf_data):
    """(ns, call stack leaf first) of every sample in `perf_data`, recorded with -e cpu-clock
    (whose sample period is the CPU time it stands for, in ns)."""
    text = subprocess.run(["perf", "script", "-i", str(perf_data), "-F", "period,ip,sym,dso"],
                          check=True, capture_output=True, text=True).stdout
    samples, period, stack = [], None, []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            if period is not None:
                samples.append((period, stack))
            period, stack = None, []
        elif period is None:
            period = int(line.split()[0])  # the sample's line: its period
        else:
            # a frame: "addr symbol+off (dso)"
            parts = line.split(" ", 1)
            if len(parts) < 2:
                continue
            symbol, _, dso = parts[1].rpartition(" (")
            symbol = re.sub(r"\+0x[0-9a-f]+$", "", symbol)
            if "kernel" in dso or dso.startswith("[k"):
                symbol = "[k]" + symbol
            stack.append(symbol)
    if period is not None:
        samples.append((period, stack))
    return samples


def per_request(totals, rules, ops):
    """{category: ns per request} plus the total, in the rules' order; ValueError when there is
    nothing to divide (no requests served, or no samples: a profile that recorded nothing is a
    failed measurement, not a cost of 0)."""
    if ops <= 0:
        raise ValueError(f"{ops} requests served while perf recorded")
    if not totals:
        raise ValueError("the profile holds no samples")
    order = [name for name, _ in rules] + [KERNEL, OTHER]
    result = {name: round(totals[name] / ops, 1) for name in order if name in totals}
    result["total"] = round(sum(totals.values()) / ops, 1)
    return result


def breakdown(perf_data, side, ops):
    """{category: ns per request} plus the total, from one profile and the requests served."""
    rules = WORKER_RULES if side == "worker" else CLIENT_RULES
    return per_request(categorize(read_samples(perf_data), rules), rules, ops)


def table(columns):
    """A markdown table: one row per category, one column per (title, breakdown)."""
    names = []
    for _, b in columns:
        names += [n for n in b if n not in names and n != "total"]
    lines = ["| ns / request | " + " | ".join(t for t, _ in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for name in names + ["total"]:
        lines.append(f"| {name} | " + " | ".join(f"{b.get(name, 0):.1f}" for _, b in columns) +
                     " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("perf_data")
    parser.add_argument("--side", choices=["worker", "client"], required=True)
    parser.add_argument("--ops", type=float, required=True,
                        help="requests served while perf recorded")
    args = parser.parse_args()
    result = breakdown(args.perf_data, args.side, args.ops)
    print(table([(args.side, result)]), file=sys.stderr)
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Table, CSV and PNG plot of a sweep: reads DIR/clients_*.json (herd_client's final JSON).

usage: sweep_report.py DIR AXIS TITLE
Prints a table, writes DIR/sweep.csv and DIR/sweep.png (throughput and p99 vs AXIS).
"""
import csv
import glob
import json
import os
import sys


def main():
    directory, axis, title = sys.argv[1], sys.argv[2], sys.argv[3]
    rows = []
    for path in glob.glob(os.path.join(directory, "clients_*.json")):
        with open(path) as f:
            text = f.read().strip()
        if not text:
            print(f"warning: {path} is empty (the point failed)", file=sys.stderr)
            continue
        rows.append(json.loads(text))
    if not rows:
        sys.exit("no results")
    rows.sort(key=lambda r: r[axis])
    fields = [axis, "mops", "p50_us", "p99_us", "p999_us", "retransmissions",
              "doorbells_per_wr", "signaled_fraction", "inline_fraction", "cpu_s"]
    with open(os.path.join(directory, "sweep.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(fields)
        for r in rows:
            writer.writerow([r[k] for k in fields])
    print(f"{axis:>8} {'Mops':>8} {'p50 us':>8} {'p99 us':>8} {'p99.9 us':>9} {'retx':>6}")
    for r in rows:
        print(f"{r[axis]:>8} {r['mops']:>8.3f} {r['p50_us']:>8.2f} {r['p99_us']:>8.2f} "
              f"{r['p999_us']:>9.2f} {r['retransmissions']:>6}")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, left = plt.subplots(figsize=(7, 4.2))
    xs = [r[axis] for r in rows]
    left.plot(xs, [r["mops"] for r in rows], "o-", color="tab:blue", label="throughput")
    left.set_xscale("log", base=2)
    left.set_xlabel(axis)
    left.set_ylabel("Mops", color="tab:blue")
    left.set_ylim(bottom=0)
    right = left.twinx()
    right.plot(xs, [r["p99_us"] for r in rows], "s--", color="tab:red", label="p99 latency")
    right.set_ylabel("p99 latency (us)", color="tab:red")
    right.set_ylim(bottom=0)
    fig.suptitle(title, fontsize=9)
    cpu = rows[0].get("cpu_model", "?")
    left.set_title(f"{cpu}, {rows[0].get('cores', '?')} cores", fontsize=8)
    fig.tight_layout()
    png = os.path.join(directory, "sweep.png")
    fig.savefig(png, dpi=120)
    print(f"[demo] table above; {os.path.join(directory, 'sweep.csv')} and {png} written",
          file=sys.stderr)


if __name__ == "__main__":
    main()

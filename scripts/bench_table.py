#!/usr/bin/env python3
"""Print mica_bench's JSON lines as a table: one row per (items, dist, op), both stores side by
side, and their ratio measured in the same run.

usage: bench_table.py RESULTS.jsonl
"""
import json
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rows = {}
    summary = None
    with open(sys.argv[1]) as results:
        for line in results:
            record = json.loads(line)
            if "case" in record:
                summary = record
                continue
            key = (record["items"], record["dist"], record["op"])
            rows.setdefault(key, {})[record["store"]] = record
    header = f"{'items':>10} {'dist':>8} {'op':>4} {'mica Mops':>10} {'map Mops':>9} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for (items, dist, op), stores in sorted(rows.items()):
        mica = stores.get("mica", {}).get("mops", float("nan"))
        flat = stores.get("flat_hash_map", {}).get("mops", float("nan"))
        print(f"{items:>10} {dist:>8} {op:>4} {mica:>10.2f} {flat:>9.2f} {mica / flat:>6.2f}")
    if summary:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()

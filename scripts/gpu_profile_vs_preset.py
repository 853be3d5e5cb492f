#!/usr/bin/env python3
"""Measured per-op GPU costs (`apart profile --backend cuda`) against an analytic preset (`apart costs --device
h200-141gb`), per op type: forward+backward seconds summed over the batch tasks of each type, and their ratio.

usage: gpu_profile_vs_preset.py ANALYTIC.json MEASURED.json
Both are apart.costs/1 files of the same model at the same micro-batch size (tasks in the importer's order).
Prints a Markdown table, then WORST_OP_RATIO=<measured/analytic furthest from 1 among the op types holding at
least 1 % of the measured time> for scripts/gpu_check.sh's summary. Standard library only (the GPU machine has
no network).
"""
import json
import sys
from collections import defaultdict


def by_name(path):
    with open(path) as f:
        doc = json.load(f)
    if doc.get("schema") != "apart.costs/1":
        sys.exit(f"{path}: schema {doc.get('schema')!r}, expected 'apart.costs/1'")
    return doc, {t["name"]: t for t in doc["tasks"]}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    analytic_doc, analytic = by_name(sys.argv[1])
    measured_doc, measured = by_name(sys.argv[2])
    if analytic_doc.get("microbatch_size") != measured_doc.get("microbatch_size"):
        sys.exit(f"micro-batch sizes differ: analytic {analytic_doc.get('microbatch_size')}, "
                 f"measured {measured_doc.get('microbatch_size')}")
    only = set(analytic) ^ set(measured)
    if only:
        sys.exit(f"the files describe different models: {len(only)} tasks in one only, e.g. {sorted(only)[:3]}")

    totals = defaultdict(lambda: {"tasks": 0, "af": 0.0, "ab": 0.0, "mf": 0.0, "mb": 0.0})
    for name, a in analytic.items():
        if a.get("constant"):
            continue  # replicated shape arithmetic, not timed per step
        m = measured[name]
        t = totals[a["op"]]
        t["tasks"] += 1
        t["af"] += a["forward_s"]
        t["ab"] += a["backward_s"]
        t["mf"] += m["forward_s"]
        t["mb"] += m["backward_s"]

    all_measured = sum(t["mf"] + t["mb"] for t in totals.values())
    all_analytic = sum(t["af"] + t["ab"] for t in totals.values())
    print(f"analytic: {analytic_doc.get('device')} ({analytic_doc.get('source')}); measured: "
          f"{measured_doc.get('device')} ({measured_doc.get('source')}); micro-batch {analytic_doc.get('microbatch_size')}")
    print("| op | tasks | analytic fwd ms | measured fwd ms | analytic bwd ms | measured bwd ms | share of measured "
          "| measured/analytic (f+b) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    worst = None
    for op, t in sorted(totals.items(), key=lambda kv: -(kv[1]["mf"] + kv[1]["mb"])):
        m, a = t["mf"] + t["mb"], t["af"] + t["ab"]
        ratio = m / a if a > 0 else float("inf")
        share = m / all_measured if all_measured > 0 else 0
        print(f"| {op} | {t['tasks']} | {1e3 * t['af']:.3f} | {1e3 * t['mf']:.3f} | {1e3 * t['ab']:.3f} | "
              f"{1e3 * t['mb']:.3f} | {100 * share:.1f}% | {ratio:.2f} |")
        if share >= 0.01 and a > 0 and (worst is None or abs(ratio - 1) > abs(worst - 1)):
            worst = ratio
    total_ratio = all_measured / all_analytic if all_analytic > 0 else float("inf")
    print(f"| **all batch tasks** | {sum(t['tasks'] for t in totals.values())} | | | | | 100% | {total_ratio:.2f} |")
    print(f"WORST_OP_RATIO={worst:.2f}" if worst is not None else "WORST_OP_RATIO=none")


if __name__ == "__main__":
    main()

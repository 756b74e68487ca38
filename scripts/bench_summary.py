#!/usr/bin/env python3
"""Summary table of a side-by-side benchmark run (scripts/bench-vs-etcd.sh, scripts/bench-queue.sh).

Usage: bench_summary.py RESULTS OTHER_KIND OTHER_LABEL UNIT

RESULTS has one tab-separated row per run: round, workload, kind (picket or OTHER_KIND), the
load generator's output line (key=value pairs: ops/s, p50, p99, errors, server_cpu_us_per_op,
host_busy_pct) and the servers' peak summed RSS in KiB (may be empty or 0). Per workload it
prints the median over the rounds with the rounds' spread (min-max), the Picket/other ratio of
the medians, and `max/min`, the largest round over the smallest: issue 20 asks that a row whose
rounds differ by more than 2x be explained (a stall, an election), not averaged away, so such a
row is marked with `!`.
"""
import re
import statistics
import sys

results, other, label, unit = sys.argv[1:5]
runs = {}
for row in open(results):
    rnd, name, kind, line, rss = (row.rstrip("\n").split("\t") + [""])[:5]
    m = {k: v for k, v in re.findall(r"([\w/]+)=([\d.]+)", line)}
    if "ops/s" not in m:
        continue
    r = runs.setdefault(name, {}).setdefault(
        kind, {"ops": [], "p50": [], "p99": [], "rss": [], "cpu": [], "busy": [], "errors": 0})
    r["errors"] += int(float(m.get("errors", 0)))
    r["ops"].append(float(m["ops/s"]))
    r["p50"].append(float(m["p50"]))
    r["p99"].append(float(m["p99"]))
    if rss and int(rss) > 0:
        r["rss"].append(int(rss) / 1024)
    if "server_cpu_us_per_op" in m:
        r["cpu"].append(float(m["server_cpu_us_per_op"]))
    if "host_busy_pct" in m:
        r["busy"].append(float(m["host_busy_pct"]))


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def spread(xs):
    return f"{med(xs):,.0f} ({min(xs):,.0f}-{max(xs):,.0f})"


def ratio(xs):
    r = max(xs) / min(xs) if min(xs) > 0 else float("inf")
    return f"{r:.2f}{' !' if r > 2 else ''}"


print(f"| workload | rounds | Picket {unit}/s (min-max) | {label} {unit}/s (min-max) | ratio | "
      f"Picket p50 / p99 ms | {label} p50 / p99 ms | p99 ratio | "
      f"server CPU us/op Picket / {label} | machine busy % Picket / {label} | "
      f"RSS MiB Picket / {label} | max/min round Picket / {label} | errors Picket / {label} |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for name, kinds in runs.items():
    p, o = kinds.get("picket"), kinds.get(other)
    if not p or not o:
        continue

    def pair(k):
        return f"{med(p[k]):.0f} / {med(o[k]):.0f}" if p[k] and o[k] else ""

    print(f"| {name} | {len(p['ops'])} | {spread(p['ops'])} | {spread(o['ops'])} | "
          f"{med(p['ops']) / med(o['ops']):.2f} | {med(p['p50']):.2f} / {med(p['p99']):.2f} | "
          f"{med(o['p50']):.2f} / {med(o['p99']):.2f} | {med(p['p99']) / med(o['p99']):.2f} | "
          f"{pair('cpu')} | {pair('busy')} | {pair('rss')} | "
          f"{ratio(p['ops'])} / {ratio(o['ops'])} | {p['errors']} / {o['errors']} |")

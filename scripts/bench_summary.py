#!/usr/bin/env python3
"""Summary table of a side-by-side benchmark run (scripts/bench-vs-etcd.sh, scripts/bench-queue.sh).

Usage: bench_summary.py RESULTS OTHER_KIND OTHER_LABEL UNIT [MAIN_KIND MAIN_LABEL]

MAIN_KIND defaults to picket (labelled Picket); an A/B run of two Picket builds passes the B
build's kind as MAIN_KIND and A's as OTHER_KIND, so its ratios read B/A.
RESULTS has one tab-separated row per run: round, workload, kind (MAIN_KIND or OTHER_KIND), the
load generator's output line (key=value pairs: ops/s, p50, p99, errors, server_cpu_us_per_op,
host_busy_pct) and the servers' peak summed RSS in KiB (may be empty or 0). Per workload it
prints the median over the rounds with the rounds' spread (min-max), the main/other ratio of
the medians, the median of the rounds' own main/other ratios (each round runs both sides back
to back, so a round's ratio compares two runs a few seconds apart), and `max/min`, the largest
round over the smallest: issue 20 asks that a row whose
rounds differ by more than 2x be explained (a stall, an election), not averaged away, so such a
row is marked with `!`.

Rows whose figure is a latency at a rate the bench sets (lease-hold's keep-alives, watch's
put-to-event; their lines have p50 but no ops/s) go to a second table: p50 and p99 medians,
the main/other ratio of the p50 medians and of each round's p50s (below 1: main is faster),
CPU per keep-alive where the bench measured it, and the events missed or leases lost.
"""
import re
import statistics
import sys

results, other, label, unit = sys.argv[1:5]
main, main_label = (sys.argv[5:7] + ["picket", "Picket"][len(sys.argv[5:7]):])[:2]
runs = {}
latency = {}
for row in open(results):
    rnd, name, kind, line, rss = (row.rstrip("\n").split("\t") + [""])[:5]
    m = {k: v for k, v in re.findall(r"([\w/]+)=([\d.]+)", line)}
    if "ops/s" not in m:
        if "p50" in m:
            r = latency.setdefault(name, {}).setdefault(
                kind, {"p50": [], "p99": [], "cpu": [], "lost": 0, "rounds": []})
            r["rounds"].append(rnd)
            r["p50"].append(float(m["p50"]))
            r["p99"].append(float(m["p99"]))
            if "server_cpu_ms_per_keepalive" in m:
                r["cpu"].append(1000 * float(m["server_cpu_ms_per_keepalive"]))
            for k in ("missed", "lost", "errors", "put_errors"):
                r["lost"] += int(float(m.get(k, 0)))
        continue
    r = runs.setdefault(name, {}).setdefault(
        kind, {"ops": [], "p50": [], "p99": [], "rss": [], "cpu": [], "busy": [], "errors": 0,
               "rounds": []})
    r["errors"] += int(float(m.get("errors", 0)))
    r["rounds"].append(rnd)
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


def spread(xs, fmt=",.0f"):
    return f"{med(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"


def ratio(xs):
    r = max(xs) / min(xs) if min(xs) > 0 else float("inf")
    return f"{r:.2f}{' !' if r > 2 else ''}"


def round_ratios(p, o, key):
    """The median and spread of main/other of `key` over the rounds that ran both."""
    mine, theirs = dict(zip(p["rounds"], p[key])), dict(zip(o["rounds"], o[key]))
    rs = [v / theirs[k] for k, v in mine.items() if theirs.get(k, 0) > 0]
    return spread(rs, ".2f") if rs else ""


def paired(table):
    """(name, main's figures, other's figures) for each row both sides ran."""
    for name, kinds in table.items():
        if kinds.get(main) and kinds.get(other):
            yield name, kinds[main], kinds[other]


def header(*cells):
    print("| " + " | ".join(cells) + " |")
    print("|" + "---|" * len(cells))


M = main_label
header("workload", "rounds", f"{M} {unit}/s (min-max)", f"{label} {unit}/s (min-max)", "ratio",
       "round ratios, median (min-max)", f"{M} p50 / p99 ms", f"{label} p50 / p99 ms",
       "p99 ratio", f"server CPU us/op {M} / {label}", f"machine busy % {M} / {label}",
       f"RSS MiB {M} / {label}", f"max/min round {M} / {label}", f"errors {M} / {label}")
for name, p, o in paired(runs):
    def pair(k):
        return f"{med(p[k]):.0f} / {med(o[k]):.0f}" if p[k] and o[k] else ""

    print(f"| {name} | {len(p['ops'])} | {spread(p['ops'])} | {spread(o['ops'])} | "
          f"{med(p['ops']) / med(o['ops']):.2f} | {round_ratios(p, o, 'ops')} | "
          f"{med(p['p50']):.2f} / {med(p['p99']):.2f} | "
          f"{med(o['p50']):.2f} / {med(o['p99']):.2f} | {med(p['p99']) / med(o['p99']):.2f} | "
          f"{pair('cpu')} | {pair('busy')} | {pair('rss')} | "
          f"{ratio(p['ops'])} / {ratio(o['ops'])} | {p['errors']} / {o['errors']} |")

if latency:
    print()
    header("latency row", "rounds", f"{M} p50 ms (min-max)", f"{label} p50 ms (min-max)",
           "p50 ratio", "round p50 ratios, median (min-max)", f"p99 ms {M} / {label}",
           f"server CPU us per keep-alive {M} / {label}", f"missed, lost or failed {M} / {label}")
for name, p, o in paired(latency):
    cpu = f"{med(p['cpu']):.0f} / {med(o['cpu']):.0f}" if p["cpu"] and o["cpu"] else ""
    print(f"| {name} | {len(p['p50'])} | {spread(p['p50'], '.2f')} | {spread(o['p50'], '.2f')} | "
          f"{med(p['p50']) / med(o['p50']):.2f} | {round_ratios(p, o, 'p50')} | "
          f"{med(p['p99']):.2f} / {med(o['p99']):.2f} | {cpu} | {p['lost']} / {o['lost']} |")

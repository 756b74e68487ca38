#!/usr/bin/env bash
# Per-member, per-thread CPU and context switches per operation of one bench workload against a
# fresh three-member cluster. Usage:
#   scripts/per-member-cpu.sh <picketd binary | etcd> <workload> <clients> <conns> <seconds>
# e.g. `scripts/per-member-cpu.sh target/release/picketd put 1 1 5` (run a release build first:
# `cargo build --workspace --release`; the bench is $CARGO_TARGET_DIR's, or BENCH_BIN). BENCH_ARGS
# adds picket-bench flags (e.g. the queue bench's `--prefill 16 --value-size 64`). Members run as
# the benches run them: a Picket member with one runtime worker (PICKET_RUNTIME_THREADS, 0 for
# tokio's default), etcd with its defaults. Reads /proc/<pid>/task/*/{stat,status} before and
# after the run; each thread name is listed with how many threads share it. The cluster uses
# ports 23010-23031 (BENCH_BASE_PORT moves them; below the kernel's ephemeral range), refused if
# taken, and a temp dir; both, and every process started here, are removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 5 ] || { sed -n 2,12p "$0" >&2; exit 2; }
bin=$1; wl=$2; clients=$3; conns=$4; secs=$5
read -ra extra <<<"${BENCH_ARGS:-}"
# cluster_start and, through it, bench-lib.sh's base_port, ports_free and wait_ready.
# shellcheck source=scripts/cluster-lib.sh
. scripts/cluster-lib.sh
base_port 23000
# shellcheck disable=SC2046 # word splitting wanted: member_ports prints port numbers
ports_free $(member_ports "$PB")
member_args=()
[ "$(basename "$bin")" = etcd ] || member_args=(--runtime-threads "${PICKET_RUNTIME_THREADS:-1}")
root=$(mktemp -d /tmp/picket-cpu.XXXXXX)
pids=()
trap cluster_cleanup EXIT INT TERM
cluster_start "$bin" "$PB" "${member_args[@]}"
snap() { # pid tid comm cpu_ticks context_switches, one line per thread of every member
  local p t
  for p in "${pids[@]}"; do
    for t in /proc/"$p"/task/*; do
      echo "$p $(basename "$t") $(tr ' ' _ <"$t/comm") $(awk '{print $14 + $15}' "$t/stat") \
        $(awk '/^voluntary_ctxt/ {v = $2} /^nonvoluntary_ctxt/ {n = $2} END {print v + n}' "$t/status")"
    done
  done
}
snap >"$root/before"
bench=${BENCH_BIN:-${CARGO_TARGET_DIR:-target}/release/picket-bench}
out=$("$bench" --endpoints "$eps" --workload "$wl" --clients "$clients" \
  --conns "$conns" --seconds "$secs" "${extra[@]}" | tail -1)
snap >"$root/after"
echo "$out"
echo "leader: member $(ETCDCTL_API=3 etcdctl --endpoints="$eps" endpoint status 2>/dev/null | awk -F', ' '$5 == "true" {print $1}')"
ops=$(echo "$out" | sed -n 's/.* ops=\([0-9]*\).*/\1/p')
python3 - "$root/before" "$root/after" "${ops:-0}" "$(getconf CLK_TCK)" "${pids[@]}" <<'PY'
import collections, sys
def load(f):
    return {(p, t): (n, int(c), int(s)) for p, t, n, c, s in (l.split() for l in open(f))}
before, after = load(sys.argv[1]), load(sys.argv[2])
ops, hz, pids = max(1, int(sys.argv[3])), int(sys.argv[4]), sys.argv[5:]
# (pid, thread name) -> [CPU ticks, context switches, threads]: threads that share a name (the
# runtime's workers under PICKET_RUNTIME_THREADS=0, say) are summed, and their number shown.
per = collections.defaultdict(lambda: [0, 0, 0])
for key, (name, cpu, cs) in after.items():
    c0, s0 = before.get(key, (name, 0, 0))[1:]
    row = per[(key[0], name)]
    row[0] += cpu - c0
    row[1] += cs - s0
    row[2] += 1
us = lambda ticks: ticks * 1e6 / hz / ops
for i, pid in enumerate(pids, 1):
    rows = sorted(((n, *v) for (p, n), v in per.items() if p == pid), key=lambda r: -r[1])
    print(f"n{i} (pid {pid}): {us(sum(r[1] for r in rows)):.0f} us CPU/op, "
          f"{sum(r[2] for r in rows) / ops:.1f} context switches/op")
    for n, c, s, k in rows:
        if c or s:
            print(f"    {n:24s} x{k:<3d} {us(c):7.0f} us/op {s / ops:6.2f} cs/op")
PY

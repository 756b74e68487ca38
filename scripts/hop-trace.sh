#!/usr/bin/env bash
# Where one write's time goes, hop by hop: a fresh three-member cluster, one client putting in a
# loop to the leader or to a follower, and `perf record` of every system call and scheduler
# wake-up of the members and the client for 1.5 s. scripts/hop_trace.py then rebuilds each put's
# chain (request read, log write, AppendEntries sent, the follower's append and fsync, its ack,
# the apply, the reply) from those events and prints the median time of each step. Usage:
#   scripts/hop-trace.sh <picketd binary> <leader|follower> <out prefix>
# e.g. `scripts/hop-trace.sh target/release/picketd follower /tmp/hop-f` (a release build of
# picketd and picket-bench first). Needs root and `perf` (Debian: linux-perf). Writes
# <out>.txt (perf script), <out>.fds, <out>.tcp, <out>.meta and <out>.bench, then runs the
# analysis. Tracing costs each system call ~1-2 us, so compare runs of this script with each
# other, not with the benchmark's figures. Ports 23110-23131, a temp dir, and every process
# started here are removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 3 ] || { sed -n 2,13p "$0" >&2; exit 2; }
bin=$1; target=$2; out=$3
bench=${BENCH_BIN:-${CARGO_TARGET_DIR:-target}/release/picket-bench}
[ "$target" = leader ] || [ "$target" = follower ] || { echo "target must be leader or follower" >&2; exit 2; }
command -v perf >/dev/null || { echo "hop-trace: perf is missing (apt-get install linux-perf)" >&2; exit 1; }
[ -x "$bench" ] || { echo "hop-trace: $bench is missing (cargo build --release --workspace)" >&2; exit 1; }
root=$(mktemp -d /tmp/picket-hop.XXXXXX)
pids=()
# shellcheck source=scripts/cluster-lib.sh
. scripts/cluster-lib.sh
trap cluster_cleanup EXIT INT TERM
base=23100
# One runtime thread per member, as the benchmarks run them.
cluster_start "$bin" "$base" --runtime-threads 1
leader=$(ETCDCTL_API=3 etcdctl --endpoints="$eps" endpoint status -w json | python3 -c '
import json, sys
for e in json.load(sys.stdin):
    if e["Status"]["header"]["member_id"] == e["Status"]["leader"]:
        print(e["Endpoint"])')
ep=$leader
[ "$target" = follower ] && ep=$(echo "$eps" | tr , '\n' | grep -v "^$leader\$" | head -1)
"$bench" --endpoints "$ep" --workload put --clients 1 --conns 1 --seconds 6 >"$out.bench" 2>&1 &
bench_pid=$!
pids+=("$bench_pid")
# Past the client's connection set-up and the first puts, well before its 6 s end.
sleep 2.5
perf record -q -e raw_syscalls:sys_enter,raw_syscalls:sys_exit,sched:sched_wakeup,sched:sched_switch \
  -p "$(IFS=,; echo "${pids[*]}")" -o "$out.data" -- sleep 1.5 >/dev/null 2>&1
: >"$out.fds"
for p in "${pids[@]}"; do
  for f in /proc/"$p"/fd/*; do echo "$p $(basename "$f") $(readlink "$f")"; done >>"$out.fds" 2>/dev/null || true
done
cat /proc/net/tcp >"$out.tcp"
wait "$bench_pid" || true
{
  echo "leader=$leader ep=$ep pids=${pids[*]:0:3} bench=$bench_pid base=$base"
} >"$out.meta"
perf script -i "$out.data" -F comm,pid,tid,time,event,trace --ns >"$out.txt" 2>/dev/null
rm -f "$out.data"
tail -1 "$out.bench"
python3 scripts/hop_trace.py "$out"

#!/usr/bin/env bash
# Starts a three-node Picket cluster and a three-node etcd 3.4 cluster (Debian's etcd-server,
# default durability: fsync on commit) on this machine, runs each workload against each in
# alternation, and prints one line per run. Usage: scripts/bench-vs-etcd.sh [seconds] [rounds]
# Set BENCH_ONLY to a space-separated list of workload names (e.g. "get lease-hold watch") to run
# only those.
# Both clusters live under a temp dir that is removed at the end; every process started here is
# killed by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-10}"
rounds="${2:-1}"
# setup-deps.sh only when something is missing: it also stops a system etcd, which must not
# happen to a machine that already has everything.
command -v etcd >/dev/null && command -v etcdctl >/dev/null || scripts/setup-deps.sh
# The same command CI uses, so feature unification (and the RocksDB build) is shared with it.
cargo build --workspace --release
bin="${CARGO_TARGET_DIR:-target}/release"
# PICKETD_BIN runs another picketd build (e.g. a copy of an older commit's) for before/after.
picketd="${PICKETD_BIN:-$bin/picketd}"
root=$(mktemp -d /tmp/picket-bench.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$root"
}
trap cleanup EXIT INT TERM

start_cluster() { # kind base_port
  local kind=$1 base=$2 cluster="" i
  for i in 1 2 3; do cluster+="${cluster:+,}n$i=http://127.0.0.1:$((base + 10 * i + 1))"; done
  for i in 1 2 3; do
    local c=$((base + 10 * i)) p=$((base + 10 * i + 1))
    local args=(--name "n$i" --data-dir "$root/$kind/n$i"
      --listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c"
      --listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p"
      --initial-cluster "$cluster" --initial-cluster-state new)
    if [ "$kind" = picket ]; then
      "$picketd" "${args[@]}" 2>"$root/$kind-n$i.log" &
    else
      etcd "${args[@]}" 2>"$root/$kind-n$i.log" &
    fi
    pids+=($!)
  done
}
start_cluster picket 41000
picket_pids=("${pids[@]}")
start_cluster etcd 42000
etcd_pids=("${pids[@]:3}")
eps() { echo "http://127.0.0.1:$(($1 + 10)),http://127.0.0.1:$(($1 + 20)),http://127.0.0.1:$(($1 + 30))"; }
# Wait (bounded: 60 x 0.5 s) until both clusters commit a write.
for base in 41000 42000; do
  for _ in $(seq 60); do
    ETCDCTL_API=3 etcdctl --endpoints="$(eps $base)" put ready 1 >/dev/null 2>&1 && break
    sleep 0.5
  done
done
# True when the workload is selected (BENCH_ONLY unset or naming it).
want() { [ -z "${BENCH_ONLY:-}" ] || [[ " $BENCH_ONLY " == *" $1 "* ]]; }
run() { # workload clients conns
  want "$1" || return 0
  for kind in picket etcd; do
    local base=41000
    [ "$kind" = etcd ] && base=42000
    printf '%-7s ' "$kind"
    "$bin/picket-bench" --endpoints "$(eps $base)" --workload "$1" --clients "$2" --conns "$3" --seconds "$secs" \
      || echo "failed (exit $?)"
  done
}
for r in $(seq "$rounds"); do
  echo "# round $r"
  run put 1 1
  run put 64 8
  run get 64 8
  run get-serializable 64 8
  run lock-contended 8 8
  run lock-uncontended 32 8
  run lease-cycle 16 4
  # lease-hold: the bench samples the servers' CPU (from /proc) over its measured window only,
  # not over granting and revoking the 2,000 leases.
  want lease-hold && for kind in picket etcd; do
    base=41000; p=("${picket_pids[@]}")
    [ "$kind" = etcd ] && { base=42000; p=("${etcd_pids[@]}"); }
    printf '%-7s ' "$kind"
    "$bin/picket-bench" --endpoints "$(eps $base)" --workload lease-hold --leases 2000 \
      --keepalive-interval 3 --conns 4 --seconds "$secs" --cpu-pids "$(IFS=,; echo "${p[*]}")" \
      || echo "failed (exit $?)"
  done
  # watch: put-to-event latency, one writer at 50 puts/s, N watch streams over 8 connections.
  for w in 1 16 100 1000; do
    want watch || break
    for kind in picket etcd; do
      base=41000
      [ "$kind" = etcd ] && base=42000
      printf '%-7s ' "$kind"
      "$bin/picket-bench" --endpoints "$(eps $base)" --workload watch --watchers "$w" \
        --put-rate 50 --conns 8 --seconds "$secs" || echo "failed (exit $?)"
    done
  done
done

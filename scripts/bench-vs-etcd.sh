#!/usr/bin/env bash
# Starts a three-node Picket cluster and a three-node etcd 3.4 cluster (Debian's etcd-server,
# default durability: fsync on commit) on this machine, runs each workload against each in
# alternation, and prints one line per run. Usage: scripts/bench-vs-etcd.sh [seconds] [rounds]
# Both clusters live under a temp dir that is removed at the end; every process started here is
# killed by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-10}"
rounds="${2:-1}"
scripts/setup-deps.sh
cargo build --release --workspace --bins
bin="${CARGO_TARGET_DIR:-target}/release"
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
      "$bin/picketd" "${args[@]}" 2>"$root/$kind-n$i.log" &
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
# CPU seconds (user + system) used so far by the given PIDs, from /proc/<pid>/stat.
cpu_secs() {
  local total=0 p t
  for p in "$@"; do
    t=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)
    total=$((total + t))
  done
  awk -v t="$total" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", t / hz }'
}
eps() { echo "http://127.0.0.1:$(($1 + 10)),http://127.0.0.1:$(($1 + 20)),http://127.0.0.1:$(($1 + 30))"; }
# Wait (bounded: 60 x 0.5 s) until both clusters commit a write.
for base in 41000 42000; do
  for _ in $(seq 60); do
    ETCDCTL_API=3 etcdctl --endpoints="$(eps $base)" put ready 1 >/dev/null 2>&1 && break
    sleep 0.5
  done
done
run() { # workload clients conns
  for kind in picket etcd; do
    local base=41000
    [ "$kind" = etcd ] && base=42000
    printf '%-7s ' "$kind"
    "$bin/picket-bench" --endpoints "$(eps $base)" --workload "$1" --clients "$2" --conns "$3" --seconds "$secs"
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
  for kind in picket etcd; do
    base=41000; p=("${picket_pids[@]}")
    [ "$kind" = etcd ] && { base=42000; p=("${etcd_pids[@]}"); }
    before=$(cpu_secs "${p[@]}")
    printf '%-7s ' "$kind"
    "$bin/picket-bench" --endpoints "$(eps $base)" --workload lease-hold --leases 2000 \
      --keepalive-interval 3 --conns 4 --seconds "$secs" | tr -d '\n'
    after=$(cpu_secs "${p[@]}")
    echo " server_cpu_s=$(awk -v a="$after" -v b="$before" 'BEGIN { printf "%.2f", a - b }')"
  done
done

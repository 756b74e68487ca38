# A throwaway three-member Picket cluster on loopback for the diagnostic scripts (sourced by
# scripts/per-member-cpu.sh and scripts/hop-trace.sh, from the project root). The caller sets
# `root` (a temp dir) and an empty array `pids`, and traps cluster_cleanup on exit.
# shellcheck shell=bash disable=SC2034

# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh

# Kills every process this script started (by PID: members and loads) and removes the temp dir.
cluster_cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  { wait; } 2>/dev/null || true
  rm -rf "$root"
}

# cluster_start <picketd> <base port> [picketd args...]: members n1..n3 with client ports
# base+10, base+20, base+30 (peer ports one above), data and logs under $root; their PIDs are
# appended to `pids` and their client URLs set in `eps`. Returns once a write committed and each
# member reports healthy (bench-lib.sh's wait_ready, bounded), or fails naming the member.
cluster_start() {
  local bin=$1 base=$2 cluster="" i c p
  shift 2
  for i in 1 2 3; do cluster+="${cluster:+,}n$i=http://127.0.0.1:$((base + 10 * i + 1))"; done
  for i in 1 2 3; do
    c=$((base + 10 * i)); p=$((c + 1))
    "$bin" --name "n$i" --data-dir "$root/n$i" --listen-client-urls "http://127.0.0.1:$c" \
      --advertise-client-urls "http://127.0.0.1:$c" --listen-peer-urls "http://127.0.0.1:$p" \
      --initial-advertise-peer-urls "http://127.0.0.1:$p" --initial-cluster "$cluster" \
      --initial-cluster-state new "$@" 2>"$root/n$i.log" &
    pids+=($!)
  done
  eps="http://127.0.0.1:$((base + 10)),http://127.0.0.1:$((base + 20)),http://127.0.0.1:$((base + 30))"
  wait_ready "$eps" "$root"/n*.log
}

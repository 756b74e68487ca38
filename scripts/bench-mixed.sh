#!/usr/bin/env bash
# The mixed-load run of docs/benchmarks.md ("The HTTP/JSON gateway", issue 20's finding): one
# three-member Picket cluster (release build, already built: `cargo build --workspace
# --release`) takes put, json-put and json-get at 64 clients, 8 s each, three rounds, and prints
# each run with the members' summed RSS, then every `built snapshot` line of the members' logs
# and the data dir's size. EXTRA_ARGS adds picketd flags (e.g. "--snapshot-count 100000" for the
# A/B without snapshots). Everything lives in a temp dir removed at the end; the members are
# killed by PID on exit. PICKETD_BIN runs another picketd build (e.g. a copy of an older
# commit's) for before/after. Usage: EXTRA_ARGS=... [PICKETD_BIN=...] scripts/bench-mixed.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${CARGO_TARGET_DIR:-target}/release"
picketd="${PICKETD_BIN:-$bin/picketd}"
root=$(mktemp -d /tmp/picket-mixed.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$root"
}
trap cleanup EXIT
base=23000
cluster=""
for i in 1 2 3; do cluster+="${cluster:+,}n$i=http://127.0.0.1:$((base + 10 * i + 1))"; done
for i in 1 2 3; do
  c=$((base + 10 * i)); p=$((base + 10 * i + 1))
  "$picketd" --name n$i --data-dir "$root/n$i" --listen-client-urls http://127.0.0.1:$c \
    --advertise-client-urls http://127.0.0.1:$c --listen-peer-urls http://127.0.0.1:$p \
    --initial-advertise-peer-urls http://127.0.0.1:$p --initial-cluster "$cluster" \
    --initial-cluster-state new ${EXTRA_ARGS:-} 2>"$root/n$i.log" &
  pids+=($!)
done
eps="http://127.0.0.1:$((base+10)),http://127.0.0.1:$((base+20)),http://127.0.0.1:$((base+30))"
# Bounded: 60 x 0.5 s until the cluster commits a write.
for _ in $(seq 60); do ETCDCTL_API=3 etcdctl --endpoints="$eps" put ready 1 >/dev/null 2>&1 && break; sleep 0.5; done
cpus=$(IFS=,; echo "${pids[*]}")
rss() { local t=0; for p in "${pids[@]}"; do t=$((t + $(awk '/^VmRSS:/ {print $2}' /proc/$p/status))); done; echo "rss_mib=$((t / 1024))"; }
for r in 1 2 3; do
  for w in put json-put json-get; do
    printf '%s %s ' "$(date +%T)" "$w"
    "$bin/picket-bench" --endpoints "$eps" --workload $w --clients 64 --conns 8 --seconds 8 --cpu-pids "$cpus" | tr '\n' ' '
    rss
  done
done
grep -h "built snapshot" "$root"/n*.log | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-200 || echo "no snapshot built"
du -sh "$root"/n1

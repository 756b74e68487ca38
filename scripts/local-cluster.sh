#!/usr/bin/env bash
# Starts a local three-node Picket cluster on 127.0.0.1 as three real picketd processes, with
# data under ${PICKET_DATA:-./picket-data}. A second run reuses the data (the members recover
# from disk). Ctrl-C stops all three.
#
# Ports follow etcd's local Procfile: clients 2379/22379/32379, peers 2380/22380/32380.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
cargo build --bin picketd
bin="${CARGO_TARGET_DIR:-target}/debug/picketd"
data="${PICKET_DATA:-picket-data}"
mkdir -p "$data"
cluster="n1=http://127.0.0.1:2380,n2=http://127.0.0.1:22380,n3=http://127.0.0.1:32380"
pids=()
stop() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "stopped"
}
trap stop INT TERM EXIT
i=0
for port in 2379 22379 32379; do
  i=$((i + 1))
  peer=$((port + 1))
  "$bin" --name "n$i" --data-dir "$data/n$i" \
    --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "$cluster" --initial-cluster-state new \
    2>"$data/n$i.log" &
  pids+=($!)
done
endpoints="127.0.0.1:2379,127.0.0.1:22379,127.0.0.1:32379"
cat <<TXT
picket: three members running (pids ${pids[*]}), data in $data/, logs in $data/n*.log
endpoints: $endpoints
try:       ETCDCTL_API=3 etcdctl --endpoints=$endpoints put greeting hello
           ETCDCTL_API=3 etcdctl --endpoints=$endpoints get greeting -w json
Ctrl-C stops the cluster.
TXT
wait -n "${pids[@]}" || true
echo "a member exited; see $data/n*.log" >&2

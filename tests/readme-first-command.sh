#!/usr/bin/env bash
# The README's first command, run as a newcomer runs it (on a fresh machine through
# ../shared/tools/fresh-machine tests/readme-first-command.sh): `scripts/local-cluster.sh`
# installs what is missing, builds, and starts three members; then a key is written through each
# member with etcdctl and read back through every member; then Ctrl-C (SIGINT) must stop all
# three cleanly (exit 0, "stopped", no member left running).
#
# The cluster uses the README's ports (clients 2379/22379/32379), so nothing else may listen
# there; the script checks first and fails naming the port rather than touching anything.
set -euo pipefail
cd "$(dirname "$0")/.."
ports=(2379 22379 32379)
for p in "${ports[@]}" 2380 22380 32380; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "readme-first-command: something already listens on 127.0.0.1:$p (the README's ports)" >&2
    exit 1
  fi
done
work=$(mktemp -d /tmp/picket-readme.XXXXXX)
log=$work/local-cluster.log
start=$(date +%s)
# setsid: its own process group, so Ctrl-C can be delivered as a terminal would, to the group.
setsid scripts/local-cluster.sh --data-dir "$work/picket-data" > "$log" 2>&1 &
pid=$!
cleanup() {
  # Only what this script started: the local-cluster process group, by its PID.
  kill -KILL -- "-$pid" 2>/dev/null || true
}
trap cleanup EXIT

# Bounded: the first run builds RocksDB from source (25-40 minutes on 2 cores in a fresh root),
# then the members elect within seconds. 60 minutes means the build or the start is broken.
deadline=$((start + 3600))
until grep -q '^endpoints: ' "$log"; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "readme-first-command: scripts/local-cluster.sh exited before serving:" >&2
    tail -40 "$log" >&2
    exit 1
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "readme-first-command: not serving after 60 minutes" >&2
    tail -40 "$log" >&2
    exit 1
  fi
  sleep 2
done
ready=$(date +%s)
echo "readme-first-command: serving after $((ready - start)) s (install, build and start)"

etcdctl=$(command -v etcdctl) || { echo "readme-first-command: etcdctl missing after setup" >&2; exit 1; }
for i in 0 1 2; do
  ep=127.0.0.1:${ports[$i]}
  out=$(ETCDCTL_API=3 "$etcdctl" --endpoints="$ep" put "readme/n$((i + 1))" "via-$ep")
  [ "$out" = OK ] || { echo "put through $ep answered: $out" >&2; exit 1; }
done
for i in 0 1 2; do
  ep=127.0.0.1:${ports[$i]}
  for j in 1 2 3; do
    got=$(ETCDCTL_API=3 "$etcdctl" --endpoints="$ep" get "readme/n$j" --print-value-only)
    want="via-127.0.0.1:${ports[$((j - 1))]}"
    [ "$got" = "$want" ] || { echo "get readme/n$j through $ep: '$got', want '$want'" >&2; exit 1; }
  done
done
echo "readme-first-command: wrote through each member and read every key through every member"

# Ctrl-C: SIGINT to the foreground process group, as a terminal sends it.
kill -INT -- "-$pid"
# Bounded: each member gets 10 s (--stop-timeout) after SIGTERM; 60 s covers all three.
for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then
  echo "readme-first-command: still running 60 s after Ctrl-C" >&2
  exit 1
fi
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 0 ] || { echo "local-cluster exited $rc after Ctrl-C:" >&2; tail -20 "$log" >&2; exit 1; }
grep -q 'stopped' "$log" || { echo "no 'stopped' line:" >&2; tail -20 "$log" >&2; exit 1; }
for p in "${ports[@]}"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "readme-first-command: a member still listens on $p after Ctrl-C" >&2
    exit 1
  fi
done
trap - EXIT
rm -rf "$work"
echo "readme-first-command: passed in $(($(date +%s) - start)) s (serving after $((ready - start)) s)"

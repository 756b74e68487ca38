#!/usr/bin/env bash
# The queue against the queue people use (issue 20): enqueue -> claim -> ack cycles per second,
# 1 and 16 workers, against a three-member Picket cluster (picket.v1.Queue, `picket-bench
# --workload queue-overlap`: a worker's enqueue and its ack-and-claim in flight together, as a
# RabbitMQ worker's unanswered ack overlaps its next publish; QUEUE_WORKLOAD=queue-cycle runs
# the two calls one after the other, as before 2026-12-03) and a three-node RabbitMQ cluster
# (Debian's rabbitmq-server 3.10; a durable quorum queue with publisher confirms, persistent
# messages, prefetch 1 and manual acks: `--workload amqp-cycle`), both on loopback.
# Usage: scripts/bench-queue.sh [seconds] [rounds]
#
# Every round runs 1 and 16 workers, each row against both back to back: Picket first in odd
# rounds, RabbitMQ first in even ones (so neither always runs right after the other's load).
# Each row runs on a fresh queue (Picket: a fresh three-member cluster per row; RabbitMQ: one
# cluster, a new quorum queue per row, which amqp-cycle deletes at the end) that starts with
# one job (message) per worker, enqueued before the window (QUEUE_PREFILL=N sets another number;
# 0 starts empty, as before 2026-12-03): a worker then always finds a job, whichever of its two
# overlapped calls reaches the leader first. Each worker has its own connection, spread over the
# three members/nodes round-robin. At the end a summary table gives, per row, the median over
# the rounds of cycles/s with the spread (min-max), the Picket/RabbitMQ ratio of the medians and
# the median of each round's own ratio, p50 and p99, the servers' CPU per cycle (user + system
# time of the three picketd processes or the three beam.smp processes over the measured window,
# from /proc), the machine's busy share over the window (from /proc/stat, steal included) and the
# servers' summed resident memory (peak of samples every 0.5 s, median over rounds).
#
# Binaries: the script builds the workspace in release and then a profile-guided picketd
# (scripts/build-pgo.sh, under ${CARGO_TARGET_DIR:-target}/pgo) and runs that; BENCH_PGO=0
# runs the plain ${CARGO_TARGET_DIR:-target}/release/picketd instead, PICKETD_BIN another build.
# picket-bench comes from the release dir (BENCH_BIN overrides it). BENCH_NO_BUILD=1 builds
# nothing and runs the plain picketd already built unless PICKETD_BIN names another.
# RABBITMQ_BIN_DIR (default /usr/lib/rabbitmq/bin) holds the unwrapped rabbitmq-server and
# rabbitmqctl: Debian's /usr/sbin wrappers switch to the rabbitmq user and its /var/lib dirs.
# RABBIT_ERL_ARGS adds Erlang VM flags to the three nodes (RabbitMQ's defaults already turn off
# the schedulers' busy waiting: +sbwt none +sbwtdcpu none +sbwtdio none).
#
# The RabbitMQ nodes run as the current user with everything under the run's temp dir: their
# mnesia and log dirs, an Erlang cookie (HOME points there), an empty enabled-plugins file (no
# management plugin), and an epmd started here on its own port (ERL_EPMD_PORT), so nothing of a
# system RabbitMQ on 5672/4369 is used or touched. All ports are below 32768. Every process
# started here is killed by PID on exit; the temp dir is removed.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-10}"
rounds="${2:-1}"
queue_workload="${QUEUE_WORKLOAD:-queue-overlap}"
prefill="${QUEUE_PREFILL:-}"
case "$queue_workload" in
  queue-overlap | queue-cycle) ;;
  *) echo "QUEUE_WORKLOAD must be queue-overlap or queue-cycle, not '$queue_workload'" >&2; exit 2 ;;
esac
# bench_prelude (setup, build, bin, picketd, bench, root, pids, results) and sample_rss.
. scripts/bench-lib.sh
bench_prelude picket-bench-queue
rmq_bin="${RABBITMQ_BIN_DIR:-/usr/lib/rabbitmq/bin}"
# Kills process $1 after its descendants, found by parent PID (never by name): a rabbitmq-server
# shell is its beam.smp's parent, and beam.smp is erl_child_setup's. Killing the shell alone
# would leave beam.smp running, adopted by init.
kill_tree() { # pid
  local c
  for c in $(pgrep -P "$1" 2>/dev/null || true); do kill_tree "$c"; done
  kill -9 "$1" 2>/dev/null || true
}
cleanup() {
  # Quiet: bash would report every killed background job.
  exec 2>/dev/null
  for p in "${pids[@]}"; do kill_tree "$p"; done
  wait 2>/dev/null || true
  rm -rf "$root"
}
trap cleanup EXIT INT TERM

# Ports below the kernel's ephemeral range (32768-60999), away from bench-vs-etcd.sh's (21000,
# 22000) and bench-mixed.sh's (23000), so the scripts can run side by side. BENCH_BASE_PORT
# moves both (RabbitMQ stays 1000 above Picket), e.g. for a test that must stay out of the
# test port range (24000-32000).
base_port 25000
RB=$((PB + 1000))
epmd_port=$((RB + 2))

# --- Picket: three members, as bench-vs-etcd.sh starts them, fresh for every row (issue 20:
# "every row in 3 rounds with fresh clusters"). One cluster kept for all rounds measured its
# own growing history: every cycle leaves its job's deleted keys until a compaction, the store
# grows (RocksDB flushes memtables; at 10,000 entries each member copies it into a snapshot),
# and later rounds ran slower (x16: 1,736, 1,413, 1,375 cycles/s on 2026-12-03). A RabbitMQ
# round gets a fresh quorum queue (its own Raft log), declared by the bench and deleted after.
picket_eps="http://127.0.0.1:$((PB + 10)),http://127.0.0.1:$((PB + 20)),http://127.0.0.1:$((PB + 30))"
picket_pids=()
picket_n=0
start_picket() {
  local cluster="" i c p
  picket_n=$((picket_n + 1))
  picket_pids=()
  # shellcheck disable=SC2046 # word splitting wanted: member_ports prints port numbers
  ports_free $(member_ports $PB)
  for i in 1 2 3; do cluster+="${cluster:+,}n$i=http://127.0.0.1:$((PB + 10 * i + 1))"; done
  for i in 1 2 3; do
    c=$((PB + 10 * i)); p=$((PB + 10 * i + 1))
    "$picketd" --name "n$i" --data-dir "$root/picket$picket_n/n$i" \
      --listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
      --listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
      --initial-cluster "$cluster" --initial-cluster-state new "${picket_flags[@]}" \
      2>"$root/picket$picket_n-n$i.log" &
    pids+=($!)
    picket_pids+=($!)
  done
  # Readiness, as bench-vs-etcd.sh (bench-lib.sh's wait_ready).
  wait_ready "$picket_eps" "$root/picket$picket_n"-n*.log || exit 1
}
# Kills the members (bench-lib.sh's kill_members: bounded, quiet, forgotten) and removes their
# data.
stop_picket() {
  kill_members "${picket_pids[@]}"
  picket_pids=()
  rm -rf "${root:?}/picket$picket_n"
}

# --- RabbitMQ: three nodes as the current user, everything under $root.
rhome="$root/rabbit-home"
mkdir -p "$rhome"
# The cluster's shared secret; the CLI reads it from $HOME too. Any random string will do.
od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$rhome/.erlang.cookie"
chmod 400 "$rhome/.erlang.cookie"
echo "[]." >"$root/enabled_plugins"
: >"$root/rabbitmq.conf"
: >"$root/rabbitmq-env.conf"
# The environment every rabbitmq-server and rabbitmqctl here runs with: our HOME (cookie), our
# epmd, our config files (not /etc/rabbitmq's), the CLI's own distribution ports below 32768
# (its default range starts at 35672), and crash dumps in the temp dir rather than the working
# directory (a VM that dies at boot writes one).
rmq_env=(HOME="$rhome" ERL_EPMD_PORT="$epmd_port" ERL_EPMD_ADDRESS=127.0.0.1
  ERL_CRASH_DUMP="$root/erl_crash.dump"
  RABBITMQ_CONF_ENV_FILE="$root/rabbitmq-env.conf" RABBITMQ_CONFIG_FILE="$root/rabbitmq.conf"
  RABBITMQ_ENABLED_PLUGINS_FILE="$root/enabled_plugins"
  RABBITMQ_CTL_DIST_PORT_MIN=$((RB + 50)) RABBITMQ_CTL_DIST_PORT_MAX=$((RB + 60)))
node() { echo "rabbit$1@localhost"; }
# rabbitmqctl against node $1, bounded: each call starts an Erlang VM, which takes a few seconds
# on a busy two-core machine.
ctl() { # i args...
  local i=$1
  shift
  timeout 120 env "${rmq_env[@]}" "$rmq_bin/rabbitmqctl" -n "$(node "$i")" "$@"
}
rabbit_log() { # i
  echo "--- $(node "$1"): its log tail:" >&2
  tail -n 20 "$root/rabbit$1/log/$(node "$1").log" "$root/rabbit$1/stdout.log" >&2 2>/dev/null || true
}
# shellcheck disable=SC2046 # word splitting wanted: member_ports prints port numbers
ports_free "$epmd_port" $(member_ports $RB)
env "${rmq_env[@]}" epmd -port "$epmd_port" -address 127.0.0.1 >"$root/epmd.log" 2>&1 &
pids+=($!)
# Bounded: 20 x 0.25 s until our epmd answers.
for _ in $(seq 20); do epmd -port "$epmd_port" -names >/dev/null 2>&1 && break; sleep 0.25; done
epmd -port "$epmd_port" -names >/dev/null 2>&1 || { echo "epmd on $epmd_port did not start:" >&2; cat "$root/epmd.log" >&2; exit 1; }
rabbit_shells=()
for i in 1 2 3; do
  d="$root/rabbit$i"
  mkdir -p "$d"
  env "${rmq_env[@]}" RABBITMQ_NODENAME="$(node "$i")" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT=$((RB + 10 * i)) RABBITMQ_DIST_PORT=$((RB + 10 * i + 1)) \
    RABBITMQ_MNESIA_BASE="$d/mnesia" RABBITMQ_LOG_BASE="$d/log" RABBITMQ_PID_FILE="$d/pid" \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1} ${RABBIT_ERL_ARGS:-}" \
    "$rmq_bin/rabbitmq-server" >"$d/stdout.log" 2>&1 &
  # The rabbitmq-server shell, which stays as beam.smp's parent; beam.smp's PID is read below.
  pids+=($!)
  rabbit_shells+=($!)
done
rabbit_pids=()
for i in 1 2 3; do
  # Bounded: 60 tries, each a CLI call of a second or two, until the node has booted.
  # await_startup fails at once while the node is not yet reachable, so it is retried.
  ok=""
  for _ in $(seq 60); do
    kill -0 "${rabbit_shells[$((i - 1))]}" 2>/dev/null || break
    ctl "$i" -q await_startup --timeout 30 >/dev/null 2>&1 && { ok=1; break; }
    sleep 1
  done
  [ -n "$ok" ] || { echo "RabbitMQ node $(node "$i") did not start" >&2; rabbit_log "$i"; exit 1; }
  bp=$(cat "$root/rabbit$i/pid" 2>/dev/null || true)
  [ -n "$bp" ] && [ -d "/proc/$bp" ] \
    || { echo "no beam.smp PID for $(node "$i") in $root/rabbit$i/pid" >&2; rabbit_log "$i"; exit 1; }
  pids+=("$bp")
  rabbit_pids+=("$bp")
done
for i in 2 3; do
  { ctl "$i" -q stop_app && ctl "$i" -q join_cluster "$(node 1)" && ctl "$i" -q start_app; } >/dev/null 2>&1 \
    || { echo "RabbitMQ node $(node "$i") did not join $(node 1)" >&2; rabbit_log "$i"; rabbit_log 1; exit 1; }
done
# Bounded: 30 x 1 s until node 1 sees three running nodes (a quorum queue declared earlier
# would get fewer replicas).
ok=""
for _ in $(seq 30); do
  running=$(ctl 1 -q eval 'length(rabbit_nodes:all_running()).' 2>/dev/null || echo 0)
  [ "$running" = 3 ] && { ok=1; break; }
  sleep 1
done
[ -n "$ok" ] || { echo "the RabbitMQ cluster has ${running:-0} running nodes, not 3" >&2; rabbit_log 1; exit 1; }
amqp_uris="amqp://guest:guest@127.0.0.1:$((RB + 10))/%2f,amqp://guest:guest@127.0.0.1:$((RB + 20))/%2f,amqp://guest:guest@127.0.0.1:$((RB + 30))/%2f"

run() { # kind workers
  local kind=$1 n=$2 line rss_pid rss p args
  if [ "$kind" = picket ]; then
    start_picket
    p=("${picket_pids[@]}")
    args=(--workload "$queue_workload" --endpoints "$picket_eps")
  else
    p=("${rabbit_pids[@]}")
    args=(--workload amqp-cycle --amqp-uri "$amqp_uris")
  fi
  printf '%-8s ' "$kind"
  rm -f "$root/rss"
  sample_rss "$root/rss" "${p[@]}" &
  rss_pid=$!
  pids+=("$rss_pid")
  line=$("$bench" "${args[@]}" --queue "bench-r$r-w$n" --clients "$n" --conns "$n" \
    --value-size 64 --prefill "${prefill:-$n}" --seconds "$secs" --cpu-pids "$(IFS=,; echo "${p[*]}")" 2>"$root/bench.err") \
    || line="failed (exit $?): $(tail -1 "$root/bench.err")"
  kill "$rss_pid" 2>/dev/null || true
  wait "$rss_pid" 2>/dev/null || true
  forget "$rss_pid"
  rss=$(cat "$root/rss" 2>/dev/null || echo 0)
  if [ "$kind" = picket ]; then stop_picket; fi
  echo "$line rss_kib=$rss"
  printf '%s\t%s\t%s\t%s\t%s\n' "$r" "cycle-$n" "$kind" "$line" "$rss" >>"$results"
}
echo "# picketd: $picketd ($(stat -c %y "$picketd" | cut -d. -f1)) ${picket_flags[*]}; workload $queue_workload, prefill ${prefill:-one per worker}; RabbitMQ: $(ctl 1 -q eval 'rabbit_misc:version().' 2>/dev/null | tr -d '"'), Erlang $(ctl 1 -q eval 'erlang:system_info(otp_release).' 2>/dev/null | tr -d '"')"
for r in $(seq "$rounds"); do
  echo "# round $r (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
  for n in 1 16; do
    for kind in $(in_turn "$r" picket rabbitmq); do run "$kind" "$n"; done
  done
done
echo "# load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
# Medians over the rounds with their spread, and Picket/RabbitMQ ratios of the medians.
[ -s "$results" ] && python3 scripts/bench_summary.py "$results" rabbitmq RabbitMQ cycles

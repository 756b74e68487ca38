#!/usr/bin/env bash
# Starts a three-node Picket cluster and a three-node etcd 3.4 cluster (Debian's etcd-server,
# default durability: fsync on commit) on this machine, runs each workload against each back to
# back, and prints one line per run. Usage: scripts/bench-vs-etcd.sh [seconds] [rounds]
# Set BENCH_ONLY to a space-separated list of workload names (e.g. "put-1 put-64 get lease-hold
# watch"; put-1 and put-64 are the 1- and 64-client puts, put-1-leader the one client on the
# leader instead of a follower (see role_eps), "put" selects all three; json-put-1,
# json-put-64 and json-get are the same over the HTTP/JSON gateway) to run only those.
# Every round runs each workload against both, back to back: Picket first in odd rounds, etcd
# first in even ones. At the end a summary table gives, per workload, the median over the rounds
# of ops/s, p50 and p99 for each, the Picket/etcd ratio of the medians and the median of each
# round's own ratio, the servers' CPU per operation (sum of the three members' user + system time
# over the measured window, from /proc) and the machine's busy share over it (from /proc/stat,
# steal included: near 100 % the run was bound by CPU, so the throughput ratio is a ratio of CPU
# per operation), and for puts the servers' resident memory (sum of the three members' VmRSS,
# peak of samples taken every 0.5 s during the run, median over rounds).
#
# Fresh clusters (issue 20: "every row in 3 rounds with fresh clusters"): every round starts both
# clusters anew (empty data dirs; the round begins once each has committed a write and every
# member answers `endpoint health`), runs its rows, then kills both clusters' members by PID,
# waits until they have exited and removes their data dirs, so no round runs on the history
# (keys, revisions, compaction debt, memtables) that earlier rounds left. BENCH_SAME_CLUSTER=1
# (any non-empty value) instead starts the two clusters once and runs every round against them:
# that is what "RSS after the put x64 rounds" measures, the memory after accumulated history.
# Each round's second line names the members' PIDs and the revision each cluster starts it at.
#
# Binaries: the script builds the workspace in release and then a profile-guided picketd
# (scripts/build-pgo.sh, under ${CARGO_TARGET_DIR:-target}/pgo) and runs that; BENCH_PGO=0
# runs the plain ${CARGO_TARGET_DIR:-target}/release/picketd instead, PICKETD_BIN another build.
# picket-bench comes from the release dir (BENCH_BIN overrides it). BENCH_NO_BUILD=1 builds
# nothing and runs the plain picketd already built unless PICKETD_BIN names another.
#
# A/B of two Picket builds (issue 20: "report what each change bought, A/B back to back on the
# same machine"): BENCH_B_PICKETD=<picketd> runs that build in place of etcd, as kind `picket-b`
# (B) beside PICKETD_BIN's (A), same flags, same ports, same rows. Both clusters are up for the
# whole round and each row runs on A and on B back to back, A first in odd rounds and B first
# in even ones (as Picket and etcd do), so a slow minute on the host (this machine has them,
# docs/benchmarks.md, session 47) lands on both sides of one pair and neither side always runs
# second. The summary then gives B/A, and the median of the rounds' own B/A ratios, which pairs
# each B run with the A run beside it.
# The clusters live under a temp dir that is removed at the end; every process started here is
# killed by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-10}"
rounds="${2:-1}"
same_cluster="${BENCH_SAME_CLUSTER:-}"
# bench_prelude (setup, build, bin, picketd, bench, root, pids, results) and sample_rss.
. scripts/bench-lib.sh
bench_prelude picket-bench
b_picketd="${BENCH_B_PICKETD:-}"
other=etcd
if [ -n "$b_picketd" ]; then
  other=picket-b
  [ -x "$b_picketd" ] || { echo "$0: BENCH_B_PICKETD=$b_picketd is not an executable" >&2; exit 1; }
fi
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  # Bounded in practice: every child left has just been sent SIGKILL, which it can neither catch
  # nor ignore (the rounds' stopped members are already reaped and out of `pids`).
  wait 2>/dev/null || true
  rm -rf "$root"
}
trap cleanup EXIT
# On INT or TERM, exit (which runs cleanup through the EXIT trap) rather than run cleanup and
# carry on: the script would go on to start the next round's clusters in the removed temp dir.
trap 'exit 130' INT
trap 'exit 143' TERM

# Base ports below the kernel's ephemeral range (32768-60999 by default): a port inside it can be
# taken by an outgoing connection's source port (a TIME-WAIT self-connection once kept a member
# from binding its client port, and the run then counted its clients' failures as errors).
# Every round's fresh clusters use the same ports: the previous round's members have exited
# before they start (stop_clusters), and both servers set SO_REUSEADDR on their listeners (Go's
# net.Listen, tokio's TcpListener::bind), so the TIME-WAIT connections a killed member leaves on
# its ports do not block the next bind; a member that cannot bind fails the health check below.
# BENCH_BASE_PORT moves both (the other cluster stays 1000 above), e.g. for a test that must
# not meet a run on the default ports.
base_port 21000
EB=$((PB + 1000))
eps() { echo "http://127.0.0.1:$(($1 + 10)),http://127.0.0.1:$(($1 + 20)),http://127.0.0.1:$(($1 + 30))"; }
# The cluster's endpoints in the order the bench gets them: a follower, the leader, the other
# follower (`leader_first` set: the leader first). The bench puts a one-connection client on the
# first endpoint and spreads more connections in this order, so without it a row's client sat on
# whichever member `n1` was: Picket's n1 never won the first election in session 43's trials (0
# of 6) and etcd's did in 2 of 6, so the one-client rows compared Picket's follower path with
# etcd's leader path a third of the time. Now both clusters' clients have the same roles.
# Falls back to n1, n2, n3 if no member names a leader.
role_eps() { # base_port [leader_first]
  local status leader rest
  # Bounded: etcdctl gives up on a member after 2 s to dial and 5 s to answer.
  status=$(ETCDCTL_API=3 etcdctl --endpoints="$(eps "$1")" --dial-timeout=2s --command-timeout=5s \
    endpoint status -w fields 2>/dev/null || true)
  leader=$(awk -F' : ' '/"MemberID"/ {m = $2} /"Leader"/ {l = $2}
    /"Endpoint"/ {if (l == m) print $2}' <<<"$status" | tr -d '"' | head -1)
  [ -n "$leader" ] || { eps "$1"; return; }
  rest=$(eps "$1" | tr , '\n' | grep -vx "$leader" | paste -sd,)
  if [ -n "${2:-}" ]; then echo "$leader,$rest"; else echo "${rest%%,*},$leader,${rest#*,}"; fi
}
# The running clusters: `tag` names their data dir ($root/$tag) and logs ($root/$tag-*.log);
# picket_pids and other_pids are their members' PIDs, n1 to n3 (the other cluster is etcd, or
# in an A/B run the B build's Picket).
tag=""
picket_pids=()
other_pids=()
# The two kinds in the order this round runs them (bench-lib.sh's in_turn): Picket first in odd
# rounds, the other (etcd, or B in an A/B run) first in even ones.
kinds() { in_turn "$r" picket "$other"; }
# The base port of a kind's cluster, and (in `p`) its members' PIDs.
side() { # kind
  if [ "$1" = picket ]; then base=$PB p=("${picket_pids[@]}"); else base=$EB p=("${other_pids[@]}"); fi
}

start_cluster() { # kind base_port; sets `started` to the members' PIDs
  local kind=$1 base=$2 cluster="" i
  started=()
  for i in 1 2 3; do cluster+="${cluster:+,}n$i=http://127.0.0.1:$((base + 10 * i + 1))"; done
  for i in 1 2 3; do
    local c=$((base + 10 * i)) p=$((base + 10 * i + 1))
    local args=(--name "n$i" --data-dir "$root/$tag/$kind/n$i"
      --listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c"
      --listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p"
      --initial-cluster "$cluster" --initial-cluster-state new)
    if [ "$kind" = picket ]; then
      "$picketd" "${args[@]}" "${picket_flags[@]}" 2>"$root/$tag-$kind-n$i.log" &
    elif [ "$kind" = picket-b ]; then
      "$b_picketd" "${args[@]}" "${picket_flags[@]}" 2>"$root/$tag-$kind-n$i.log" &
    else
      etcd "${args[@]}" 2>"$root/$tag-$kind-n$i.log" &
    fi
    pids+=($!)
    started+=($!)
  done
}
# Starts both clusters with new data dirs under $root/$1 and returns once both are ready.
start_clusters() { # tag
  tag=$1
  # shellcheck disable=SC2046 # word splitting wanted: member_ports prints port numbers
  ports_free $(member_ports $PB) $(member_ports $EB)
  start_cluster picket $PB
  picket_pids=("${started[@]}")
  start_cluster "$other" $EB
  other_pids=("${started[@]}")
  # Both clusters committed a write and every member answers (bench-lib.sh's wait_ready).
  wait_ready "$(eps $PB)" "$root/$tag"-*-n*.log || exit 1
  wait_ready "$(eps $EB)" "$root/$tag"-*-n*.log || exit 1
}
# Kills both clusters' members by PID (SIGKILL: their data is about to be removed, so there is
# nothing to shut down cleanly), waits until each has exited (its ports and memory are then free
# for the next round's members), reaps and forgets them, and removes their data dirs.
stop_clusters() {
  kill_members "${picket_pids[@]}" "${other_pids[@]}"
  picket_pids=()
  other_pids=()
  rm -rf "${root:?}/$tag"
}
# The store revision the cluster at base port $1 is at (a serializable read of the first member).
revision() { # base_port
  ETCDCTL_API=3 etcdctl --endpoints="http://127.0.0.1:$(($1 + 10))" get ready --consistency=s -w fields 2>/dev/null \
    | awk -F' : ' '$1 == "\"Revision\"" {print $2; exit}' || true
}
# True when the workload is selected (BENCH_ONLY unset or naming it, or naming its family:
# "put" selects put-1 and put-64).
want() {
  [ -z "${BENCH_ONLY:-}" ] || [[ " $BENCH_ONLY " == *" $1 "* ]] \
    || { [[ "$1" == put-* ]] && [[ " $BENCH_ONLY " == *" put "* ]]; }
}
run() { # name workload clients conns [rss] [leader_first]
  want "$1" || return 0
  local kind base line rss_pid rss p
  for kind in $(kinds); do
    side "$kind"
    printf '%-7s ' "$kind"
    rss_pid=""
    if [ -n "${5:-}" ]; then
      rm -f "$root/rss"
      sample_rss "$root/rss" "${p[@]}" &
      rss_pid=$!
      pids+=("$rss_pid")
    fi
    line=$("$bench" --endpoints "$(role_eps "$base" "${6:-}")" --workload "$2" --clients "$3" \
      --conns "$4" --seconds "$secs" --cpu-pids "$(IFS=,; echo "${p[*]}")" \
      || echo "failed (exit $?)")
    rss=""
    if [ -n "$rss_pid" ]; then
      kill "$rss_pid" 2>/dev/null || true
      # Returns at once: the sampler is a subshell without traps, which SIGTERM ends at once.
      wait "$rss_pid" 2>/dev/null || true
      forget "$rss_pid"
      rss=$(cat "$root/rss" 2>/dev/null || echo 0)
    fi
    echo "$line${rss:+ rss_kib=$rss}"
    printf '%s\t%s\t%s\t%s\t%s\n' "$r" "$1" "$kind" "$line" "$rss" >>"$results"
  done
}
# A row whose figure is a latency at a set rate (lease-hold, watch): runs the bench with the
# given flags, prints its line and records it like run's rows (the summary's second table).
latency_row() { # name kind bench-flag...
  local name=$1 kind=$2 line
  shift 2
  printf '%-7s ' "$kind"
  line=$("$bench" "$@" || echo "failed (exit $?)")
  echo "$line"
  printf '%s\t%s\t%s\t%s\t\n' "$r" "$name" "$kind" "$line" >>"$results"
}
[ -z "$same_cluster" ] || start_clusters all-rounds
for r in $(seq "$rounds"); do
  echo "# round $r (load average: $(cut -d' ' -f1-3 /proc/loadavg)); picketd flags: ${picket_flags[*]}"
  [ -n "$same_cluster" ] || start_clusters "round$r"
  echo "# round $r $([ -n "$same_cluster" ] && echo "clusters shared by all rounds" || echo "fresh clusters"):" \
    "picket pids $(IFS=,; echo "${picket_pids[*]}") at revision $(revision $PB)," \
    "$other pids $(IFS=,; echo "${other_pids[*]}") at revision $(revision $EB);" \
    "leaders $(role_eps $PB leader_first | cut -d, -f1), $(role_eps $EB leader_first | cut -d, -f1)"
  # One client: on a follower (as two clients in three land), then on the leader.
  run put-1 put 1 1
  run put-1-leader put 1 1 "" leader_first
  run put-64 put 64 8 rss
  run get get 64 8
  run get-serializable get-serializable 64 8
  run lock-contended lock-contended 8 8
  run lock-uncontended lock-uncontended 32 8
  run lease-cycle lease-cycle 16 4
  # The HTTP/JSON gateway (HTTP/1.1, one connection per client): compare with put-1, put-64 and
  # get, the same operations over gRPC, for what the gateway costs each server.
  run json-put-1 json-put 1 1
  run json-put-64 json-put 64 8 rss
  run json-get json-get 64 8 rss
  # lease-hold: the bench samples the servers' CPU (from /proc) over its measured window only,
  # not over granting and revoking the 2,000 leases.
  want lease-hold && for kind in $(kinds); do
    side "$kind"
    latency_row lease-hold "$kind" --endpoints "$(role_eps "$base")" --workload lease-hold \
      --leases 2000 --keepalive-interval 3 --conns 4 --seconds "$secs" \
      --cpu-pids "$(IFS=,; echo "${p[*]}")"
  done
  # watch: put-to-event latency, one writer at 50 puts/s, N watch streams over 8 connections.
  for w in 1 16 100 1000; do
    want watch || break
    for kind in $(kinds); do
      side "$kind"
      latency_row "watch-$w" "$kind" --endpoints "$(role_eps "$base")" --workload watch \
        --watchers "$w" --put-rate 50 --conns 8 --seconds "$secs"
    done
  done
  [ -n "$same_cluster" ] || stop_clusters
done
[ -z "$same_cluster" ] || stop_clusters
echo "# load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
# Medians over the rounds with their spread, and Picket/etcd ratios of the medians.
# In an A/B run: B over A.
if [ "$other" = etcd ]; then
  [ -s "$results" ] && python3 scripts/bench_summary.py "$results" etcd etcd ops
else
  [ -s "$results" ] && python3 scripts/bench_summary.py "$results" picket A ops picket-b B
fi

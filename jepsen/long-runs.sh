#!/usr/bin/env bash
# The documented long runs (issue 8): every workload under every nemesis, against Picket and
# against etcd 3.4, a few minutes each, then a summary table (workload, target, verdict,
# operations checked, faults injected by kind, anomalies). Not part of CI.
#
# Usage: jepsen/long-runs.sh [result-root]            run the set, then print the summary
#        jepsen/long-runs.sh --summary [result-root]  only print the summary of an earlier set
#        (default result-root: /tmp/picket-long-runs; one folder <target>-<workload> per run)
# Environment:
#   PICKET_JEPSEN   the harness binary  (default: the newer of
#                   ${CARGO_TARGET_DIR:-target}/{release,debug}/picket-jepsen)
#   PICKETD         the picketd binary  (default: the one beside the harness binary)
#   ETCD            the etcd binary     (default: etcd on PATH, Debian etcd-server 3.4)
#   LONG_TIME       seconds of workload per run             (default: 600)
#   LONG_JOBS       runs in parallel                        (default: 2; each run has its own
#                   namespaces, so they do not interfere, but they share the CPUs)
#   LONG_NEMESIS    the nemeses                             (default: every must-pass one:
#                   kill,pause,partition,member,admin,clock; partition needs root; not
#                   clock-rate, which breaks lease timing by design)
#   LONG_WORKLOADS  space-separated                         (default: all eight)
#   LONG_TARGETS    space-separated, in order               (default: picket etcd)
#   LONG_SEED       base seed; run i uses seed + i          (default: random, printed)
#
# Runs are started in order (every Picket run first, then every etcd run) so that a set cut
# short still has the Picket results. Each run's folder keeps history.jsonl, results.json,
# report.html and the node logs; the harness's own output goes to <root>/<target>-<workload>.log.
# Expected: every workload valid, except lock-set (the unfenced control: lost updates, exit 1);
# against etcd 3.4 also the lock checker's grant-on-dead-key / overlapping-holders and more (see
# jepsen/README.md, "Long runs", for what the 2026-11-30 set found).
# Exit status: 0 when every run finished (whatever its verdict), 1 if a run did not.
set -u -o pipefail

cd "$(dirname "$0")/.."
summary_only=0
if [ "${1:-}" = --summary ]; then
    summary_only=1
    shift
fi
root=${1:-/tmp/picket-long-runs}
time_limit=${LONG_TIME:-600}
jobs=${LONG_JOBS:-2}
nemesis=${LONG_NEMESIS:-kill,pause,partition,member,admin,clock}
workloads=${LONG_WORKLOADS:-register set watch lease lock lock-set lock-fenced-set lock-kv-set}
targets=${LONG_TARGETS:-picket etcd}
seed=${LONG_SEED:-$(( (RANDOM << 15) | RANDOM ))}
etcd=${ETCD:-$(command -v etcd)}

runs=()
for t in $targets; do
    for w in $workloads; do
        runs+=("$t|$w")
    done
done

# One row per run, from its results.json (jq). ops: client operations in the history, all of
# them given to the checkers, and how many were ok / info (unknown outcome) / fail; faults: the
# nemesis's injections by kind (skipped attempts, e.g. a member removal refused, not counted);
# anomalies: per checker that is not valid, its anomaly kinds with counts.
summary() {
    printf '\n%-16s %-7s %-8s %-4s %6s %-17s %-52s %s\n' \
        workload target verdict exit ops "ok/info/fail" "faults" anomalies
    for entry in "${runs[@]}"; do
        IFS='|' read -r t w <<<"$entry"
        local dir="$root/$t-$w" code=?
        [ -f "$root/$t-$w.exit" ] && code=$(cat "$root/$t-$w.exit")
        if [ ! -f "$dir/results.json" ]; then
            printf '%s\t%s\tmissing\t%s\t-\t-\t-\t-\n' "$w" "$t" "$code"
            continue
        fi
        jq -r --arg w "$w" --arg t "$t" --arg code "$code" '
            def faults: (.summary.faults // {}) | to_entries
                        | map("\(.key)=\(.value)") | join(",");
            def n($o): [.summary.ops // {} | .[] | .[$o] // 0] | add // 0;
            def anomalies: [.checkers // {} | to_entries[] | select(.value.valid != "valid")
                            | "\(.key):\(.value.valid)" + (
                                [.value.anomalies // [] | .[] | .kind // "?"] | group_by(.)
                                | map(" \(.[0])x\(length)") | join(""))]
                           | join("; ");
            "\($w)\t\($t)\t\(.valid)\t\($code)\t\(.summary.client_ops)\t"
            + "\(n("ok"))/\(n("info"))/\(n("fail"))\t"
            + "\(faults)\t\(anomalies)"' "$dir/results.json"
    done | awk -F'\t' '{ printf "%-16s %-7s %-8s %-4s %6s %-17s %-52s %s\n", $1, $2, $3, $4, $5, $6, $7, $8 }'
}

if [ "$summary_only" = 1 ]; then
    summary
    exit 0
fi

bin=${PICKET_JEPSEN:-}
if [ -z "$bin" ]; then
    tdir=${CARGO_TARGET_DIR:-target}
    for p in "$tdir/release/picket-jepsen" "$tdir/debug/picket-jepsen"; do
        if [ -x "$p" ] && { [ -z "$bin" ] || [ "$p" -nt "$bin" ]; }; then bin=$p; fi
    done
fi
picketd=${PICKETD:-$(dirname "$bin")/picketd}
if [ ! -x "$bin" ] || [ ! -x "$picketd" ]; then
    echo "long-runs: no picket-jepsen and picketd ($bin, $picketd); cargo build --workspace" >&2
    exit 1
fi
mkdir -p "$root"
echo "long-runs: $bin, $picketd ($(sha256sum "$picketd" | cut -c1-12)), etcd $etcd"
echo "long-runs: ${time_limit}s per run, nemesis $nemesis, $jobs at a time, seeds from $seed"
echo "long-runs: results in $root"
start=$(date +%s)

run_one() {
    local i=$1 t=$2 w=$3
    local out="$root/$t-$w"
    rm -rf "$out"
    local t0=$(date +%s)
    echo "long-runs: start $t $w (seed $((seed + i))) at $(date -u +%H:%M:%S)"
    # The harness bounds every phase itself (recovery, final reads, checkers: 300 s); the outer
    # timeout only stops a wedged harness (SIGTERM first, so it kills its nodes and removes its
    # namespaces; SIGKILL 30 s later, whose leftovers the next run's sweep removes).
    timeout -k 30 $((time_limit + 900)) "$bin" test --workload "$w" --nemesis "$nemesis" \
        --time-limit "$time_limit" --nodes 3 --target "$t" --picketd "$picketd" --etcd "$etcd" \
        --seed $((seed + i)) --out "$out" >"$root/$t-$w.log" 2>&1
    local code=$?
    echo "$code" >"$root/$t-$w.exit"
    echo "long-runs: done  $t $w exit $code after $(( $(date +%s) - t0 ))s"
}

i=0
for entry in "${runs[@]}"; do
    IFS='|' read -r t w <<<"$entry"
    # Bounded parallelism: wait for a slot before starting the next run.
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    run_one "$i" "$t" "$w" &
    i=$((i + 1))
done
wait

summary
echo "long-runs: $(( $(date +%s) - start ))s wall time"
failed=0
for entry in "${runs[@]}"; do
    IFS='|' read -r t w <<<"$entry"
    code=$(cat "$root/$t-$w.exit" 2>/dev/null || echo missing)
    case $code in 0|1|2) ;; *) failed=1 ;; esac
done
exit $failed
